"""Added time to first token of a streamed answer under the incremental post-call check.

One simulator and one gateway; three tenants send the same streamed request, taking
turns: `plain` has no guardrail, `w32` and `w256` a post-call block check (the in-process
`Patterns` plug-in, matching nothing) with a 32- and a 256-character hold-back window.
Client side, per request: the first byte, the first content character and the last
byte. Run under the bench lock:

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/guardrail_ttft.py [ROUNDS] [TIME_SCALE]

ROUNDS (default 200) requests per tenant; TIME_SCALE (default 1) the simulator's
`--time-scale` (0: tokens come as fast as they can be made, isolating the gateway's
own cost; 1: vLLM-like 8 ms decode steps, where the window costs the time to generate
it).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiohttp
import orjson

from sluicegate.bench.procs import SIM_MODEL, SIM_URL_ENV, stack

TENANTS = {"plain": "sk-bench-plain", "w32": "sk-bench-w32", "w256": "sk-bench-w256"}
MAX_TOKENS = 64
CONFIG = f"""\
models:
  - name: chat
    deployments:
      - name: sim
        base_url: ${{{SIM_URL_ENV}}}/v1
        model: {SIM_MODEL}
        max_connections: 64
tenants:
  - {{name: plain, keys: [{{env: KEY_PLAIN}}]}}
  - {{name: w32, keys: [{{env: KEY_W32}}]}}
  - {{name: w256, keys: [{{env: KEY_W256}}]}}
guardrails:
  checks:
    - name: out32
      checker: {{kind: plugin, path: "sluicegate.guardrails.patterns:Patterns",
                 options: {{patterns: {{never: "zzzz-never-zzzz"}}}}}}
      action: block
      placement: post_call
      window: 32
      cache_ttl_s: 0
    - name: out256
      checker: {{kind: plugin, path: "sluicegate.guardrails.patterns:Patterns",
                 options: {{patterns: {{never: "zzzz-never-zzzz"}}}}}}
      action: block
      placement: post_call
      window: 256
      cache_ttl_s: 0
  apply:
    - {{guardrails: [out32], tenants: [w32]}}
    - {{guardrails: [out256], tenants: [w256]}}
"""


async def one(session: aiohttp.ClientSession, url: str, key: str) -> tuple[float, float, float]:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    started = time.perf_counter()
    first_byte = first_text = None
    headers = {"authorization": f"Bearer {key}"}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        buffer = b""
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            first_byte = first_byte or now
            if first_text is None:
                buffer += chunk
                if _has_text(buffer):
                    first_text = now
    ended = time.perf_counter()
    assert first_byte is not None
    assert first_text is not None
    return first_byte - started, first_text - started, ended - started


def _has_text(buffer: bytes) -> bool:
    for event in buffer.split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in orjson.loads(event[6:]).get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    return True
    return False


async def measure(url: str, rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    found: dict[str, list[tuple[float, float, float]]] = {name: [] for name in TENANTS}
    async with aiohttp.ClientSession() as session:
        for key in TENANTS.values():  # warm-up
            for _ in range(5):
                await one(session, url, key)
        for _ in range(rounds):
            for name, key in TENANTS.items():
                found[name].append(await one(session, url, key))
    return found


def ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    scale = sys.argv[2] if len(sys.argv) > 2 else "1"
    env = {"KEY_PLAIN": TENANTS["plain"], "KEY_W32": TENANTS["w32"], "KEY_W256": TENANTS["w256"]}
    with stack(["--time-scale", scale], CONFIG, env) as (_, gateway):
        found = asyncio.run(measure(gateway.url, rounds))
    print(f"{rounds} streamed requests per tenant, max_tokens {MAX_TOKENS}, time scale {scale}")
    print("tenant  first byte p50/p90 ms  first text p50/p90 ms  whole p50 ms  text-added p50 ms")
    base = statistics.median(t for _, t, _ in found["plain"])
    for name, samples in found.items():
        first = [b for b, _, _ in samples]
        text = [t for _, t, _ in samples]
        whole = [w for _, _, w in samples]
        added = 1000 * (statistics.median(text) - base)
        print(
            f"{name:6}  {ms(first, 0.5):>8} / {ms(first, 0.9):<8}    "
            f"{ms(text, 0.5):>8} / {ms(text, 0.9):<8}    {ms(whole, 0.5):>8}    {added:+.2f}"
        )


if __name__ == "__main__":
    main()
