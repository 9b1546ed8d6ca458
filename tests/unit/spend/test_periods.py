from datetime import datetime
from zoneinfo import ZoneInfo

from sluicegate.core.types import Period
from sluicegate.spend.periods import Days, window

UTC = ZoneInfo("UTC")
PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def at(zone: ZoneInfo, *parts: int) -> float:
    return datetime(*parts, tzinfo=zone).timestamp()


def test_a_month_runs_from_its_first_day_to_the_next_month():
    found = window(Period.MONTHLY, at(UTC, 2026, 1, 31, 23, 59), UTC)
    assert found.name == "2026-01-01"
    assert found.start_s == at(UTC, 2026, 1, 1)
    assert found.end_s == at(UTC, 2026, 2, 1)


def test_february_and_december_end_where_the_calendar_says():
    assert window(Period.MONTHLY, at(UTC, 2028, 2, 29, 12), UTC).end_s == at(UTC, 2028, 3, 1)
    december = window(Period.MONTHLY, at(UTC, 2026, 12, 31, 23), UTC)
    assert (december.name, december.end_s) == ("2026-12-01", at(UTC, 2027, 1, 1))


def test_a_period_is_aligned_to_the_zones_midnight():
    # 23:30 UTC on 31 March is already 1 April in Paris.
    instant = at(UTC, 2026, 3, 31, 23, 30)
    assert window(Period.MONTHLY, instant, UTC).name == "2026-03-01"
    paris = window(Period.MONTHLY, instant, PARIS)
    assert paris.name == "2026-04-01"
    assert paris.start_s == at(UTC, 2026, 3, 31, 22)


def test_a_day_across_a_clock_change_lasts_23_hours():
    day = window(Period.DAILY, at(NEW_YORK, 2026, 3, 8, 12), NEW_YORK)
    assert day.end_s - day.start_s == 23 * 3600


def test_days_move_on_at_midnight():
    days = Days(PARIS)
    assert days.of(at(PARIS, 2026, 5, 1, 23, 59, 59)) == "2026-05-01"
    assert days.of(at(PARIS, 2026, 5, 2, 0, 0, 0)) == "2026-05-02"
    assert days.of(at(PARIS, 2026, 5, 1, 8)) == "2026-05-01"
