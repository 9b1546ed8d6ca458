"""The configured guardrails, built once at start, and the ones each request gets.

A checker kind is a name in `BUILDERS`, each a function from the guardrail's name, the
checker's settings and the way to ask a guard model to a `Checker`.
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
from sluicegate.guardrails.guardmodel import Ask, GuardModelChecker
from sluicegate.guardrails.http import HttpChecker
from sluicegate.guardrails.injection import FAMILIES, InjectionChecker
from sluicegate.guardrails.moderation import ModerationChecker
from sluicegate.guardrails.plugin import PluginError, load_plugin
from sluicegate.guardrails.size import SizeChecker
from sluicegate.observability.logs import Lines

log = logging.getLogger("sluicegate")

AskFor = Callable[[Mapping[str, Any]], Ask]
"""Makes a guard model's `ask` from its checker's settings (model, lane, tenant): the
gateway's own model call, handed in by the wiring so that this layer needs no pipeline."""

Builder = Callable[[str, Mapping[str, Any], AskFor], Checker]


def no_gateway(settings: Mapping[str, Any]) -> Ask:
    raise PluginError("a guard_model checker asks through the gateway, and none was given")


def _http(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    return HttpChecker(name, str(settings["url"]), settings.get("headers") or {})


def _plugin(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    return load_plugin(str(settings["path"]), settings.get("options") or {}, name)


def _pii(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    from sluicegate.guardrails.pii import DEFAULT_REGIONS, PiiChecker
    from sluicegate.guardrails.pii_kinds import KINDS

    return PiiChecker(
        settings.get("kinds") or KINDS, settings.get("regions") or DEFAULT_REGIONS, name
    )


def _terms(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    from sluicegate.guardrails.terms import TermsChecker

    return TermsChecker(settings["terms"], name, whole_words=settings.get("whole_words", True))


def _injection(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    return InjectionChecker(settings.get("families") or tuple(FAMILIES), name)


def _size(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    return SizeChecker(settings.get("max_chars"), settings.get("max_lines"), name)


def _moderation(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    return ModerationChecker(
        str(settings["url"]),
        settings.get("model"),
        settings.get("api_key"),
        settings.get("block"),
        settings.get("thresholds"),
        settings.get("timeout_s", 5.0),
        name,
    )


def _guard_model(name: str, settings: Mapping[str, Any], ask_for: AskFor) -> Checker:
    return GuardModelChecker(ask_for(settings), block=settings.get("block"), name=name)


BUILDERS: dict[str, Builder] = {
    "http": _http,
    "plugin": _plugin,
    "pii": _pii,
    "banned_terms": _terms,
    "injection": _injection,
    "size": _size,
    "moderation": _moderation,
    "guard_model": _guard_model,
}
"""The local checkers needing the `guardrails` extra (PII, banned terms) are imported
only when configured, so a gateway without the extra runs every other kind."""


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
        self,
        policy: GuardrailPolicy,
        clock: Clock,
        recorder: Counts | None = None,
        ask_for: AskFor = no_gateway,
    ) -> None:
        """Raises `PluginError` naming the guardrail and the field when a checker
        cannot be built from its settings."""
        self._policy = policy
        self._ask_for = ask_for
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
        at = f"guardrails.checks[{list(self._policy.guardrails).index(spec.name)}]"
        fallback = None
        if spec.fallback is not None:
            fallback = self._checker(spec.name, spec.fallback, f"{at}.fallback")
        checker = self._checker(spec.name, spec.checker, f"{at}.checker")
        return Guardrail(spec, checker, clock, cache, fallback, recorder)

    def _checker(self, name: str, spec: CheckerSpec, at: str) -> Checker:
        try:
            checker = BUILDERS[spec.kind](name, spec.settings, self._ask_for)
        except (ValueError, ModuleNotFoundError) as exc:
            # Each checker's own message names the setting it refuses.
            raise PluginError(f"{at} (guardrail {name!r}, {spec.kind}): {exc}") from None
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
