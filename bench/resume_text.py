"""Cost of keeping a relayed stream as text (`providers.resume.SoFar`) per event, against
appending its raw chunks (what the relay did before when no hand-over was asked): a
19-event answer and a 2,000-event one, each streamed 200 times, three rounds.

    .venv/bin/python bench/resume_text.py
"""

import time

import orjson

from sluicegate.providers.resume import SoFar


def event(content: str) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


for size in (19, 2000):
    chunks = [event("tok ")] * size
    for rnd in range(3):
        t = time.perf_counter()
        for _ in range(200):
            raw = []
            for c in chunks:
                raw.append(c)
        before = (time.perf_counter() - t) / (200 * size)
        t = time.perf_counter()
        for _ in range(200):
            kept = SoFar()
            for c in chunks:
                kept.add(c)
        after = (time.perf_counter() - t) / (200 * size)
        print(
            f"{size} events, round {rnd}: append {before * 1e6:.3f} us/event, "
            f"SoFar {after * 1e6:.3f} us/event"
        )
