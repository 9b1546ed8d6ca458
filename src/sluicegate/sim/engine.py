"""A continuous-batching engine that schedules and times sequences the way vLLM does.

It knows nothing of HTTP or Prometheus: the server submits sequences and awaits their
tokens, and an observer receives the timings so metrics stay outside the policy code.
Token emission is pushed by the engine step (one future per waiting consumer), so a
step costs the same whether its consumers are fast or slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from sluicegate.core.clock import Clock, MonotonicClock

SchedulingPolicy = Literal["fcfs", "priority"]
Sleep = Callable[[float], Awaitable[None]]
Text = Callable[[int], str]
"""A sequence's text once it has generated so many tokens: its prompt, then its answer."""
CHARS_PER_TOKEN = 4
"""The simulator's tokenizer: ceil(characters / 4) tokens."""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Capacity and timing of the simulated GPU; defaults match the documented figures."""

    max_num_seqs: int = 32
    kv_cache_tokens: int = 65_536
    block_size: int = 16
    prefill_s_per_token: float = 0.000_05
    step_base_s: float = 0.008
    step_per_seq_s: float = 0.000_6
    time_scale: float = 1.0
    max_model_len: int = 32_768
    default_max_tokens: int = 256
    scheduling_policy: SchedulingPolicy = "fcfs"
    prefix_caching: bool = False
    """vLLM's automatic prefix caching: a prompt whose leading blocks an ended sequence
    computed prefills only the rest. Off by default because synthetic prompts repeat
    (a cache would serve every filler prompt from the second on); a client whose
    prompts are distinct turns it on."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_cache_tokens", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("prefill_s_per_token", "step_base_s", "step_per_seq_s", "time_scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 1 <= self.default_max_tokens <= self.max_model_len:
            raise ValueError("default_max_tokens must be between 1 and max_model_len")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be fcfs or priority")
        if self.blocks_for(self.max_model_len) > self.total_blocks:
            # vLLM refuses to start in this case too: a full-length request could never fit.
            raise ValueError("kv_cache_tokens must hold at least max_model_len tokens")

    @property
    def total_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def step_time_s(self, prefill_tokens: int, running: int) -> float:
        """Wall time of one step before the fault slowdown is applied."""
        cost = (
            self.prefill_s_per_token * prefill_tokens
            + self.step_base_s
            + self.step_per_seq_s * running
        )
        return cost * self.time_scale


class Rejected(ValueError):
    """The request can never be served as asked; `code` is the OpenAI error code."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class SequenceCancelled(Exception):
    """Raised to a consumer whose sequence the engine dropped (engine shutdown)."""


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


class Sequence:
    """One request inside the engine; `generated` grows by one per step while running."""

    __slots__ = (
        "_waiter",
        "_wake_at",
        "arrival_s",
        "blocks",
        "cached_tokens",
        "finish_s",
        "first_token_s",
        "generated",
        "hang",
        "max_tokens",
        "model",
        "priority",
        "prompt_tokens",
        "scheduled_s",
        "state",
        "text",
    )

    def __init__(
        self,
        model: str,
        prompt_tokens: int,
        max_tokens: int,
        priority: int,
        hang: bool,
        now: float,
        text: Text | None = None,
    ) -> None:
        self.model = model
        self.text = text
        self.cached_tokens = 0
        """Prompt tokens found in the prefix cache when it was scheduled."""
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.priority = priority
        self.hang = hang
        self.blocks = 0
        self.arrival_s = now
        self.scheduled_s = now
        self.first_token_s = 0.0
        self.finish_s = 0.0
        self.generated = 0
        self.state = State.WAITING
        self._waiter: asyncio.Future[None] | None = None
        self._wake_at = 0

    @property
    def finished(self) -> bool:
        return self.state is State.FINISHED

    def timing(self) -> dict[str, float]:
        """Where the time to first token went inside the engine: its waiting queue, then its
        prefill step; a client subtracts the latter to see how long it waited in front."""
        return {
            "waiting_s": self.scheduled_s - self.arrival_s,
            "prefill_s": max(0.0, self.first_token_s - self.scheduled_s),
        }

    async def wait(self, seen: int) -> None:
        """Return once more than `seen` tokens exist or the sequence has finished."""
        await self.wait_for(seen + 1)

    async def wait_finished(self) -> None:
        await self.wait_for(sys.maxsize)  # a count never reached: only the end wakes it

    async def wait_for(self, tokens: int) -> None:
        """Return once `tokens` tokens exist or the sequence has finished.

        The engine wakes the consumer only then, so a non-streamed response costs one
        wake-up rather than one per token.
        """
        if self.generated >= tokens or self.state is State.FINISHED:
            return
        if self.state is State.CANCELLED:
            raise SequenceCancelled
        self._wake_at = tokens
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.state is State.CANCELLED:
            raise SequenceCancelled

    def _notify(self) -> None:
        waiter = self._waiter
        if (
            waiter is not None
            and (self.generated >= self._wake_at or self.state is not State.RUNNING)
            and not waiter.done()
        ):
            waiter.set_result(None)


class EngineObserver(Protocol):
    """Receives timings as they happen, so metrics need no polling of sequences."""

    def first_token(self, seq: Sequence) -> None: ...

    def decoded(self, model: str, gap_s: float, count: int) -> None:
        """`count` sequences of `model` each got a further token, `gap_s` after the last."""
        ...

    def finished(self, seq: Sequence) -> None: ...


class _NoObserver:
    def first_token(self, seq: Sequence) -> None:
        pass

    def decoded(self, model: str, gap_s: float, count: int) -> None:
        pass

    def finished(self, seq: Sequence) -> None:
        pass


@dataclass(slots=True)
class Counters:
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    max_in_flight: int = 0
    max_running: int = 0


@dataclass(frozen=True, slots=True)
class Load:
    running: int
    waiting: int
    kv_cache_usage: float


class Engine:
    """Running set, waiting queue and KV block pool, advanced one timed step at a time."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        slowdown: Callable[[], float] = lambda: 1.0,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.observer: EngineObserver = _NoObserver()
        self.counters = Counters()
        self._slowdown = slowdown
        self._clock = clock or MonotonicClock()
        self._sleep = sleep
        self._running: dict[int, Sequence] = {}
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._num_waiting = 0
        self._free_blocks = settings.total_blocks
        self._cache: OrderedDict[int, None] = OrderedDict()
        """Hashes of blocks ended sequences computed, least recently used first; they
        live in free KV blocks, so they are evicted as sequences take those."""
        self._block_chars = settings.block_size * CHARS_PER_TOKEN
        self._arrivals = 0
        self._last_emit_s = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self._running.values(), *(entry[2] for entry in self._waiting)]:
            self.cancel(seq)

    def _check(self, prompt_tokens: int, max_tokens: int, priority: int) -> None:
        """Refuse what vLLM refuses up front: too long a context, or an unused priority."""
        limit = self.settings.max_model_len
        if prompt_tokens + max_tokens > limit:
            raise Rejected(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion.",
                "context_length_exceeded",
            )
        if priority != 0 and self.settings.scheduling_policy == "fcfs":
            raise Rejected(
                "Priority scheduling is not enabled: the priority must be 0 with the fcfs policy.",
                "invalid_priority",
            )

    def submit(
        self,
        model: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        priority: int = 0,
        hang: bool = False,
        text: Text | None = None,
    ) -> Sequence:
        """Queue a sequence; `max_tokens` 0 means prefill only (embeddings). `text` is
        what the prefix cache looks up and keeps (nothing without it)."""
        self._check(prompt_tokens, max_tokens, priority)
        now = self._clock.now()
        seq = Sequence(model, prompt_tokens, max_tokens, priority, hang, now, text)
        key = priority if self.settings.scheduling_policy == "priority" else 0
        self._arrivals += 1
        heapq.heappush(self._waiting, (key, self._arrivals, seq))
        self._num_waiting += 1
        self.counters.started += 1
        in_flight = self._num_waiting + len(self._running)
        self.counters.max_in_flight = max(self.counters.max_in_flight, in_flight)
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Free a sequence's slot and blocks at once; a no-op once it has ended."""
        if seq.state is State.WAITING:
            # Left in the heap and skipped when it reaches the head: O(log n) instead of O(n).
            self._num_waiting -= 1
        elif seq.state is State.RUNNING:
            del self._running[id(seq)]
            self._free_blocks += seq.blocks
            self._keep(seq)
        else:
            return
        seq.state = State.CANCELLED
        self.counters.cancelled += 1
        seq._notify()
        self._wake.set()

    def load(self) -> Load:
        used = self.settings.total_blocks - self._free_blocks
        return Load(len(self._running), self._num_waiting, used / self.settings.total_blocks)

    def reset_counters(self) -> None:
        """Zero the counters; the maxima restart from the current level (zero when idle)."""
        self.counters = Counters(
            max_in_flight=self._num_waiting + len(self._running), max_running=len(self._running)
        )

    async def _loop(self) -> None:
        """Step while any sequence can make progress, else sleep until an arrival or a cancel.

        Runs for the engine's lifetime; `stop()` ends it by cancelling its task.
        """
        while True:
            prefill_tokens = self._admit()
            batch = [seq for seq in self._running.values() if not seq.hang]
            if not batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            step_s = self.settings.step_time_s(prefill_tokens, len(batch)) * self._slowdown()
            await self._sleep(step_s)
            self._emit(batch)

    def _admit(self) -> int:
        """Move waiting sequences into the running set while a slot and their blocks are free."""
        prefill_tokens = 0
        waiting = self._waiting
        while waiting and len(self._running) < self.settings.max_num_seqs:
            seq = waiting[0][2]
            if seq.state is State.CANCELLED:
                heapq.heappop(waiting)
                continue
            blocks = self.settings.blocks_for(seq.prompt_tokens + seq.max_tokens)
            if blocks > self._free_blocks:
                break
            heapq.heappop(waiting)
            self._num_waiting -= 1
            seq.cached_tokens = self._cached_tokens(seq)
            self._free_blocks -= blocks
            self._evict()
            seq.blocks = blocks
            seq.state = State.RUNNING
            seq.scheduled_s = self._clock.now()
            self._running[id(seq)] = seq
            if not seq.hang:
                prefill_tokens += seq.prompt_tokens - seq.cached_tokens
        self.counters.max_running = max(self.counters.max_running, len(self._running))
        return prefill_tokens

    def _emit(self, batch: list[Sequence]) -> None:
        """Give every sequence still running one token and finish those that are complete."""
        now = self._clock.now()
        decoded: dict[str, int] = {}
        for seq in batch:
            if seq.state is not State.RUNNING:
                continue
            if seq.max_tokens:
                seq.generated += 1
                if seq.generated == 1:
                    seq.first_token_s = now
                    self.observer.first_token(seq)
                else:
                    decoded[seq.model] = decoded.get(seq.model, 0) + 1
            if seq.generated >= seq.max_tokens:
                self._finish(seq, now)
            seq._notify()
        # Every sequence that decoded a further token was in the previous step, so all of
        # them waited the same gap since the previous emission.
        for model, count in decoded.items():
            self.observer.decoded(model, now - self._last_emit_s, count)
        self._last_emit_s = now

    def _cached_tokens(self, seq: Sequence) -> int:
        """The prompt's leading whole blocks that are cached (touched, so kept longest),
        short of its last token: as vLLM, which computes at least that one, so a prompt
        cached whole prefills its last block again."""
        if seq.text is None or not self.settings.prefix_caching:
            return 0
        size = self.settings.block_size
        cache, found, most = self._cache, [], max(0, seq.prompt_tokens - 1) // size
        for block in self._blocks(seq.text(0)):
            if len(found) == most or block not in cache:
                break
            found.append(block)
        self._touch(found)
        return len(found) * size

    def _keep(self, seq: Sequence) -> None:
        """Cache the full blocks a sequence computed: its prompt and what it generated,
        once its prefill step is over (a first token exists)."""
        if seq.text is None or not self.settings.prefix_caching or not seq.generated:
            return
        self._touch(list(self._blocks(seq.text(seq.generated))))
        self._evict()

    def _touch(self, blocks: list[int]) -> None:
        """Make `blocks` the most recently used, the last of them first to go: as in
        vLLM, a prefix is evicted from its tail, so what is left of it still matches."""
        cache = self._cache
        for block in reversed(blocks):
            cache[block] = None
            cache.move_to_end(block)

    def _evict(self) -> None:
        cache = self._cache
        while len(cache) > self._free_blocks:
            cache.popitem(last=False)

    def _blocks(self, text: str) -> Iterator[int]:
        """Chained hashes of `text`'s full blocks, made as they are asked for (a lookup
        stops at the first miss): a block matches only after the same text, as vLLM's
        block hashes chain each block to its parent's."""
        size, last = self._block_chars, 0
        for start in range(0, len(text) - size + 1, size):
            last = hash((last, text[start : start + size]))
            yield last

    def _finish(self, seq: Sequence, now: float) -> None:
        del self._running[id(seq)]
        self._free_blocks += seq.blocks
        self._keep(seq)
        seq.state = State.FINISHED
        seq.finish_s = now
        self.counters.completed += 1
        self.observer.finished(seq)
