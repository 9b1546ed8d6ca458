"""Where the gateway's CPU goes: py-spy samples of the gateway process under load, split
into the HTTP server, the upstream client, the event loop and the project's own code.

Starts the overhead benchmark's zero-latency simulator and gateway (`sluicegate.bench.procs`),
drives the gateway with the overhead benchmark's load generator, one in flight (`serial`) or
16 (`closed`), and attaches `py-spy record --pid` to the gateway for the load's duration
(idle samples left out). Each sample is charged to the innermost frame's package (its
self time; the gateway's own upstream client, providers/upstream.py, counts as the
upstream client, and its uvicorn protocol, api/server.py, as the server); C code is
charged to the Python frame that called it, so a socket write from the HTTP server
counts as the HTTP server's.

    .venv/bin/python bench/profile_gateway.py --mode plain --load closed --seconds 20

`--src DIR` runs the gateway from another checkout's `src` (the load generator and the
simulator stay this checkout's); `--raw FILE` keeps py-spy's collapsed stacks. Needs
py-spy (`.venv/bin/pip install py-spy`) and permission to read the gateway's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sluicegate.bench.args import loop_factory
from sluicegate.bench.loadgen import LoadGen, Tally, chat_request, make_session
from sluicegate.bench.procs import GATEWAY_MODEL, services

PARTS = (
    ("HTTP server", ("uvicorn/", "httptools/", "h11/", "sluicegate/api/server.py")),
    ("upstream client", ("aiohttp/", "yarl/", "multidict/", "sluicegate/providers/upstream.py")),
    ("event loop", ("asyncio/", "uvloop/", "selectors.py", "socket.py", "ssl.py")),
    ("metrics", ("prometheus_client/",)),
    ("json and validation", ("orjson", "pydantic", "json/")),
    ("logging", ("logging/",)),
    ("own code", ("sluicegate/",)),
)
OTHER = "other"


def part_of(frame: str) -> str:
    """The part a frame (`function (path:line)`, as py-spy writes it) belongs to."""
    for name, markers in PARTS:
        if any(marker in frame for marker in markers):
            return name
    return OTHER


def split(raw: str) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Samples by part of the innermost frame, and by innermost own-code function."""
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        parts[part_of(frames[-1])] += int(count)
        mine = [frame for frame in frames if "sluicegate/" in frame]
        if mine:
            own[mine[-1]] += int(count)
    return parts, own


async def drive(url: str, key: str, mode: str, load: str, seconds: float) -> Tally:
    request = chat_request(
        url, GATEWAY_MODEL, key, prompt_chars=400, max_tokens=16, stream=mode == "stream"
    )
    tally = Tally()
    async with make_session(64) as session:
        gen = LoadGen(session, 16 if load == "closed" else 1)
        await gen.serial(request, Tally(), 50)
        await gen.closed(request, tally, seconds)
    return tally


def profile(args: argparse.Namespace) -> str:
    env = {"PYTHONPATH": str(Path(args.src).resolve())} if args.src else {}
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    with services(extra_env=env) as started, tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(started.gateway.popen.pid),
                "--rate",
                str(args.rate),
                "--duration",
                str(int(args.seconds)),
                "--format",
                "raw",
                "--output",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            tally = runner.run(
                drive(started.gateway.url, started.key, args.mode, args.load, args.seconds + 1)
            )
        spy.wait(timeout=args.seconds + 30)
        print(f"{tally.ok} requests, {tally.failed} failed, {tally.throughput_rps:.0f} req/s")
        return raw.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("plain", "stream"), default="plain")
    parser.add_argument("--load", choices=("serial", "closed"), default="closed")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--src", help="run the gateway from this `src` folder")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--top", type=int, default=25, help="own-code functions to list")
    args = parser.parse_args()
    raw = profile(args)
    if args.raw:
        args.raw.write_text(raw)
    parts, own = split(raw)
    total = sum(parts.values()) or 1
    for name, count in parts.most_common():
        print(f"{name:20} {100 * count / total:5.1f} %")
    print(f"-- own code, innermost own function (of {total} samples) --")
    for frame, count in own.most_common(args.top):
        print(f"{100 * count / total:5.1f} %  {frame}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
