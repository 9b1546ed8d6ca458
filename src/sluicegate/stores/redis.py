"""The shared `LimitStore` on Redis: every replica pointed at one Redis shares its limits.

Each method is one Lua script (in `lua/`, loaded once, run by its digest), so a decision
is atomic on the server and costs one round trip. Scripts read the server's clock, so
replicas with skewed clocks agree. Every key lives under `{prefix}{LAYOUT}:`; `LAYOUT`
names the key layout and changes whenever the scripts read or write keys differently,
so replicas of two releases running side by side during a rolling deploy never run one
release's scripts on the other's keys (a script is run by the digest of its own text, so
old code is never run by mistake either). Keys added beside the others, which older
scripts do not know, need no new layout: the pools' lines and the prefill budgets are such (a
replica of the release before them takes and frees as it did, ignoring the line and
the budget, while the limits stay shared; a new layout would have split them for the
deploy). Every key has a TTL.

Each call is bounded by `timeout_s`, never a hang: a late answer (the bound passed, the
connection stalled, or too many calls wait on it) is `StoreTimeout`; a refused or lost
connection or an error reply is `StoreUnavailable`. What to do then is the caller's
choice (`stores/failover.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from sluicegate.core import keys
from sluicegate.core.clock import Clock
from sluicegate.core.keys import prefill_parts, slot_line
from sluicegate.core.limits import (
    Ask,
    GiveBack,
    Lease,
    Part,
    PrefillEnd,
    PrefillState,
    Rate,
    Refused,
    StoreTimeout,
    StoreUnavailable,
)
from sluicegate.core.prefill import GROWTH, HORIZON_S
from sluicegate.core.types import BreakerPolicy
from sluicegate.stores.resp import RespConnection, RespError

log = logging.getLogger("sluicegate")

LAYOUT = "v1"
GIVE_BACKS_AT_ONCE = 128
"""Give-backs per script call at most: a script holds the server for its whole run."""
LEASES_AT_ONCE = 256
"""Lease ids per renewal or adoption script at most, for the same reason."""
CLAIM_S = 0.25
"""How long a slot freed while replicas wait for it stays set aside for the first in its
line: its notification and its take are a round trip each, with room for a busy loop; a
replica that no longer wants it costs that long once."""
LEARNT_KEPT_S = 3600.0
"""How long a prefill budget's keys are kept while unused (no prompt counted, refused or
ended): after that the engine may have changed, and the budget learns again."""
_PARTS = {part.value.encode(): part for part in Part}


def listener(url: str, connect_timeout_s: float) -> Redis:
    """A redis-py client for the release subscription: connecting is bounded, waiting for
    a message is not (it is the subscription's whole job); no retries of its own."""
    return Redis.from_url(
        url,
        socket_timeout=None,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


MIN_VERSION = (5, 0)
"""Scripts read the server's clock (`TIME`) before they write, which Redis allows from 5
on (scripts replicated by their effects)."""


@dataclass(frozen=True, slots=True)
class Inspection:
    """What Redis at a URL is for the fleet's limits, each in one line naming its host
    (never its credentials)."""

    unreachable: str | None = None
    """Why it cannot be used now; None when it answers."""
    unfit: str | None = None
    """Why it cannot hold the fleet's limits whatever happens (the start stops)."""
    unchecked: tuple[str, ...] = ()
    """The assumptions it would not let be checked (a managed Redis refusing commands)."""


async def inspect(url: str, timeout_s: float = 2.0) -> Inspection:
    """Reach Redis at `url` and check what the limit store assumes of it: version 5 or
    later, no Cluster, and no eviction that could drop a lease set (every key written
    has a TTL, so a volatile policy picks them as an allkeys one does: only
    `noeviction`, or no `maxmemory`, keeps a limit from being forgotten)."""
    where = _where(url)
    connection = RespConnection(url, timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            await connection.call("PING")
            unfit, unchecked = await _assumptions(connection)
    except (RespError, OSError, TimeoutError) as exc:
        return Inspection(f"Redis at {where} is unreachable ({type(exc).__name__}: {exc})")
    finally:
        await connection.close()
    return Inspection(
        unfit=f"Redis at {where} cannot hold the fleet's limits: {'; '.join(unfit)}"
        if unfit
        else None,
        unchecked=tuple(f"Redis at {where}: unchecked {line}" for line in unchecked),
    )


async def _assumptions(connection: RespConnection) -> tuple[list[str], list[str]]:
    """What breaks the limit store's assumptions, and what could not be checked."""
    unfit: list[str] = []
    unchecked: list[str] = []
    try:
        info = _fields(await connection.call("INFO", "server"))
        info |= _fields(await connection.call("INFO", "cluster"))
    except RespError as exc:
        unchecked.append(f"that it is Redis 5 or later and no Cluster node (INFO: {exc})")
    else:
        version = info.get("redis_version", "0")
        if tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) < MIN_VERSION:
            unfit.append(f"it is Redis {version}; 5 or later is needed (scripts read TIME)")
        if info.get("cluster_enabled") == "1":
            unfit.append("it is a Redis Cluster node; the limit store needs one standalone server")
    try:
        found = await connection.call("CONFIG", "GET", "maxmemory*")
    except RespError as exc:
        unchecked.append(
            "that it never evicts the lease sets (maxmemory-policy noeviction, or no "
            f"maxmemory; CONFIG GET: {exc})"
        )
    else:
        config = {
            name.decode(): value.decode()
            for name, value in zip(found[::2], found[1::2], strict=True)
        }
        policy = config.get("maxmemory-policy", "noeviction")
        if config.get("maxmemory", "0") != "0" and policy != "noeviction":
            unfit.append(
                f"maxmemory-policy {policy} with maxmemory set may evict the sets holding the "
                "fleet's leases (every key the gateway writes has a TTL); set "
                "maxmemory-policy noeviction, or give the gateway a Redis without maxmemory"
            )
    return unfit, unchecked


def _fields(info: bytes) -> dict[str, str]:
    """`INFO`'s `name:value` lines."""
    lines = info.decode().splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))


def _where(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


def _script(name: str) -> str:
    folder = resources.files("sluicegate.stores") / "lua"
    return (folder / "now.lua").read_text() + "\n" + (folder / f"{name}.lua").read_text()


class _Script(NamedTuple):
    sha: str
    text: str


SCRIPTS = (
    "take", "renew", "give_back", "cool", "in_use", "available", "beat", "breaker", "fair",
    "prefilled",
)  # fmt: skip


def _scripts() -> dict[str, _Script]:
    found = {}
    for name in SCRIPTS:
        text = _script(name)
        found[name] = _Script(hashlib.sha1(text.encode()).hexdigest(), text)
    return found


class RedisLimitStore:
    """`clock` is for tests only: given, scripts use its time instead of the server's."""

    def __init__(
        self,
        connection: RespConnection,
        prefix: str,
        timeout_s: float,
        clock: Clock | None = None,
    ) -> None:
        self._connection = connection
        self._root = f"{prefix}{LAYOUT}:"
        self._channel = f"{self._root}{keys.RELEASED}"
        self._timeout_s = timeout_s
        self._clock = clock
        self._names: dict[str, str] = {}
        self._scripts = _scripts()
        self._lines: dict[str, tuple[str, str]] = {}
        """Per announced slot, its line's keys (`keys.slot_line`) as named in Redis."""
        self._prefills: dict[str, list[str]] = {}
        """Per prefill budget, its keys (`keys.prefill_parts`) as named in Redis."""
        self._prefilling: dict[str, str] = {}
        """Per lease id, the prefill budget counting its prompt here until its end: the
        prompt is renewed with its lease (`renew`), so a prefill longer than the lease
        TTL does not lapse, while a replica that died stops counting within one."""

    def _key(self, key: str) -> str:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = self._root + key
        return name

    def _prefill(self, budget: str) -> list[str]:
        names = self._prefills.get(budget)
        if names is None:
            names = self._prefills[budget] = [self._key(k) for k in prefill_parts(budget)]
        return names

    def _now(self) -> str:
        return "" if self._clock is None else repr(self._clock.now())

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script by its digest, loading it first if this Redis does not know it
        (a restart, a failover): one round trip, two the first time."""
        return (await self._runs(script, ((keys, args),), at_once=True))[0]

    async def _runs(
        self, script: str, calls: Sequence[tuple[list[str], list[Any]]], at_once: bool
    ) -> list[Any]:
        """Run a script once per call, all sent together (`RespConnection.calls`)."""
        sha, text = self._scripts[script]
        now = self._now()
        commands = [("EVALSHA", sha, len(keys), *keys, now, *args) for keys, args in calls]
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    return await self._connection.calls(commands, at_once)
                except RespError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        raise
                await self._connection.call("SCRIPT", "LOAD", text)
                return await self._connection.calls(commands, at_once)
        except TimeoutError as exc:
            why = str(exc) or f"no answer within {self._timeout_s}s"
            raise StoreTimeout(f"redis: {why}") from None
        except (RespError, OSError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from None

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        key, lines = self._key, self._lines
        keys = [key(k) for k in ask.cooldowns]
        keys += [key(slot.key) for slot in ask.slots]
        prefill = ask.prefill
        args: list[Any] = [lease.id, ttl_s, len(ask.cooldowns), len(ask.slots)]
        args += [1 if ask.queued else 0, self._channel, CLAIM_S, 0 if prefill is None else 1]
        lined: list[str] = []
        for slot in ask.slots:
            line = lines.get(slot.key)
            args += [slot.limit, 0 if line is None else 1]
            if line is not None:
                lined += line
        for charge in ask.charges:
            rate = charge.rate
            keys.append(key(charge.key))
            args += [rate.interval_s, rate.tolerance_s, charge.cost, rate.burst]
        keys += lined
        if prefill is not None:
            keys += self._prefill(prefill.key)
            args += [prefill.tokens, prefill.within_s, GROWTH, LEARNT_KEPT_S, int(prefill.due)]
        refused = await self._run("take", keys, args)
        if refused is None:
            if prefill is not None:
                self._prefilling[lease.id] = prefill.key
            return None
        part, index, wait = refused
        return Refused(_PARTS[part], int(index), float(wait) if wait else None)

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        await self._hold(leases, ttl_s, adopt=False)

    async def adopt(self, leases: Sequence[Lease], ttl_s: float) -> None:
        """Hold `leases` here from now on, whatever this store knew of them: leases a
        replica granted itself while this store was unreachable."""
        await self._hold(leases, ttl_s, adopt=True)

    async def _hold(self, leases: Sequence[Lease], ttl_s: float, *, adopt: bool) -> None:
        """One script run per hash tag (so that each stays on one shard of a cluster) and
        per `LEASES_AT_ONCE` ids, all in one write, as `give_back`. Renewing, the prompts
        the leases' decisions counted in a prefill budget are renewed with them (a prompt
        that ended is not brought back); the budgets of leases no longer held are
        forgotten here and lapse there. Adopted leases' prompts were counted by the local
        store, if anywhere."""
        by_tag: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for lease in leases:
            for key in lease.keys:
                by_tag[_tag(key)].append((self._key(key), lease.id))
        if not adopt and self._prefilling:
            held = {lease.id for lease in leases}
            self._prefilling = {i: b for i, b in self._prefilling.items() if i in held}
            for lease_id, budget in self._prefilling.items():
                by_tag[_tag(budget)].append((self._prefill(budget)[1], lease_id))
        calls = [
            _held(ttl_s, adopt, pairs[start : start + LEASES_AT_ONCE])
            for pairs in by_tag.values()
            for start in range(0, len(pairs), LEASES_AT_ONCE)
        ]
        if calls:
            await self._runs("renew", calls, at_once=False)

    def announce(self, keys: Iterable[str]) -> None:
        """Announce the release of these slots only, and keep a line for them: slots
        nobody queues for (the edge's, the backend's) would cost every replica a message
        per request. Their lines' names are made here, once, not per decision."""
        self._lines = {}
        for slot in keys:
            line, owed = slot_line(slot)
            self._lines[slot] = (self._key(line), self._key(owed))

    async def give_back(self, backs: Sequence[GiveBack]) -> None:
        """One script run per hash tag (a decision's keys share one, so each run stays on
        one shard of a cluster) and per `GIVE_BACKS_AT_ONCE`, all in one write: queued
        before this awaits anything (on an open connection), so they come before any
        call made after this one began. Nobody waits for them: they never leave alone."""
        by_tag: dict[str, list[GiveBack]] = defaultdict(list)
        for back in backs:
            (_, slots), refunds = back
            if slots:
                by_tag[_tag(slots[0])].append(back)
            elif refunds:
                by_tag[_tag(refunds[0].charge.key)].append(back)
        calls = [
            self._give_back(group[start : start + GIVE_BACKS_AT_ONCE])
            for group in by_tag.values()
            for start in range(0, len(group), GIVE_BACKS_AT_ONCE)
        ]
        if calls:
            await self._runs("give_back", calls, at_once=False)

    def _give_back(self, backs: Sequence[GiveBack]) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = [self._channel, CLAIM_S]
        key, lines = self._key, self._lines
        for (lease_id, slots), refunds in backs:
            heard = [k for k in slots if k in lines]
            keys += map(key, heard)
            keys += [key(k) for k in slots if k not in lines]
            keys += [name for k in heard for name in lines[k]]
            args += [lease_id, len(slots), len(heard), len(refunds)]
            for (charged, rate, _), amount in refunds:
                keys.append(key(charged))
                args += [rate.interval_s, amount]
        return keys, args

    async def watch_releases(
        self, listener: Redis, released: Callable[[str], None], retry_s: float
    ) -> None:
        """Call `released(key)` for every slot freed by any replica, for the process's
        lifetime, subscribed through `listener` (a `listening` client); a lost
        subscription is made again every `retry_s` (releases missed meanwhile only cost
        the waiters their next own wake-up). The loss is logged once, and the recovery.
        """
        root = len(self._root)
        failed = 0
        while True:
            pubsub = listener.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                if failed:
                    log.info("release notifications restored after %d tries", failed)
                    failed = 0
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        released(message["data"].decode()[root:])
            except (RedisError, OSError) as exc:
                if not failed:
                    log.warning("release notifications lost (%s); resubscribing", exc)
                failed += 1
            finally:
                await pubsub.aclose()
            await asyncio.sleep(retry_s)

    async def prefilled(self, ends: Sequence[PrefillEnd]) -> dict[str, PrefillState]:
        """One script run for all the ends (every budget shares the pools' hash tag)."""
        if not ends:
            return {}
        keys: list[str] = []
        args: list[Any] = [self._channel, LEARNT_KEPT_S, HORIZON_S]
        for budget, lease_id, first_token in ends:
            self._prefilling.pop(lease_id, None)
            keys += self._prefill(budget)
            args += [lease_id, 1 if first_token else 0]
        states = await self._run("prefilled", keys, args)
        found = {}
        for (budget, _, _), state in zip(ends, states, strict=True):
            pending, done, busy = map(float, state)
            rate = done / busy if done > 0 and busy > 0 else None
            found[budget] = PrefillState(int(pending), rate)
        return found

    async def cool(self, key: str, duration_s: float) -> None:
        await self._run("cool", [self._key(key)], [duration_s])

    async def in_use(self, key: str) -> int:
        return int(await self._run("in_use", [self._key(key)], []))

    async def available(self, key: str, rate: Rate) -> float:
        args = [rate.interval_s, rate.tolerance_s, rate.burst]
        return float(await self._run("available", [self._key(key)], args))

    async def beat(self, replica: str, ttl_s: float) -> int:
        """Say this replica is alive for `ttl_s`; the number of live replicas."""
        return int(await self._run("beat", [self._key(keys.REPLICAS)], [replica, ttl_s]))

    async def sync_breaker(
        self,
        name: str,
        replica: str,
        outcomes: tuple[int, int, int, bool | None],
        policy: BreakerPolicy,
    ) -> tuple[str, float, bool]:
        """`capacity.fleet_breaker.BreakerStore.sync_breaker`."""
        ok, failed, trailing, probe_ok = outcomes
        probe = "" if probe_ok is None else ("ok" if probe_ok else "fail")
        args = [
            replica,
            ok,
            failed,
            trailing,
            probe,
            policy.consecutive_failures,
            policy.failure_ratio,
            policy.window,
            policy.min_attempts,
            policy.open_s,
            policy.max_open_s,
        ]
        state, reopens_in, ours = await self._run("breaker", [self._key(keys.circuit(name))], args)
        return state.decode(), float(reopens_in), ours == 1

    async def sync_fairness(
        self,
        name: str,
        replica: str,
        charged: Mapping[str, float],
        waiting: Sequence[str],
        idle: Sequence[str],
        ttl_s: float,
        held: Mapping[str, int],
    ) -> tuple[dict[str, float], dict[str, int]]:
        """`scheduling.fleet_fairness.FairnessStore.sync_fairness`."""
        args: list[Any] = [replica, ttl_s, len(charged)]
        for flow, amount in charged.items():
            args += [flow, amount]
        args += [len(waiting), *waiting, len(idle), *idle, len(held)]
        for flow, count in held.items():
            args += [flow, count]
        names = [self._key(key) for key in keys.fair_shares(name)]
        counters, elsewhere = await self._run("fair", names, args)
        return (
            {counters[i].decode(): float(counters[i + 1]) for i in range(0, len(counters), 2)},
            {elsewhere[i].decode(): int(elsewhere[i + 1]) for i in range(0, len(elsewhere), 2)},
        )

    async def close(self) -> None:
        await self._connection.close()


def _held(
    ttl_s: float, adopt: bool, pairs: Sequence[tuple[str, str]]
) -> tuple[list[str], list[Any]]:
    """One renewal script's keys and arguments: each key once, with its lease ids."""
    ids_by_key: dict[str, list[str]] = defaultdict(list)
    for name, lease_id in pairs:
        ids_by_key[name].append(lease_id)
    args: list[Any] = [ttl_s, "1" if adopt else "0"]
    for ids in ids_by_key.values():
        args += [len(ids), *ids]
    return list(ids_by_key), args


def _tag(key: str) -> str:
    """A key's Redis Cluster hash tag: the text between its first `{` and the next `}`."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if start >= 0 and end > start + 1 else key
