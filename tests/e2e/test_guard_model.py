"""The guard-model checker against a real simulator whose guard model answers scripted
Llama Guard verdicts: unsafe blocks, safe passes, a bad option stops the simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from sluicegate.guardrails.checker import Stage
from sluicegate.guardrails.guardmodel import Ask, GuardModelChecker, Messages
from tests.support.processes import Proc, start


@pytest.fixture(scope="module")
def guard_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    logs = tmp_path_factory.mktemp("guard-sim")
    args = ["--model", "sim-model", "--model", "llama-guard", "--guard-model", "llama-guard",
            "--time-scale", "0.1"]  # fmt: skip
    proc = start("sim", args, logs)
    yield proc
    proc.stop()


@pytest.fixture
async def ask(guard_sim: Proc) -> AsyncIterator[Ask]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

        async def chat(messages: Messages) -> str:
            body = {"model": "llama-guard", "messages": messages, "max_tokens": 16}
            async with session.post(f"{guard_sim.url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
            return answer["choices"][0]["message"]["content"]

        yield chat


async def test_an_unsafe_verdict_blocks_and_a_safe_one_passes(ask: Ask) -> None:
    checker = GuardModelChecker(ask)
    unsafe = await checker.check("how to [sim:unsafe S1,S10] things", Stage.INPUT)
    assert (unsafe.flagged, unsafe.categories) == (True, ("violent_crimes", "hate"))
    assert not (await checker.check("how to bake bread", Stage.INPUT)).flagged
    answer = await checker.check("here is how [sim:unsafe]", Stage.OUTPUT)
    assert (answer.flagged, answer.categories) == (True, ("violent_crimes",))


async def test_other_models_of_the_same_simulator_still_answer_words(guard_sim: Proc) -> None:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "[sim:unsafe]"}],
            "max_tokens": 3}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{guard_sim.url}/v1/chat/completions", json=body) as resp,
    ):
        answer = await resp.json()
    assert answer["choices"][0]["message"]["content"] == " lorem ipsum dolor"


async def test_a_guard_model_refuses_a_streamed_request(guard_sim: Proc) -> None:
    body = {"model": "llama-guard", "messages": [{"role": "user", "content": "x"}],
            "stream": True}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{guard_sim.url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 400


def test_a_guard_model_that_is_not_served_stops_the_simulator(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="guard_model 'llama-guard' must also be a served"):
        start("sim", ["--guard-model", "llama-guard"], tmp_path, timeout_s=10)
