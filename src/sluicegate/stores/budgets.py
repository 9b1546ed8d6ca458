"""The shared `BudgetStore` on Redis: one counter per budget period, for the whole fleet.

Each call is one Lua script (`lua/spend_*.lua`), so a reservation across a request's
budgets is atomic on the server. A build marker says the counters are whole: Redis
restarted without its data has none, and every call answers `Unbuilt` until one replica
has set them again from the durable record (`rebuild`, which only the first replica to
ask carries out). Calls are bounded by `timeout_s`, as the limit store's are.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from sluicegate.core.limits import StoreTimeout, StoreUnavailable
from sluicegate.core.spend import Decision, Line, Unbuilt
from sluicegate.stores.resp import RespConnection, RespError

LAYOUT = "v1"
_UNBUILT = -2


def _script(name: str) -> tuple[str, str]:
    text = (resources.files("sluicegate.stores") / "lua" / f"spend_{name}.lua").read_text()
    return hashlib.sha1(text.encode()).hexdigest(), text


class RedisBudgetStore:
    def __init__(self, connection: RespConnection, prefix: str, timeout_s: float) -> None:
        self._connection = connection
        self._root = f"{prefix}{LAYOUT}:"
        self._marker = f"{self._root}spend:built"
        self._timeout_s = timeout_s
        self._scripts = {name: _script(name) for name in ("reserve", "settle", "rebuild")}
        self._names: dict[str, str] = {}

    def _keys(self, lines: Sequence[Line]) -> list[str]:
        names = self._names
        found = [self._marker]
        for line in lines:
            name = names.get(line.key)
            if name is None:
                name = names[line.key] = self._root + line.key
            found.append(name)
        return found

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        sha, text = self._scripts[script]
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    return await self._connection.call("EVALSHA", sha, len(keys), *keys, *args)
                except RespError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        raise
                return await self._connection.call("EVAL", text, len(keys), *keys, *args)
        except TimeoutError:
            raise StoreTimeout(f"redis: no answer within {self._timeout_s}s") from None
        except (RespError, OSError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from None

    async def reserve(self, lines: Sequence[Line], nanos: int) -> Decision:
        args: list[Any] = [nanos]
        for line in lines:
            args += [line.limit, int(line.expire_at_s)]
        reply = await self._run("reserve", self._keys(lines), args)
        if reply[0] == _UNBUILT:
            raise Unbuilt("redis: the budget counters are being rebuilt")
        refused = int(reply[0])
        epoch = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return Decision(None if refused < 0 else refused, tuple(map(int, reply[2:])), epoch)

    async def settle(
        self, lines: Sequence[Line], reserved: int, spent: int, epoch: str
    ) -> tuple[int, ...]:
        args: list[Any] = [reserved, spent, epoch, *(int(line.expire_at_s) for line in lines)]
        reply = await self._run("settle", self._keys(lines), args)
        if reply[0] == _UNBUILT:
            raise Unbuilt("redis: the budget counters are being rebuilt")
        return tuple(map(int, reply[1:]))

    async def rebuild(self, totals: Mapping[Line, int]) -> bool:
        lines = list(totals)
        args: list[Any] = [uuid.uuid4().hex[:12]]
        for line in lines:
            args += [totals[line], int(line.expire_at_s)]
        return bool(await self._run("rebuild", self._keys(lines), args))

    async def close(self) -> None:
        await self._connection.close()
