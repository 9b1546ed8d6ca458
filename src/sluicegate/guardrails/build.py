"""The configured guardrails, built once at start, and the ones each request gets.

A checker kind is a name in `BUILDERS` (`http`, `plugin`; built-in kinds add theirs),
each a function from the guardrail's name and the checker's settings to a `Checker`.
Which guardrails a request gets depends only on its route, lane and tenant, all from
config, so the answer is worked out once per combination and kept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluicegate.core.clock import Clock
from sluicegate.core.guarding import CheckerSpec, GuardrailPolicy, GuardrailSpec
from sluicegate.guardrails.cache import DecisionCache
from sluicegate.guardrails.checker import Checker
from sluicegate.guardrails.guard import Counts, Guardrail, Recorder
from sluicegate.guardrails.http import HttpChecker
from sluicegate.guardrails.plugin import load_plugin
from sluicegate.observability.logs import Lines

log = logging.getLogger("sluicegate")

Builder = Callable[[str, Mapping[str, Any]], Checker]


def _http(name: str, settings: Mapping[str, Any]) -> Checker:
    return HttpChecker(name, str(settings["url"]), settings.get("headers") or {})


def _plugin(name: str, settings: Mapping[str, Any]) -> Checker:
    return load_plugin(str(settings["path"]), settings.get("options") or {}, name)


BUILDERS: dict[str, Builder] = {"http": _http, "plugin": _plugin}


@dataclass(frozen=True, slots=True)
class Chosen:
    """One request's guardrails by placement; `window` is the largest post-call one."""

    pre_call: tuple[Guardrail, ...] = ()
    parallel: tuple[Guardrail, ...] = ()
    post_call: tuple[Guardrail, ...] = ()
    cut_streams: bool = False
    window: int = 0


NONE = Chosen()


class Reports:
    """What guardrails decide goes to `recorder` (the metrics); a check that could not
    answer is also logged, once per guardrail and cause within the log's repeat window."""

    def __init__(self, recorder: Counts | None) -> None:
        self._recorder = recorder
        self._lines = Lines(log)

    def guardrail_decided(self, guardrail: str, outcome: str, took_s: float) -> None:
        if self._recorder is not None:
            self._recorder.guardrail_decided(guardrail, outcome, took_s)

    def guardrail_timed_out(self, guardrail: str) -> None:
        if self._recorder is not None:
            self._recorder.guardrail_timed_out(guardrail)

    def guardrail_cached(self, guardrail: str) -> None:
        if self._recorder is not None:
            self._recorder.guardrail_cached(guardrail)

    def guardrail_failed(self, guardrail: str, cause: str) -> None:
        self._lines.warning(
            ("guardrail", guardrail, cause), "guardrail %s could not check: %s", guardrail, cause
        )


class Guardrails:
    def __init__(
        self, policy: GuardrailPolicy, clock: Clock, recorder: Counts | None = None
    ) -> None:
        self._policy = policy
        reports = Reports(recorder)
        secret = os.urandom(32)
        self._checkers: list[Checker] = []
        self._built = {
            name: self._guardrail(spec, clock, secret, reports)
            for name, spec in policy.guardrails.items()
        }
        self._chosen: dict[tuple[str, str, str], Chosen] = {}
        self.on = bool(policy.rules)

    def _guardrail(
        self, spec: GuardrailSpec, clock: Clock, secret: bytes, recorder: Recorder
    ) -> Guardrail:
        cache = DecisionCache(
            clock, secret, spec.name, self._policy.version, spec.cache_ttl_s, spec.cache_size
        )
        fallback = None if spec.fallback is None else self._checker(spec.name, spec.fallback)
        return Guardrail(
            spec, self._checker(spec.name, spec.checker), clock, cache, fallback, recorder
        )

    def _checker(self, name: str, spec: CheckerSpec) -> Checker:
        checker = BUILDERS[spec.kind](name, spec.settings)
        self._checkers.append(checker)
        return checker

    def chosen(self, route: str, lane: str, tenant: str) -> Chosen:
        key = (route, lane, tenant)
        found = self._chosen.get(key)
        if found is None:
            picked = self._policy.select(route, lane, tenant)
            built = self._built
            post = tuple(built[s.name] for s in picked.post_call)
            found = self._chosen[key] = (
                Chosen(
                    tuple(built[s.name] for s in picked.pre_call),
                    tuple(built[s.name] for s in picked.parallel),
                    post,
                    picked.cut_streams,
                    max((s.spec.window for s in post), default=0),
                )
                if picked.any
                else NONE
            )
        return found

    async def close(self) -> None:
        for checker in self._checkers:
            close = getattr(checker, "close", None)
            if close is not None:
                await close()
