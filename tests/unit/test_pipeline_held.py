"""What one attempt holds is released once, in reverse order, whatever fails."""

from __future__ import annotations

import pytest

from sluicegate.answer import Held


class Opened:
    def __init__(self, log: list[str], fails: bool = False) -> None:
        self.log, self.fails = log, fails

    async def __aenter__(self) -> str:
        self.log.append("opened")
        return "upstream"

    async def __aexit__(self, *exc_info: object) -> None:
        self.log.append("closed")
        if self.fails:
            raise RuntimeError("closing failed")


def held(log: list[str]) -> Held:
    async def release(attempt: object) -> None:
        log.append(f"released {attempt}")

    return Held(release, "a")  # type: ignore[arg-type]


async def test_the_call_ends_before_the_grant_and_both_only_once():
    log: list[str] = []
    h = held(log)
    h.granted = True
    assert await h.open(Opened(log)) == "upstream"  # type: ignore[arg-type]
    await h.aclose()
    await h.aclose()
    assert log == ["opened", "closed", "released a"]


async def test_the_grant_is_released_when_ending_the_call_fails():
    log: list[str] = []
    h = held(log)
    h.granted = True
    await h.open(Opened(log, fails=True))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        await h.aclose()
    assert log == ["opened", "closed", "released a"]


async def test_nothing_granted_nothing_released():
    log: list[str] = []
    await held(log).aclose()
    assert log == []
