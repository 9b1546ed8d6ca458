"""Generated hostile requests against the job, file and batch routes and the Anthropic
adapter, through a real gateway in front of a real simulator (`bench/hostile.py` draws
them; tests/e2e/test_hostile_input.py covers the OpenAI inference routes in process).

Each route gets `SLUICEGATE_FUZZ_REQUESTS` calls (default 2,000) over keep-alive
connections in parallel. No answer may be a 5xx other than a deliberate refusal, every
error must be in OpenAI's shape, and neither process may log a traceback. The seed is
drawn at each run and printed; `SLUICEGATE_FUZZ_SEED` replays one.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bench.hostile import Call, Draws, Ids, Keys, Models, code_of, judge, send
from tests.support.jobs import STORES, job_database, start_gateway
from tests.support.processes import Proc, start

SEED = int(os.environ.get("SLUICEGATE_FUZZ_SEED") or secrets.randbits(32))
REQUESTS = int(os.environ.get("SLUICEGATE_FUZZ_REQUESTS", "2000"))
PARALLEL = 8
SIM_KEY = "sim-secret"
ENV = {"A_KEY": "sk-a", "B_KEY": "sk-b", "ADMIN_KEY": "sk-admin", "SIM_KEY": SIM_KEY}
KEYS = Keys(tenant="sk-a", other="sk-b", admin="sk-admin")
MODELS = Models(chat="chat", anthropic="claude", embed="embed")
MAX_BODY, MAX_FILE = 64 * 1024, 256 * 1024
INPUT_FILES = 24
"""Files uploaded before the batch route is driven, so most batches name real input."""

database = pytest.fixture(params=STORES, scope="module")(job_database)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    args = ["--model", "sim-model", "--api-key", SIM_KEY, "--time-scale", "0"]
    proc = start("sim", args, tmp_path_factory.mktemp("hostile-routes-sim"))
    yield proc
    proc.stop()


def config(sim: Proc, jobs: dict | None) -> dict:
    def model(name: str, provider: str = "openai") -> dict:
        deployment = {
            "name": f"sim-{name}",
            "provider": provider,
            "base_url": f"{sim.url}/v1",
            "model": "sim-model",
            "api_key_env": "SIM_KEY",
            "pools": ["sim"],
        }
        return {"name": name, "deployments": [deployment]}

    return {
        "server": {"max_body_bytes": MAX_BODY},
        "routes": {"chat": {"max_output_tokens": 16}, "completions": {"max_output_tokens": 16}},
        "pools": [{"name": "sim", "max_concurrency": 16}],
        "scheduling": {
            "lanes": [
                {"name": "interactive", "priority": 10},
                {"name": "batch", "priority": 0},
            ]
        },
        "models": [model("chat"), model("claude", "anthropic"), model("embed")],
        "tenants": [
            {"name": "a", "keys": [{"env": "A_KEY"}]},
            {"name": "b", "keys": [{"env": "B_KEY"}], "models": ["chat"], "lane": "batch"},
        ],
        "admin": {"keys": [{"env": "ADMIN_KEY"}]},
    } | ({} if jobs is None else {"jobs": JOBS | jobs})


JOBS = {
    "workers": 2,
    "poll_s": 0.2,
    "max_file_bytes": MAX_FILE,
    "tenant_storage_max_bytes": 16 * 1024 * 1024,
    "tenant_submissions_per_minute": 60_000,
}


@pytest.fixture(scope="module")
def gateway(sim, database, tmp_path_factory) -> Iterator[Proc]:
    """With a job store: the job, file and batch routes."""
    proc = start_gateway(tmp_path_factory.mktemp("hostile-routes"), config(sim, database.keys), ENV)
    yield proc
    proc.stop()
    assert "Traceback" not in proc.output(), tail(proc.log)  # nor while stopping


@pytest.fixture(scope="module")
def adapter_gateway(sim, tmp_path_factory) -> Iterator[Proc]:
    """Without one: the Anthropic adapter's requests need no job store."""
    proc = start_gateway(tmp_path_factory.mktemp("hostile-adapter"), config(sim, None), ENV)
    yield proc
    proc.stop()
    assert "Traceback" not in proc.output(), tail(proc.log)


DRAWS = Draws(SEED, KEYS, MODELS, MAX_BODY, MAX_FILE)


class Fuzz:
    """Calls sent by `PARALLEL` clients at once, their answers tallied and judged."""

    def __init__(self, gateway: Proc) -> None:
        self.base = gateway.url
        self.ids = Ids()
        self.tally: Counter[str] = Counter()
        self.problems: list[str] = []

    async def run(self, calls: Iterator[Call]) -> float:
        started = time.monotonic()
        connector = aiohttp.TCPConnector(limit=PARALLEL)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(self._client(session, calls) for _ in range(PARALLEL)))
        return time.monotonic() - started

    async def _client(self, session: aiohttp.ClientSession, calls: Iterator[Call]) -> None:
        for call in calls:
            try:
                status, kind, payload = await send(session, self.base, call, self.ids)
            except aiohttp.ClientError as exc:
                # A body past the limit may be refused before the client has written it.
                self.tally[f"{'oversized ' if call.oversized else ''}{type(exc).__name__}"] += 1
                if not call.oversized:
                    self.problems.append(f"{call.method} {call.path}: {exc!r}")
                continue
            self.tally[f"{status} {code_of(payload)}".strip()] += 1
            wrong = judge(status, kind, payload)
            if wrong is not None:
                self.problems.append(
                    f"{call.method} {call.path}: {wrong}; sent {call.body[:300]!r}"
                )

    def answered(self, *statuses: int) -> int:
        return sum(n for key, n in self.tally.items() if key.split(" ")[0] in map(str, statuses))


async def drive(gateway: Proc, sim: Proc, route: str, prepare: int = 0) -> Fuzz:
    """`REQUESTS` calls of `route` (after `prepare` good uploads), judged; neither
    process may have logged a traceback by the end."""
    fuzz = Fuzz(gateway)
    if prepare:
        rng = random.Random(f"{SEED}:inputs")
        await fuzz.run(iter([DRAWS.upload(rng) for _ in range(prepare)]))
        fuzz.tally.clear()
    elapsed = await fuzz.run(itertools.islice(DRAWS.calls(route), REQUESTS))
    print(f"\n{route}: seed {SEED}, {REQUESTS} requests in {elapsed:.1f}s: {dict(fuzz.tally)}")
    assert not fuzz.problems, (f"seed {SEED}", len(fuzz.problems), fuzz.problems[:5])
    await asyncio.sleep(0.5)  # the job workers' last answers
    for proc in (gateway, sim):
        assert "Traceback" not in proc.output(), (f"seed {SEED}", tail(proc.log))
    return fuzz


def tail(log: Path) -> str:
    text = log.read_text(errors="replace")
    at = text.find("Traceback")
    return text[max(0, at - 500) : at + 3000]


# Most draws must get past the edge's checks, or only those are tested. Of 2,000 draws,
# two runs (2026-12-07) had 201-209 jobs accepted, 881-921 files and 728-744 batches
# answered 200, and 397-432 chats answered through the adapter: each bound below is about
# half of that, so falling under it is a change in the gateway or the draws, not chance.


async def test_hostile_job_requests(gateway, sim):
    fuzz = await drive(gateway, sim, "jobs")
    assert fuzz.answered(202) >= REQUESTS // 20, fuzz.tally


async def test_hostile_file_requests(gateway, sim):
    fuzz = await drive(gateway, sim, "files")
    assert fuzz.answered(200) >= REQUESTS // 4, fuzz.tally


async def test_hostile_batch_requests(gateway, sim):
    fuzz = await drive(gateway, sim, "batches", prepare=INPUT_FILES)
    assert fuzz.answered(200) >= REQUESTS // 5, fuzz.tally


async def test_hostile_requests_through_the_anthropic_adapter(adapter_gateway, sim):
    fuzz = await drive(adapter_gateway, sim, "anthropic")
    assert fuzz.answered(200) >= REQUESTS // 8, fuzz.tally
    assert await active_attempts(adapter_gateway) == 0


async def active_attempts(gateway: Proc) -> float:
    """The pool's attempts still open, once those ending have had a moment."""
    async with aiohttp.ClientSession() as session:
        for _ in range(50):
            async with session.get(f"{gateway.url}/metrics") as answer:
                page = await answer.text()
            active = sum(
                float(line.rsplit(" ", 1)[1])
                for line in page.splitlines()
                if line.startswith("sluicegate_pool_active_attempts{")
            )
            if not active:
                break
            await asyncio.sleep(0.1)
    return active
