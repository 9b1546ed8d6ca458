"""The engine alone: admission, step timing, ordering and freeing, with no real waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from sluicegate.sim.engine import (
    Engine,
    EngineSettings,
    Load,
    Rejected,
    Sequence,
    SequenceCancelled,
)

MS = 0.001


@dataclass
class Recorder:
    """Observer keeping what the engine reported, in order."""

    done: list[Sequence] = field(default_factory=list)
    first: int = 0
    gaps: list[tuple[str, int]] = field(default_factory=list)

    def first_token(self, seq: Sequence) -> None:
        self.first += 1

    def decoded(self, model: str, gap_s: float, count: int) -> None:
        self.gaps.append((model, count))

    def finished(self, seq: Sequence) -> None:
        self.done.append(seq)


@dataclass
class Harness:
    engine: Engine
    recorder: Recorder
    steps: list[tuple[float, Load]]


MakeEngine = Callable[..., Harness]


@pytest.fixture
async def make_engine() -> AsyncIterator[MakeEngine]:
    """Engines whose step 'sleep' records (duration, load) and only yields to the loop."""
    engines: list[Engine] = []

    def make(slowdown: float = 1.0, **settings: object) -> Harness:
        steps: list[tuple[float, Load]] = []

        async def sleep(duration_s: float) -> None:
            steps.append((duration_s, engine.load()))
            await asyncio.sleep(0)

        engine = Engine(EngineSettings(**settings), slowdown=lambda: slowdown, sleep=sleep)
        recorder = Recorder()
        engine.observer = recorder
        engine.start()
        engines.append(engine)
        return Harness(engine, recorder, steps)

    yield make
    for engine in engines:
        await engine.stop()


def test_step_time_formula_uses_documented_defaults() -> None:
    settings = EngineSettings()
    assert settings.step_time_s(0, 1) == pytest.approx(8.6 * MS)
    assert settings.step_time_s(1000, 32) == pytest.approx((50 + 8 + 19.2) * MS)
    assert EngineSettings(time_scale=0.5).step_time_s(100, 2) == pytest.approx(7.1 * MS)
    assert EngineSettings(time_scale=0).step_time_s(100, 2) == 0


async def test_steps_charge_prefill_once_and_every_running_sequence(
    make_engine: MakeEngine,
) -> None:
    h = make_engine(slowdown=2.0)
    a = h.engine.submit("m", 40, 3)
    b = h.engine.submit("m", 60, 3)
    await asyncio.wait_for(asyncio.gather(a.wait_finished(), b.wait_finished()), 1)
    durations = [duration for duration, _ in h.steps]
    first = (0.05 * 100 + 8 + 0.6 * 2) * MS * 2
    later = (8 + 0.6 * 2) * MS * 2
    assert durations == pytest.approx([first, later, later])
    assert (a.generated, b.generated) == (3, 3)
    assert h.recorder.first == 2
    assert h.recorder.gaps == [("m", 2), ("m", 2)]


async def test_sequence_that_does_not_fit_waits_for_freed_blocks(make_engine: MakeEngine) -> None:
    h = make_engine(kv_cache_tokens=64, block_size=16, max_model_len=64, default_max_tokens=8)
    big = h.engine.submit("m", 20, 20)  # 3 of the 4 blocks
    blocked = h.engine.submit("m", 16, 16)  # 2 blocks: must wait
    small = h.engine.submit("m", 1, 1)  # would fit, but stays behind the head of the queue
    await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in (big, blocked, small))), 1)
    first_load = h.steps[0][1]
    assert first_load == Load(running=1, waiting=2, kv_cache_usage=0.75)
    assert all(load.running == 1 for _, load in h.steps[:20])
    assert h.steps[20][1] == Load(running=2, waiting=0, kv_cache_usage=0.75)
    assert blocked.first_token_s >= big.finish_s
    assert small.first_token_s >= big.finish_s
    assert h.engine.load() == Load(0, 0, 0.0)


async def test_running_set_is_capped_at_max_num_seqs(make_engine: MakeEngine) -> None:
    h = make_engine(max_num_seqs=2)
    seqs = [h.engine.submit("m", 4, 2) for _ in range(5)]
    await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in seqs)), 1)
    assert h.steps[0][1].running == 2
    assert h.steps[0][1].waiting == 3
    assert max(load.running for _, load in h.steps) == 2
    assert h.engine.counters.max_running == 2
    assert h.engine.counters.max_in_flight == 5
    assert h.engine.counters.completed == 5


async def test_priority_policy_orders_waiting_by_priority_then_arrival(
    make_engine: MakeEngine,
) -> None:
    h = make_engine(max_num_seqs=1, scheduling_policy="priority")
    order = [("late", 5), ("urgent", -1), ("first-zero", 0), ("second-zero", 0), ("mid", 3)]
    seqs = {name: h.engine.submit(name, 4, 1, priority=priority) for name, priority in order}
    await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in seqs.values())), 1)
    finished = [seq.model for seq in h.recorder.done]
    assert finished == ["urgent", "first-zero", "second-zero", "mid", "late"]


async def test_fcfs_refuses_priority_and_keeps_arrival_order(make_engine: MakeEngine) -> None:
    h = make_engine(max_num_seqs=1)
    with pytest.raises(Rejected) as excinfo:
        h.engine.submit("m", 4, 1, priority=1)
    assert excinfo.value.code == "invalid_priority"
    seqs = [h.engine.submit(name, 4, 1) for name in ("a", "b", "c")]
    await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in seqs)), 1)
    assert [seq.model for seq in h.recorder.done] == ["a", "b", "c"]
    assert h.engine.counters.started == 3


async def test_context_longer_than_max_model_len_is_rejected(make_engine: MakeEngine) -> None:
    h = make_engine(max_model_len=100, default_max_tokens=10)
    with pytest.raises(Rejected) as excinfo:
        h.engine.submit("m", 90, 11)
    assert excinfo.value.code == "context_length_exceeded"
    assert "maximum context length is 100 tokens" in excinfo.value.message
    assert h.engine.counters.started == 0
    h.engine.submit("m", 90, 10)  # exactly the limit is fine


async def test_cancel_frees_running_blocks_and_unblocks_the_queue(make_engine: MakeEngine) -> None:
    h = make_engine(kv_cache_tokens=64, max_model_len=64, default_max_tokens=8)
    hung = h.engine.submit("m", 30, 30, hang=True)  # 4 blocks, never emits
    waiting = h.engine.submit("m", 8, 8)
    for _ in range(10):
        await asyncio.sleep(0)
    assert h.engine.load() == Load(running=1, waiting=1, kv_cache_usage=1.0)
    assert h.steps == []  # only a hung sequence: the loop sleeps instead of stepping
    h.engine.cancel(hung)
    assert h.engine.load() == Load(running=0, waiting=1, kv_cache_usage=0.0)
    await asyncio.wait_for(waiting.wait_finished(), 1)
    assert h.engine.counters.cancelled == 1
    assert h.engine.counters.completed == 1
    h.engine.cancel(hung)  # already cancelled: no double count
    h.engine.cancel(waiting)  # already finished: no-op
    assert h.engine.counters.cancelled == 1


async def test_cancel_of_a_waiting_sequence_removes_it_from_the_queue(
    make_engine: MakeEngine,
) -> None:
    h = make_engine(max_num_seqs=1)
    first = h.engine.submit("m", 4, 3)
    dropped = h.engine.submit("m", 4, 3)
    last = h.engine.submit("m", 4, 3)
    h.engine.cancel(dropped)
    assert h.engine.load().waiting == 2
    await asyncio.wait_for(asyncio.gather(first.wait_finished(), last.wait_finished()), 1)
    assert dropped.generated == 0
    assert h.recorder.done == [first, last]
    assert h.engine.load() == Load(0, 0, 0.0)


async def test_prefill_only_sequence_costs_one_step(make_engine: MakeEngine) -> None:
    h = make_engine()
    seq = h.engine.submit("m", 400, 0)
    await asyncio.wait_for(seq.wait_finished(), 1)
    assert [d for d, _ in h.steps] == pytest.approx([(0.05 * 400 + 8 + 0.6) * MS])
    assert seq.generated == 0
    assert h.recorder.first == 0
    assert h.recorder.done == [seq]


async def test_idle_engine_waits_on_an_event_and_wakes_on_arrival(make_engine: MakeEngine) -> None:
    h = make_engine()
    await asyncio.sleep(0.02)
    assert h.steps == []
    seq = h.engine.submit("m", 4, 2)
    await asyncio.wait_for(seq.wait_finished(), 1)
    await asyncio.sleep(0.02)
    assert len(h.steps) == 2


async def test_a_late_consumer_sees_every_pending_token_at_once(make_engine: MakeEngine) -> None:
    h = make_engine()
    seq = h.engine.submit("m", 4, 5)
    for _ in range(50):
        await asyncio.sleep(0)
    assert seq.finished
    await seq.wait(0)  # returns at once: tokens are there
    assert seq.generated == 5


async def test_reset_zeroes_counters_and_maxima(make_engine: MakeEngine) -> None:
    h = make_engine()
    seqs = [h.engine.submit("m", 4, 1) for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*(s.wait_finished() for s in seqs)), 1)
    assert h.engine.counters.max_in_flight == 3
    h.engine.reset_counters()
    counters = h.engine.counters
    assert (counters.started, counters.completed, counters.max_in_flight) == (0, 0, 0)


async def test_stop_releases_consumers(make_engine: MakeEngine) -> None:
    h = make_engine()
    seq = h.engine.submit("m", 4, 1, hang=True)
    waiter = asyncio.ensure_future(seq.wait(0))
    await asyncio.sleep(0)
    await h.engine.stop()
    with pytest.raises(SequenceCancelled):
        await asyncio.wait_for(waiter, 1)


def test_settings_refuse_a_cache_smaller_than_one_full_context() -> None:
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        EngineSettings(kv_cache_tokens=1024, max_model_len=2048)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineSettings(max_num_seqs=0)


def _prefilled(h: Harness, step: int, running: int) -> float:
    """Prompt tokens the engine charged in step `step`, from its duration."""
    duration, _ = h.steps[step]
    return round((duration / MS - 8 - 0.6 * running) / 0.05)


async def test_a_prompt_after_a_cached_prefix_prefills_only_the_rest(
    make_engine: MakeEngine,
) -> None:
    h = make_engine(prefix_caching=True)
    prompt = "p" * 640  # ten blocks of 16 tokens (64 characters)
    first = h.engine.submit("m", 160, 2, text=lambda n: prompt + "w" * 4 * n)
    await asyncio.wait_for(first.wait_finished(), 1)
    longer = h.engine.submit("m", 200, 1, text=lambda n: prompt + "q" * 160)
    await asyncio.wait_for(longer.wait_finished(), 1)
    assert _prefilled(h, 0, 1) == 160
    assert longer.cached_tokens == 160
    assert _prefilled(h, 2, 1) == 40
    assert h.engine.counters.completed == 2


async def test_a_continuation_finds_the_answer_it_continues_cached(
    make_engine: MakeEngine,
) -> None:
    """The blocks of what a sequence generated are kept too: an answer cut short and
    sent back to continue (here its first 40 tokens, as a relay may have passed on
    fewer than were made) prefills only what follows its last whole cached block. A
    prompt cached whole prefills its last block again, as in vLLM."""
    h = make_engine(prefix_caching=True)
    prompt = "p" * 256  # 4 blocks

    def answered(tokens: int) -> str:
        return prompt + "w" * 4 * tokens

    cut = h.engine.submit("m", 64, 100, text=answered)
    await asyncio.wait_for(cut.wait(40), 1)
    h.engine.cancel(cut)
    again = h.engine.submit("m", 64 + 40, 5, text=lambda n: answered(40))
    await asyncio.wait_for(again.wait_finished(), 1)
    assert again.cached_tokens == 6 * 16  # (256 + 160) characters: 6 whole blocks
    whole = h.engine.submit("m", 64, 1, text=lambda n: prompt)
    await asyncio.wait_for(whole.wait_finished(), 1)
    assert whole.cached_tokens == 3 * 16


async def test_nothing_is_cached_before_a_prefill_ends_nor_with_caching_off(
    make_engine: MakeEngine,
) -> None:
    prompt = "p" * 256
    for caching in (True, False):
        h = make_engine(prefix_caching=caching)
        stuck = h.engine.submit("m", 80, 3, hang=True, text=lambda n: prompt + "x" * 64)
        ended = h.engine.submit("m", 64, 3, text=lambda n: prompt)
        await asyncio.wait_for(ended.wait_finished(), 1)
        h.engine.cancel(stuck)  # running, but its prefill never happened
        after = h.engine.submit("m", 100, 1, text=lambda n: prompt + "x" * 64 + "y" * 80)
        await asyncio.wait_for(after.wait_finished(), 1)
        assert after.cached_tokens == (64 if caching else 0)


async def test_cached_blocks_give_way_to_running_sequences(make_engine: MakeEngine) -> None:
    """The cache lives in free KV blocks: a sequence that takes them evicts the least
    recently used, a prefix from its tail."""
    h = make_engine(prefix_caching=True, kv_cache_tokens=512, max_model_len=512)
    old, recent = "o" * 1024, "r" * 1024  # 16 blocks each
    for prompt in (old, recent):
        seq = h.engine.submit("m", 256, 1, text=lambda n, p=prompt: p)
        await asyncio.wait_for(seq.wait_finished(), 1)
    big = h.engine.submit("m", 300, 1, text=lambda n: "b" * 1200)  # 19 of 32 blocks
    await asyncio.wait_for(big.wait_finished(), 1)
    recent_again = h.engine.submit("m", 256, 1, text=lambda n: recent)
    old_again = h.engine.submit("m", 256, 1, text=lambda n: old)
    await asyncio.wait_for(
        asyncio.gather(recent_again.wait_finished(), old_again.wait_finished()), 1
    )
    assert recent_again.cached_tokens == 13 * 16  # its 3 last blocks went for `big`
    assert old_again.cached_tokens == 0
