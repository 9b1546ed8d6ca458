"""The rate at which slots come free, on explicit times (no clock at all)."""

import itertools
import math

import pytest

from sluicegate.scheduling.turnover import WINDOW_S, Turnover, latest_free_s


def ended_every(gap_s: float, count: int, start: float = 100.0) -> tuple[Turnover, float]:
    turnover = Turnover(start)
    now = start
    for _ in range(count):
        now += gap_s
        turnover.freed(now)
    return turnover, now


def test_before_any_end_the_gap_is_unknown_and_read_as_endless():
    assert Turnover(5.0).gap_s(60.0) == math.inf


@pytest.mark.parametrize("gap_s", [0.2, 1.0, 3.0])
def test_steady_ends_read_as_their_spacing(gap_s):
    """Ends every `gap_s`, read half a gap after the last: the spacing, within the
    exponential weighting's few percent."""
    turnover, now = ended_every(gap_s, round(4 * WINDOW_S / gap_s))
    assert turnover.gap_s(now + gap_s / 2) == pytest.approx(gap_s, rel=0.05)


def test_the_first_seconds_read_the_rate_they_saw():
    """Two ends a second for two seconds: 0.5 s, not the window's length over four."""
    turnover, now = ended_every(0.5, 4)
    assert turnover.gap_s(now) == pytest.approx(0.5, rel=0.15)


def test_ends_together_count_as_many_not_as_no_gap():
    """Several answers ending in one engine step: twelve ends in one instant after six
    seconds of none read as twelve ends in those seconds, the newest weighing most
    (0.29 s apart at once), not as the gap of nothing an average over events makes of
    them."""
    turnover = Turnover(0.0)
    for _ in range(12):
        turnover.freed(6.0)
    assert 0.25 < turnover.gap_s(6.0) < 0.5


def test_a_stall_lengthens_the_gap_while_nothing_ends():
    turnover, now = ended_every(0.5, 100)
    before = turnover.gap_s(now)
    assert turnover.gap_s(now + 5.0) > 1.5 * before


def test_a_slowdown_is_followed_within_the_window():
    """Ends 0.3 s apart, then 1 s apart for three windows: read near 1 s, not in
    between."""
    turnover, now = ended_every(0.3, 200)
    for _ in range(round(3 * WINDOW_S)):
        now += 1.0
        turnover.freed(now)
    assert turnover.gap_s(now + 0.5) == pytest.approx(1.0, rel=0.15)


def test_an_idle_spell_reads_long_for_a_while_never_short():
    """A minute idle, then ends every 0.5 s: the first seconds read longer gaps than
    0.5 s, coming down towards it, never below."""
    turnover = Turnover(0.0)
    now, read = 60.0, []
    for _ in range(40):
        now += 0.5
        turnover.freed(now)
        read.append(turnover.gap_s(now + 0.25))
    assert read[0] > 4 * 0.5
    assert all(later <= earlier * 1.01 for earlier, later in itertools.pairwise(read))
    assert read[-1] == pytest.approx(0.5, rel=0.1)


@pytest.mark.parametrize(
    ("soonest", "ahead", "own_s", "latest_s"),
    [
        ([1.0, 2.0, 3.0], 0, 5.0, 1.0),
        ([1.0, 2.0, 3.0], 0, 1.0, 2.0),
        ([1.0, 1.0, 3.0], 0, 1.0, 1.0),
        ([1.0, 2.0, 3.0], 1, 0.5, 3.0),
        ([1.0, 2.0, 3.0], 1, 2.0, 3.0),
        ([1.0, 2.0, 3.0], 1, 4.0, 2.0),
        ([1.0, 2.0], 1, 1.0, math.inf),
        ([1.0, math.inf, math.inf], 1, math.inf, math.inf),
        ([], 0, 1.0, math.inf),
    ],
)
def test_a_rest_waits_for_as_many_ends_of_the_others(soonest, ahead, own_s, latest_s):
    """Behind `ahead` rests, a rest needs `ahead + 1` ends, and the stream giving its slot
    away is not one of them: when it is among the soonest, the next one counts instead
    (a tie counts one of the two)."""
    assert latest_free_s(soonest, ahead, own_s) == latest_s
