"""The hot path between a caller and a provider, readable top to bottom.

Every caller (the HTTP edge, the job workers, an in-process caller) hands the pipeline
an `Inbound` and uses the answer inside `Pipeline.run`, which does everything in order:
the tenant's concurrency gate, the body, the route's and aggregate's gates, resolving
the model, lane and deadline, quotas (`charge`), the pre-call guardrails (which may
rewrite the request), then upstream attempts, beside which parallel guardrails run and
whose answer passes the post-call ones (`guardrails.output`). Each attempt
waits for its turn in the model's dispatcher (the only wait point) and is granted a
deployment and a permit from each of its pools. Every permit lives on an exit stack
that `run` owns, so it is released exactly once, after the attempt has really ended;
the request's outcome is recorded once, when `run` ends.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, NamedTuple

from sluicegate.admission.boundary import Boundary, check_prompt
from sluicegate.admission.estimate import (
    Tokenizer,
    asked_output,
    chars_over_four,
    choices,
    output_tokens,
    prompt_tokens,
)
from sluicegate.answer import Answer, Held, Started
from sluicegate.core.call import Bill, Call, Tally
from sluicegate.core.clock import Clock, sleep_until, timeout_at
from sluicegate.core.errors import (
    CONTEXT_LENGTH,
    CallerGone,
    GatewayError,
    Upstream,
    bounded_retry_after,
    cut_by_shutdown,
    shutting_down,
)
from sluicegate.core.ids import request_id
from sluicegate.core.refusals import Refusal
from sluicegate.core.slo import Kind, Timeline, Verdict, judge_answer, judge_error, judge_left
from sluicegate.core.slo import tpot_s as time_per_token
from sluicegate.core.types import Deployment, Endpoint, Lane, Model, OverloadState, Settings, Tenant
from sluicegate.guardrails.build import NONE, Chosen, Guardrails
from sluicegate.guardrails.checker import Stage
from sluicegate.guardrails.guard import Guardrail, screen
from sluicegate.guardrails.output import OutputChecks
from sluicegate.guardrails.texts import request_places, rewritten, texts
from sluicegate.hedging import Hedging
from sluicegate.observability.access import AccessLog
from sluicegate.observability.logs import Lines
from sluicegate.observability.metrics import UNKNOWN_MODEL, GatewayMetrics
from sluicegate.observability.slo import SloAccounts
from sluicegate.observability.tracing import NO_SPAN, Spans
from sluicegate.providers.base import Provider, UpstreamResponse, timed_out
from sluicegate.providers.resume import continuation, resumable
from sluicegate.scheduling.attempt import Attempt, Target, patience_s
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.handover import Giver
from sluicegate.scheduling.ladder import degrade
from sluicegate.scheduling.lanes import Demand, classify
from sluicegate.scheduling.overload import OverloadMonitor, TtftWindow
from sluicegate.spend.gate import SpendGate

REFUSALS = frozenset(Refusal)

log = logging.getLogger("sluicegate")


class Inbound(NamedTuple):
    """A request as its caller hands it over, before anything is checked.

    `payload` reads and parses the body: called after the tenant's concurrency gate and
    before the shared ones, so a slow body holds only its own tenant's slot; when
    `body_in` says the body is already whole, nothing is worth holding while it is
    read, and the tenant's slot joins the shared gates' decision (one round trip to a
    shared store instead of two). `watch`,
    when given, is entered once the body is read and cancels the request when its
    caller goes away. `interactive` traffic takes
    the route's and the aggregate's slots as well as the tenant's; jobs take only the
    tenant's (the others guard interactive HTTP traffic). A library caller gives its own
    `prompt_tokens` count, and `avoid`, the deployments its earlier attempts used. The
    pipeline marks each stage the request passes on `timeline` (its own when none is
    given), for a caller that reports them. A guard model's call is not `guarded`: it
    passes no guardrail, so checking a text never asks for another check.
    """

    endpoint: Endpoint
    tenant: Tenant
    arrived_s: float
    payload: Callable[[], Awaitable[dict[str, Any]]]
    timeout_s: float | None = None
    lane: str | None = None
    client_retries: int = 0
    interactive: bool = True
    watch: Callable[[], AbstractAsyncContextManager[Any]] | None = None
    prompt_tokens: int | None = None
    avoid: frozenset[str] = frozenset()
    body_in: Callable[[], bool] = lambda: True
    timeline: Timeline | None = None
    guarded: bool = True


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        providers: Mapping[str, Provider],
        dispatchers: Mapping[str, Dispatcher],
        boundary: Boundary,
        overload: OverloadMonitor,
        metrics: GatewayMetrics,
        clock: Clock,
        tokenizer: Tokenizer = chars_over_four,
        access: AccessLog | None = None,
        spans: Spans | None = None,
        guardrails: Guardrails | None = None,
        spend: SpendGate | None = None,
    ) -> None:
        """`spend` None: nothing is priced and no budget is set, so spend costs nothing."""
        self._settings = settings
        self._guardrails = guardrails if guardrails is not None and guardrails.on else None
        self._models = settings.models
        self._routes = settings.routes
        self._scheduling = settings.scheduling
        self._top_priority = max(lane.priority for lane in settings.scheduling.lanes)
        self._providers = providers
        self._dispatchers = dispatchers
        self._boundary = boundary
        self._overload = overload
        self.ttft = TtftWindow(clock)
        self._metrics = metrics
        self.slo = SloAccounts(metrics, clock)
        self._clock = clock
        self._count = tokenizer
        self._random = random.Random()
        self._hedging = Hedging(clock, metrics.hedge)
        self.access = access
        self._spans = spans or Spans()
        self._lines = Lines(log)
        self.spend = spend

    @asynccontextmanager
    async def run(self, inbound: Inbound) -> AsyncIterator[Answer]:
        """The request's whole life; every permit taken is released when this ends."""
        call: Call | None = None
        answer: Answer | None = None
        timeline = inbound.timeline or Timeline(inbound.arrived_s)
        trail: list[str] = []
        with self._spans.request(inbound.endpoint) as span:
            try:
                async with AsyncExitStack() as permits:
                    arriving = not inbound.body_in()
                    if arriving:
                        await self._boundary.enter_tenant(inbound.tenant, permits)
                    payload = await inbound.payload()
                    if inbound.watch is not None:
                        await permits.enter_async_context(inbound.watch())
                    call = self._resolve(inbound, payload)
                    self._spans.resolved(span, call)
                    tally = Tally()
                    await self._boundary.admit(
                        call, permits, tally, inbound.interactive, tenant_slot=not arriving
                    )
                    if self.spend is not None:
                        await self.spend.admit(call, permits, tally)
                    timeline.admitted_s = self._clock.now()
                    checks: OutputChecks | None = None
                    if self._guardrails is not None and inbound.guarded:
                        try:
                            call, checks = await self._guard(call, timeline, permits)
                        except GatewayError:
                            tally.used_tokens = 0  # refused before any model call
                            raise
                    started = await self._first_answer(call, inbound.avoid, trail)
                    timeline.dispatched_s = started.attempt.dispatched_s
                    answer = started.answer
                    timeline.upstream_s = answer.primed_s
                    answer.part = started.held
                    answer.checks = checks
                    try:
                        async with answer:
                            self._metrics.attempts(started.attempt.number)
                            try:
                                if checks is not None:
                                    await checks.ready()
                                with self._spans.stream() if call.stream else NO_SPAN:
                                    yield answer
                            except BaseException as err:
                                answer.attempt.end(err)
                                raise
                            answer.attempt.end(None)
                    finally:
                        tally.used_tokens = answer.attempt.used_tokens
            except BaseException as err:
                self._record(inbound, call, answer, timeline, err, trail, span)
                raise
            self._record(inbound, call, answer, timeline, None, trail, span)

    def refused_at_edge(self, endpoint: Endpoint, err: GatewayError, timeline: Timeline) -> None:
        """A request the edge refused before handing it over (its key, its headers): its
        outcome, recorded as `run` records the rest."""
        route = endpoint.value
        self._metrics.answered(route, UNKNOWN_MODEL, err.status)
        verdict = judge_error(err.code, err.status, err.code in REFUSALS)
        self.slo.finished(route, UNKNOWN_MODEL, UNKNOWN_MODEL, None, verdict)
        self._refusal_line(route, err)
        access = self.access
        if access is not None:
            access.write(
                {
                    "request_id": request_id(),
                    "route": route,
                    "status": err.status,
                    "code": err.code,
                    "outcome": verdict.outcome,
                    "kind": verdict.kind.value,
                    "duration_ms": _ms(self._clock.now() - timeline.arrived_s),
                }
            )

    async def _guard(
        self, call: Call, timeline: Timeline, permits: AsyncExitStack
    ) -> tuple[Call, OutputChecks | None]:
        """Pre-call guardrails, in order, before the lane's queue (a refusal spends no
        model time, and its reservation is given back); then the parallel ones, started
        beside the model attempt, and what the answer must pass."""
        assert self._guardrails is not None
        chosen = self._guardrails.chosen(call.endpoint.value, call.lane.name, call.tenant.name)
        if chosen is NONE:
            return call, None
        if chosen.pre_call:
            call = await self._pre_call(call, chosen.pre_call)
            timeline.guarded_s = self._clock.now()
        return call, self._output_checks(call, chosen, permits)

    async def _pre_call(self, call: Call, guardrails: tuple[Guardrail, ...]) -> Call:
        route = call.endpoint.value
        pieces = texts(request_places(route, call.payload))
        if not pieces:
            return call
        checked = await screen(guardrails, pieces, Stage.INPUT)
        if checked == pieces:
            return call
        payload = rewritten(call.payload, lambda p: request_places(route, p), checked)
        return call._replace(payload=payload)

    def _output_checks(
        self, call: Call, chosen: Chosen, permits: AsyncExitStack
    ) -> OutputChecks | None:
        parallel: asyncio.Task[list[str]] | None = None
        if chosen.parallel:
            pieces = texts(request_places(call.endpoint.value, call.payload))
            parallel = asyncio.create_task(screen(chosen.parallel, pieces, Stage.INPUT))
            parallel.add_done_callback(_retrieved)
            permits.callback(parallel.cancel)
        if parallel is None and not chosen.post_call:
            return None
        cut = chosen.cut_streams and call.stream
        return OutputChecks(chosen.post_call, chosen.window, parallel, cut)

    def _resolve(self, inbound: Inbound, payload: dict[str, Any]) -> Call:
        tenant, endpoint = inbound.tenant, inbound.endpoint
        model = self._settings.model_for(tenant, payload["model"])
        route = self._routes[endpoint]
        prompt = self._prompt(inbound, payload)
        check_prompt(prompt, endpoint, route, tenant)
        output = output_tokens(endpoint, payload, route.max_output_tokens)
        answers = choices(payload)
        demand = Demand(prompt, output * answers, bool(payload.get("tools")))
        chosen = classify(self._scheduling, inbound.lane, tenant, route, demand)
        # A guard call follows the fate of the request it checks, which the ladder has
        # judged already: refused, moved or trimmed, it would fail or change the check.
        if inbound.guarded and self._overload.state >= OverloadState.DEGRADED:
            model = self._degrade(chosen, endpoint, model, payload)
            prompt = self._prompt(inbound, payload)
            output = output_tokens(endpoint, payload, route.max_output_tokens)
        output = _cap_output(chosen, endpoint, payload, output) * answers
        timeout_s = route.default_timeout_s if inbound.timeout_s is None else inbound.timeout_s
        return Call(
            endpoint,
            tenant,
            model,
            route,
            chosen,
            payload,
            payload.get("stream") is True,
            inbound.arrived_s,
            inbound.arrived_s + timeout_s,
            prompt,
            prompt + output,
            inbound.client_retries,
            bill=None if self.spend is None else Bill(discounted=not inbound.interactive),
        )

    def _prompt(self, inbound: Inbound, payload: dict[str, Any]) -> int:
        if inbound.prompt_tokens is not None:
            return inbound.prompt_tokens
        return prompt_tokens(inbound.endpoint, payload, self._count)

    def _degrade(
        self, lane: Lane, endpoint: Endpoint, model: Model, payload: dict[str, Any]
    ) -> Model:
        """The fallback ladder while degraded: refuse all but the top lane at the worst
        level, else rewrite the request cheaper and move background work to a smaller
        model."""
        scheduling = self._scheduling
        top = scheduling.top
        if self._overload.state >= OverloadState.INTERACTIVE_ONLY and lane is not top:
            raise Refusal.OVERLOADED.error(
                f"the gateway is overloaded and serves only the {top.name} lane; retry later"
            )
        ladder = scheduling.overload.ladder
        actions = degrade(ladder, lane, top, endpoint, payload, self._count)
        small = ladder.background_model
        if small is not None and lane is scheduling.bottom and lane is not top:
            model = self._models[small]
            actions.append("background_model")
        for action in actions:
            self._metrics.ladder_action(action)
        return model

    def _first_token(self, attempt: Attempt, giver: Giver | None) -> None:
        """Feed the model's dispatcher every streamed request's time to first token (its
        predictor learns each lane's time after dispatch) and the overload monitor the
        top lane's; a stream that may give its slot away offers it (`giver`)."""
        call = attempt.call
        if attempt.first_byte_s is not None:
            ttft_s = attempt.first_byte_s - call.arrived_s
            if call.lane is self._scheduling.top and not call.resumed:
                self.ttft.add(ttft_s)
            dispatcher = self._dispatchers[call.model.name]
            dispatcher.first_token(attempt, ttft_s)
            if giver is not None:
                dispatcher.may_give(attempt, giver)

    async def _first_answer(self, call: Call, avoid: frozenset[str], trail: list[str]) -> Started:
        """An attempt whose first bytes have arrived, after as many attempts as the route
        allows. An attempt that fails before that (connection, timeout, 5xx, throttling,
        a context window too small) releases its permits, and the next one re-enters the
        dispatcher after a jittered backoff, on another deployment when there is one.
        Once its answer is handed over the provider is fixed. Each attempt's deployment
        is added to `trail`."""
        retry = call.route.retry
        failure: GatewayError | None = None
        tried = set(avoid)
        for number in range(1, retry.max_attempts + 1):
            if failure is not None:
                await self._back_off(call, number, failure)
            self._budget_s(call)
            try:
                return await self._race(call, number, tried, trail)
            except _Failed as failed:
                if not failed.worth_another:
                    raise failed.error from None
                failure = failed.error
            except GatewayError:
                if failure is None:
                    raise
                raise failure from None
        assert failure is not None
        raise failure

    async def _race(self, call: Call, number: int, tried: set[str], trail: list[str]) -> Started:
        """One attempt, or two when the route hedges (see `Hedging`)."""
        hedge_after = call.route.hedge_after_s
        if hedge_after is None or len(call.model.deployments) < 2 or call.resumed:
            return await self._start(call, number, tried, trail)
        per_token = max(d.timeouts.output_token_s for d in call.model.deployments)
        return await self._hedging.race(
            lambda hedge: self._start(call, number, tried, trail, hedge),
            patience_s(call, hedge_after, per_token),
            Started.discard,
        )

    async def _start(
        self, call: Call, number: int, tried: set[str], trail: list[str], hedge: bool = False
    ) -> Started:
        """One attempt up to its first bytes. Whatever it took is released if it fails or
        is cancelled; on success the caller owns what it holds (`Held`)."""
        dispatcher = self._dispatchers[call.model.name]
        attempt = Attempt(call, number, frozenset(tried), hedge=hedge)
        held = Held(dispatcher.release, attempt)
        try:
            with self._spans.queue(call, number):
                await dispatcher.acquire(attempt)
            held.granted = True
            target = attempt.target
            assert target is not None
            tried.add(target.deployment.name)
            trail.append(target.deployment.name)
            try:
                with self._spans.attempt(call, target.deployment, number):
                    answer = await self._first_bytes(held, attempt, target)
            except GatewayError as err:
                attempt.end(err)
                raise _Failed(err, await self._worth_another(attempt, err, tried)) from None
            return Started(held, attempt, answer)
        except BaseException as err:
            attempt.end(err)
            await held.aclose()
            raise

    async def _first_bytes(self, held: Held, attempt: Attempt, target: Target) -> Answer:
        call, deployment = attempt.call, target.deployment
        attempt.body = body_for(call, deployment, self._top_priority)
        t = deployment.timeouts
        wait = call.route.first_byte_s or t.first_byte_s
        if not call.stream:
            wait = patience_s(call, wait or t.read_s, t.output_token_s)
        started = self._clock.now()
        try:
            async with timeout_at(self._clock, None if wait is None else started + wait):
                upstream = await held.open(_Opened(self, attempt, deployment, self._budget_s(call)))
                gives = not call.resumed and resumable(call, deployment)
                answer = Answer(
                    upstream, attempt, self._clock, self._first_token, self._resume, gives
                )
                try:
                    await answer.prime()
                except GatewayError as err:
                    self._upstream_failed(deployment, err)
                    raise
        except TimeoutError:
            raise timed_out(deployment.name) from None
        except GatewayError as err:
            if err.code == Upstream.TIMEOUT and not call.stream and wait is not None:
                raise _cut_by_deadline(err, call, self._clock.now(), started + wait) from None
            raise
        return answer

    async def _resume(self, call: Call, text: str, produced: int) -> Started:
        """The rest of `call`'s answer after `text` (`produced` tokens), whose stream gave
        its slot away: a request of its own, first among those beyond their share."""
        rest = call._replace(
            payload=continuation(call.payload, text, produced),
            prompt_tokens=call.prompt_tokens + produced,
            resumed=True,
        )
        return await self._first_answer(rest, frozenset(), [])

    async def _worth_another(self, attempt: Attempt, err: GatewayError, tried: set[str]) -> bool:
        """Act on a failed attempt (throttling cools the pools) and say whether another
        attempt may do better."""
        target = attempt.target
        assert target is not None
        deployment = target.deployment
        # A peer's Retry-After is a claim, not a fact: no deployment cools its pools, or
        # tells callers to wait, longer than its own `max_cooldown_s`.
        err.retry_after_s = bounded_retry_after(err.retry_after_s, deployment.max_cooldown_s)
        if err.code == Upstream.THROTTLED:
            await self.throttled(target, err.retry_after_s)
        if err.code == CONTEXT_LENGTH:
            return _larger_context_left(attempt.call, deployment, tried)
        if err.failover:
            self._metrics.retried(deployment.name, err.code)
        return err.failover

    async def throttled(self, target: Target, retry_after_s: float | None) -> None:
        """`target`'s deployment throttled an attempt: its pools cool for every caller
        sharing them and its circuit ramps back up after; a library caller reports it."""
        deployment = target.deployment
        cooldown = min(retry_after_s or deployment.throttle_cooldown_s, deployment.max_cooldown_s)
        for pool in target.pools:
            await pool.cool(cooldown)
            self._metrics.throttled(pool.name)
        target.breaker.ramp_after(cooldown)

    async def _back_off(self, call: Call, number: int, failure: GatewayError) -> None:
        """Full jitter, within the deadline; a context-window fallback does not wait."""
        retry = call.route.retry
        delay = 0.0
        if failure.code != CONTEXT_LENGTH:
            delay = self._random.uniform(0, min(retry.cap_s, retry.base_s * 2 ** (number - 2)))
        now = self._clock.now()
        if call.deadline_s - now - delay < call.route.min_attempt_s:
            raise failure
        await sleep_until(self._clock, now + delay)

    def _upstream_failed(self, deployment: Deployment, err: GatewayError) -> None:
        """A deployment's failure, counted and logged (throttling logged only)."""
        if err.status >= 500:
            self._metrics.upstream_error(deployment.name, err.code)
        if err.status >= 500 or err.code == Upstream.THROTTLED:
            self._lines.warning(
                ("upstream", deployment.name, err.code),
                "deployment %s failed: %s (%s)",
                deployment.name,
                err.code,
                err.message,
            )

    def _budget_s(self, call: Call) -> float:
        """The time left for the attempt; refuses when it cannot cover the minimum."""
        left = call.deadline_s - self._clock.now()
        if left < call.route.min_attempt_s:
            raise Refusal.DEADLINE.error(
                f"the request's deadline leaves {max(left, 0):.3f}s, less than the "
                f"{call.route.min_attempt_s:g}s an attempt needs"
            )
        return left

    def _record(
        self,
        inbound: Inbound,
        call: Call | None,
        answer: Answer | None,
        timeline: Timeline,
        error: BaseException | None,
        trail: list[str],
        span: Any,
    ) -> None:
        """The request's outcome, once: its status, a refusal's reason, the tokens its
        answer used, its verdict against its lane's SLOs (on success, with the time
        spent in each stage), and its access-log line."""
        if cut_by_shutdown(error):
            error = shutting_down()
        route = inbound.endpoint.value
        model = UNKNOWN_MODEL if call is None else call.model.name
        lane = UNKNOWN_MODEL if call is None else call.lane.name
        status = _status(error)
        now = self._clock.now()
        if isinstance(error, GatewayError) and error.code in REFUSALS:
            self._metrics.refused(route, error.code, status, now - inbound.arrived_s)
            self._refusal_line(route, error)
        self._metrics.answered(route, model, status)
        if answer is not None:
            timeline.first_byte_s = answer.opened.first_byte_s
            if answer.checked_s is not None:
                # The caller's first byte waited for the answer's checks.
                timeline.checked_s = timeline.first_byte_s = answer.checked_s
            opened, last = answer.opened, answer.attempt
            for part in (opened,) if opened is last else (opened, last):
                if part.used_tokens is not None:
                    self.slo.spent(route, model, lane, part.used_tokens, part.produced())
        if error is None and call is not None and answer is not None:
            first = timeline.first_byte_s
            tpot = None
            if call.stream and first is not None:
                tpot = time_per_token(first, now, answer.produced())
            self.slo.answered(route, model, lane, timeline, call.stream, tpot)
            if call.bill is not None:
                self.slo.priced(model, lane, call.bill.nanos)
            verdict = judge_answer(call.lane, timeline, now, tpot)
        else:
            verdict = _failed(call, timeline, error, now)
        self.slo.finished(route, model, lane, inbound.tenant.name, verdict)
        access = self.access
        line = access is not None and access.wanted(error is None)
        if not (line or self._spans.on):
            return
        code = error.code if isinstance(error, GatewayError) else None
        usage = _usage(answer)
        self._spans.ended(span, status, code, usage["prompt_tokens"], usage["completion_tokens"])
        if access is not None and line:
            fields = {
                "request_id": request_id(),
                "route": route,
                "model": model,
                "lane": lane,
                "tenant": inbound.tenant.name,
                "status": status,
                "code": code,
                "outcome": verdict.outcome,
                "kind": verdict.kind.value,
                "stream": None if call is None else call.stream,
                "duration_ms": _ms(now - inbound.arrived_s),
                "stages_ms": {stage: _ms(took) for stage, took in timeline.stages(now)},
                "attempts": len(trail),
                "deployments": trail,
                **usage,
            }
            if not inbound.guarded:
                fields["guard_call"] = True
            elif not inbound.interactive:
                fields["job"] = True
            access.write(fields)

    def _refusal_line(self, route: str, error: GatewayError) -> None:
        self._lines.warning(
            ("refused", route, error.code),
            "refused on %s with %d %s: %s",
            route,
            error.status,
            error.code,
            error.message,
        )


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A parallel check nobody waited for (the attempt failed first) raises nothing later."""
    if not task.cancelled():
        task.exception()


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _usage(answer: Answer | None) -> dict[str, int | None]:
    """The tokens of the answer's last part, as its deployment reported them."""
    if answer is None or answer.attempt.used_tokens is None:
        return {"prompt_tokens": None, "completion_tokens": None}
    attempt = answer.attempt
    return {
        "prompt_tokens": attempt.used_tokens - (attempt.produced() or 0),
        "completion_tokens": answer.produced(),
    }


def _failed(
    call: Call | None, timeline: Timeline, error: BaseException | None, now: float
) -> Verdict:
    """How a request that got no whole answer ended, judged against its lane's SLOs."""
    if isinstance(error, GatewayError):
        return judge_error(error.code, error.status, error.code in REFUSALS)
    if isinstance(error, asyncio.CancelledError | CallerGone):
        return judge_left(None if call is None else call.lane, timeline, now)
    return Verdict("internal_error", Kind.FAILED)


GATEWAY_FIELDS = frozenset(
    {"priority", "cache_salt", "request_id", "kv_transfer_params", "ec_transfer_params"}
)
"""Fields of vLLM's OpenAI server that steer the engine rather than the answer, which only
the gateway may set: `priority` orders vLLM's queue across every tenant; `cache_salt`
chooses whose prefix cache a prompt shares; `request_id` names the request inside the
engine; `kv_transfer_params` and `ec_transfer_params` tell a disaggregated engine where
to fetch KV and encoder caches from. A caller's own are dropped from every attempt."""


def body_for(call: Call, deployment: Deployment, top_priority: int) -> dict[str, Any]:
    """The body one attempt sends to `deployment`: the caller's, without the fields only
    the gateway may set, plus what this deployment alone needs. The caller's payload is
    shared by every attempt and never written to."""
    payload = call.payload
    if not GATEWAY_FIELDS.isdisjoint(payload):
        payload = {k: v for k, v in payload.items() if k not in GATEWAY_FIELDS}
    extra: dict[str, Any] = {}
    if deployment.pass_priority:
        extra["priority"] = top_priority - call.lane.priority
    salt = call.tenant.cache_salt
    if salt is not None and deployment.pass_cache_salt:
        extra["cache_salt"] = salt
    effort = call.route.reasoning_effort
    if effort is not None and "reasoning_effort" not in payload:
        extra["reasoning_effort"] = effort
    if deployment.provider == "anthropic" and asked_output(payload) is None:
        extra["max_tokens"] = call.route.max_output_tokens
    return {**payload, **extra} if extra else payload


def _larger_context_left(call: Call, failed: Deployment, tried: set[str]) -> bool:
    """Mark every deployment whose window is no larger than the one that was too small
    as tried; another attempt is worth it only if a larger one remains."""
    window = failed.context_window or 0
    larger = False
    for d in call.model.deployments:
        if d.context_window is not None and d.context_window > window:
            larger = larger or d.name not in tried
        else:
            tried.add(d.name)
    return larger


def _cut_by_deadline(
    err: GatewayError, call: Call, now: float, allowed_until: float
) -> GatewayError:
    """A non-streamed attempt cut by the request's own deadline before the deployment's
    allowance ran out: the caller asked for more output than its time covers, which
    is no failure of the deployment (no breaker learns from it, no retry is tried)."""
    if now >= allowed_until or call.deadline_s - now >= call.route.min_attempt_s:
        return err
    return Refusal.DEADLINE.error(
        "the request's deadline passed before its non-streamed answer was due: ask for "
        "fewer output tokens, stream, or allow more time"
    )


def _cap_output(lane: Lane, endpoint: Endpoint, payload: dict[str, Any], output: int) -> int:
    """Hold a request to its lane's output cap, rewriting its max_tokens if it asked more
    or named none (then it asks for as much as the model will write)."""
    cap = lane.max_output_tokens
    if cap is None or endpoint is Endpoint.EMBEDDINGS:
        return output
    asked = asked_output(payload)
    if asked is not None and asked <= cap:
        return output
    field = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
    payload[field] = cap
    return min(output, cap)


def _status(error: BaseException | None) -> int:
    """The status a request ended with: 499 when its caller left first."""
    if error is None:
        return 200
    if isinstance(error, GatewayError):
        return error.status
    if isinstance(error, asyncio.CancelledError | CallerGone):
        return 499
    return 500


class _Opened:
    """An attempt's upstream call, held by its `Held`: when it ends, the
    attempt takes the tokens the deployment reported (spend settles them), and a
    failure of the deployment, at the start or while the answer is read, is counted.
    A class rather than a generator-based context manager: every attempt enters one."""

    __slots__ = ("_attempt", "_deployment", "_opening", "_pipeline", "_upstream")

    def __init__(
        self, pipeline: Pipeline, attempt: Attempt, deployment: Deployment, budget_s: float
    ) -> None:
        body = attempt.body
        assert body is not None
        provider = pipeline._providers[deployment.name]
        self._pipeline = pipeline
        self._attempt = attempt
        self._deployment = deployment
        self._opening = provider.open(attempt.call.endpoint, body, budget_s)
        self._upstream: UpstreamResponse | None = None

    async def __aenter__(self) -> UpstreamResponse:
        try:
            self._upstream = upstream = await self._opening.__aenter__()
        except GatewayError as err:
            self._pipeline._upstream_failed(self._deployment, err)
            raise
        return upstream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        upstream, attempt, pipeline = self._upstream, self._attempt, self._pipeline
        assert upstream is not None
        attempt.used_tokens = upstream.used_tokens
        attempt.completion_tokens = upstream.completion_tokens
        if pipeline.spend is not None:
            attempt.cached_tokens = upstream.cached_tokens
            pipeline.spend.attempt_ended(attempt, self._deployment, exc)
        try:
            suppressed = await self._opening.__aexit__(exc_type, exc, traceback)
        except GatewayError as err:
            pipeline._upstream_failed(self._deployment, err)
            raise
        if not suppressed and isinstance(exc, GatewayError):
            pipeline._upstream_failed(self._deployment, exc)
        return suppressed


class _Failed(Exception):
    """An attempt failed upstream before its first bytes; the request may try again."""

    def __init__(self, error: GatewayError, worth_another: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.worth_another = worth_another
