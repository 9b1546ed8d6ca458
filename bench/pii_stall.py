"""The PII check's time on 1k, 8k and 32k-token prompts (p50 / p99), and the longest
stall of the event loop meanwhile, with the scan cut into bounded turns and without;
the CPU time of each turn the check takes, with the garbage collector on and off; then
the local checkers (PII, injection, banned terms) on 32k-token hostile texts.

A prompt is sentences of the labelled corpus (bench/pii_corpus.py: one personal item or
near-miss each) between three times as many plain ones, up to 4 characters per token.
A ticker on the same loop sleeps 1 ms at a time; a stall is how much later than asked
it wakes.

    flock /tmp/sluicegate-bench.lock .venv/bin/python -m bench.pii_stall            # seed printed
    flock /tmp/sluicegate-bench.lock .venv/bin/python -m bench.pii_stall --seed 5   # replay
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import time

import uvloop

from bench.pii_corpus import GENERATORS, clean, positive
from sluicegate.guardrails.checker import Checker, Stage
from sluicegate.guardrails.injection import InjectionChecker
from sluicegate.guardrails.pii import PiiChecker
from sluicegate.guardrails.terms import TermsChecker

SIZES = {1_000: 200, 8_000: 50, 32_000: 20}
"""Tokens per prompt, and how many checks of that size."""

CHARS_PER_TOKEN = 4
TICK_S = 0.001
_PLAIN = (
    "The migration finished overnight and the dashboards look normal again.",
    "Please keep the summary short and mention the open questions at the end.",
    "We agreed to revisit the design once the load tests have run twice.",
    "Nobody on the team could reproduce the slowdown on their own laptop.",
)


def prompt(rng: random.Random, tokens: int) -> str:
    parts: list[str] = []
    size = 0
    while size < tokens * CHARS_PER_TOKEN:
        if rng.random() < 0.25:
            sample = positive(rng, rng.choice(tuple(GENERATORS))) if rng.random() < 0.5 else None
            text = sample.text if sample else clean(rng).text
        else:
            text = rng.choice(_PLAIN)
        parts.append(text)
        size += len(text) + 1
    return " ".join(parts)[: tokens * CHARS_PER_TOKEN]


async def _ticker(stalls: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(TICK_S)
        stalls.append(time.perf_counter() - asked - TICK_S)


async def run(seed: int, bounded: bool) -> None:
    rng = random.Random(seed)
    checker = PiiChecker() if bounded else PiiChecker(work_per_turn=None)
    for tokens, count in SIZES.items():
        texts = [prompt(rng, tokens) for _ in range(count)]
        stalls: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(stalls, stop))
        await asyncio.sleep(0.01)
        times = []
        for text in texts:
            started = time.perf_counter()
            await checker.check(text, Stage.INPUT)
            times.append(time.perf_counter() - started)
            await asyncio.sleep(0.002)
        stop.set()
        await ticker
        cuts = statistics.quantiles(times, n=100)
        print(
            f"{'bounded' if bounded else 'one go':8} {tokens:>6} tokens x{count:<4}"
            f" p50 {cuts[49] * 1e3:8.2f} ms  p99 {cuts[98] * 1e3:8.2f} ms"
            f"  stall p99 {statistics.quantiles(stalls, n=100)[98] * 1e3:6.2f} ms"
            f" longest {max(stalls) * 1e3:7.2f} ms"
        )


HOSTILE = {
    "digits and spaces": "1 ",
    "digits and dashes": "1-",
    "card groups": "4111 ",
    "at signs": "a@",
    "hex and colons": "0:",
    "dotted digits": "1.",
    "iban-like": "DE89 ",
    "newlines": "\n",
    "injection words": "ignore the previous words ",
    "banned term": "acme ",
    "folding letters": "\u00df",
}
"""Texts built to make a careless pattern backtrack or a validator run on every token."""


async def hostile() -> None:
    checkers: dict[str, Checker] = {
        "pii": PiiChecker(),
        "injection": InjectionChecker(),
        "terms": TermsChecker(["acme", "project falcon", "strasse"]),
    }
    size = 32_000 * CHARS_PER_TOKEN
    for label, unit in HOSTILE.items():
        text = unit * (size // len(unit))
        for name, checker in checkers.items():
            stalls: list[float] = []
            stop = asyncio.Event()
            ticker = asyncio.create_task(_ticker(stalls, stop))
            await asyncio.sleep(0.01)
            started = time.perf_counter()
            await checker.check(text, Stage.INPUT)
            took = time.perf_counter() - started
            stop.set()
            await ticker
            print(
                f"hostile  {label:18} {name:9} {len(text)} chars  {took * 1e3:8.1f} ms"
                f"  longest stall {max(stalls) * 1e3:7.2f} ms"
            )


def _turns(checker: Checker, text: str) -> list[float]:
    """The CPU time of each stretch the check runs without handing the loop back, read
    by stepping its coroutine by hand."""
    took = []
    steps = checker.check(text, Stage.INPUT).__await__()
    while True:
        started = time.thread_time()
        try:
            next(steps)
        except StopIteration:
            took.append(time.thread_time() - started)
            return took
        took.append(time.thread_time() - started)


def turns(seed: int) -> None:
    """The longest turn on 32k-token prompts, with the garbage collector on and off:
    what the bound holds, apart from collections and other processes."""
    rng = random.Random(seed)
    texts = [prompt(rng, 32_000) for _ in range(SIZES[32_000])]
    checker = PiiChecker()
    for collecting in (True, False):
        if not collecting:
            gc.disable()
        took = [turn for text in texts for turn in _turns(checker, text)]
        gc.enable()
        cuts = statistics.quantiles(took, n=100)
        print(
            f"turns    gc {'on ' if collecting else 'off'} {len(took)} turns  CPU p50"
            f" {cuts[49] * 1e3:5.2f} ms  p99 {cuts[98] * 1e3:5.2f} ms  longest"
            f" {max(took) * 1e3:5.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--hostile-only", action="store_true")
    args = parser.parse_args()
    if args.hostile_only:
        uvloop.run(hostile())
        return
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed}, uvloop, {CHARS_PER_TOKEN} characters per token, ticker {TICK_S * 1e3} ms")
    print(f"load average before: {os.getloadavg()}")
    for bounded in (True, False):
        uvloop.run(run(seed, bounded))
    turns(seed)
    uvloop.run(hostile())


if __name__ == "__main__":
    main()
