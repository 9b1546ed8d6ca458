"""The hot path between the HTTP edge and a provider, readable top to bottom.

The edge authenticates and reads the body; the pipeline does everything else in
order: concurrency gates (`enter`), resolving the model, lane and deadline
(`resolve`), quotas (`charge`), then one upstream `attempt`, which waits for its turn
in the model's dispatcher (the only wait point) and receives a grant holding a permit
from every pool of the chosen deployment. Every permit lives on an exit stack owned by
the caller's `async with`, so it is released exactly once, after the attempt has ended.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sluicegate.admission.boundary import Boundary
from sluicegate.admission.estimate import Tokenizer, chars_over_four, output_tokens, prompt_tokens
from sluicegate.core.call import Call
from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.errors import CONTEXT_LENGTH, GatewayError
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Deployment, Endpoint, Lane, Model, OverloadState, Settings, Tenant
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.providers.base import Provider, UpstreamResponse, timed_out
from sluicegate.scheduling.dispatcher import Dispatcher, Grant
from sluicegate.scheduling.ladder import degrade
from sluicegate.scheduling.lanes import Demand, classify
from sluicegate.scheduling.overload import OverloadMonitor, TtftWindow


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
    ) -> None:
        self._settings = settings
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
        self._clock = clock
        self._count = tokenizer
        self._random = random.Random()
        self._losers: set[asyncio.Future[Any]] = set()

    async def enter(self, endpoint: Endpoint, tenant: Tenant, permits: AsyncExitStack) -> None:
        await self._boundary.enter(endpoint, tenant, permits)

    def resolve(
        self,
        tenant: Tenant,
        endpoint: Endpoint,
        payload: dict[str, Any],
        arrived_s: float,
        timeout_s: float | None,
        lane: str | None = None,
        client_retries: int = 0,
    ) -> Call:
        model = self._settings.model_for(tenant, payload["model"])
        route = self._routes[endpoint]
        prompt = prompt_tokens(endpoint, payload, self._count)
        output = output_tokens(endpoint, payload, route.max_output_tokens)
        demand = Demand(prompt, output, bool(payload.get("tools")))
        chosen = classify(self._scheduling, lane, tenant, route, demand)
        if self._overload.state >= OverloadState.DEGRADED:
            model = self._degrade(chosen, endpoint, model, payload)
            prompt = prompt_tokens(endpoint, payload, self._count)
            output = output_tokens(endpoint, payload, route.max_output_tokens)
        output = _cap_output(chosen, payload, output)
        deadline = arrived_s + (route.default_timeout_s if timeout_s is None else timeout_s)
        stream = payload.get("stream") is True
        return Call(
            endpoint,
            tenant,
            model,
            route,
            chosen,
            payload,
            stream,
            arrived_s,
            deadline,
            prompt,
            prompt + output,
            client_retries=client_retries,
        )

    def first_token(self, call: Call, ttft_s: float) -> None:
        """Feed the overload monitor and the model's dispatcher the protected lane's time
        to first token."""
        if call.lane is self._scheduling.top:
            self.ttft.add(ttft_s)
            self._dispatchers[call.model.name].first_token(call, ttft_s)

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

    async def charge(self, call: Call, permits: AsyncExitStack) -> None:
        await self._boundary.charge(call, permits)

    @asynccontextmanager
    async def attempt(self, call: Call) -> AsyncIterator[Answer]:
        """An upstream answer whose first bytes have arrived, after as many attempts as the
        route allows. An attempt that fails before that (connection, timeout, 5xx,
        throttling, a context window too small) releases its permits, and the next one
        re-enters the dispatcher after a jittered backoff, on another deployment when
        there is one. Once the answer is yielded the provider is fixed."""
        retry = call.route.retry
        failure: GatewayError | None = None
        for number in range(1, retry.max_attempts + 1):
            if failure is not None:
                await self._back_off(call, number, failure)
            self._budget_s(call)
            try:
                started = await self._race(call)
            except _Failed as failed:
                if not failed.worth_another:
                    raise failed.error from None
                failure = failed.error
                continue
            except GatewayError:
                if failure is None:
                    raise
                raise failure from None
            async with started.stack:
                self._metrics.attempts(number)
                try:
                    yield started.answer
                except GatewayError as err:
                    started.grant.failed = err.failover
                    raise
            return
        assert failure is not None
        raise failure

    async def _race(self, call: Call) -> _Started:
        """One attempt, or two when the route hedges: after `hedge_after_s` without first
        bytes a second attempt goes to another deployment, the first to answer wins and
        the other is cancelled (its permits stay held until it has really ended)."""
        hedge_after = call.route.hedge_after_s
        if hedge_after is None or len(call.model.deployments) < 2:
            return await self._start(call)
        first = asyncio.ensure_future(self._start(call))
        done, _ = await asyncio.wait({first}, timeout=hedge_after)
        if done:
            return first.result()
        self._metrics.hedge("sent")
        second = asyncio.ensure_future(self._start(call))
        pending = {first, second}
        errors: list[BaseException] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is not None:
                        errors.append(task.exception())
                        continue
                    if task is second:
                        self._metrics.hedge("won")
                    for other in done - {task}:
                        if other.exception() is None:
                            self._keep(asyncio.ensure_future(other.result().stack.aclose()))
                    return task.result()
            raise errors[0]
        finally:
            for task in pending:
                task.cancel()
                self._keep(task)

    def _keep(self, task: asyncio.Future[Any]) -> None:
        """Hold a losing attempt until it has really ended (it frees its own permits)."""
        self._losers.add(task)
        task.add_done_callback(self._losers.discard)

    async def _start(self, call: Call) -> _Started:
        """One attempt up to its first bytes. Whatever it took is released if it fails or
        is cancelled; on success the caller owns its exit stack."""
        dispatcher = self._dispatchers[call.model.name]
        stack = AsyncExitStack()
        try:
            grant = await dispatcher.acquire(call)
            stack.push_async_callback(dispatcher.release, grant, call)
            call.excluded.add(grant.target.deployment.name)
            try:
                answer = await self._first_bytes(stack, grant, call)
            except GatewayError as err:
                grant.failed = err.failover
                raise _Failed(err, await self._worth_another(grant, call, err)) from None
            return _Started(stack, grant, answer)
        except BaseException:
            await stack.aclose()
            raise

    async def _first_bytes(self, attempt: AsyncExitStack, grant: Grant, call: Call) -> Answer:
        deployment = grant.target.deployment
        if deployment.pass_priority:
            call.payload["priority"] = self._top_priority - call.lane.priority
        if call.route.reasoning_effort is not None:
            call.payload.setdefault("reasoning_effort", call.route.reasoning_effort)
        limit = call.route.first_byte_s or deployment.timeouts.first_byte_s
        try:
            async with asyncio.timeout(limit):
                upstream = await attempt.enter_async_context(
                    self._open(deployment, call, self._budget_s(call))
                )
                answer = Answer(upstream, call)
                await answer.prime()
        except TimeoutError:
            raise timed_out(deployment.name) from None
        return answer

    async def _worth_another(self, grant: Grant, call: Call, err: GatewayError) -> bool:
        """Act on a failed attempt (throttling cools the pools) and say whether another
        attempt may do better."""
        deployment = grant.target.deployment
        if err.code == "upstream_throttled":
            cooldown = err.retry_after_s or deployment.throttle_cooldown_s
            for pool in grant.target.pools:
                await pool.cool(cooldown)
                self._metrics.throttled(pool.name)
            grant.target.breaker.ramp_after(cooldown)
        if err.code == CONTEXT_LENGTH:
            return self._larger_context_left(call, deployment)
        if err.failover:
            self._metrics.retried(deployment.name, err.code)
        return err.failover

    def _larger_context_left(self, call: Call, failed: Deployment) -> bool:
        """Exclude every deployment whose window is no larger than the one that was too
        small; another attempt is worth it only if a larger one remains."""
        window = failed.context_window or 0
        larger = False
        for d in call.model.deployments:
            if d.context_window is not None and d.context_window > window:
                larger = larger or d.name not in call.excluded
            else:
                call.excluded.add(d.name)
        return larger

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

    @asynccontextmanager
    async def _open(
        self, deployment: Deployment, call: Call, budget_s: float
    ) -> AsyncIterator[UpstreamResponse]:
        provider = self._providers[deployment.name]
        try:
            async with provider.open(call.endpoint, call.payload, budget_s) as upstream:
                try:
                    yield upstream
                finally:
                    call.used_tokens = upstream.used_tokens
        except GatewayError as err:
            if err.status >= 500:
                self._metrics.upstream_error(deployment.name, err.code)
            raise

    def _budget_s(self, call: Call) -> float:
        """The time left for the attempt; refuses when it cannot cover the minimum."""
        left = call.deadline_s - self._clock.now()
        if left < call.route.min_attempt_s:
            raise Refusal.DEADLINE.error(
                f"the request's deadline leaves {max(left, 0):.3f}s, less than the "
                f"{call.route.min_attempt_s:g}s an attempt needs"
            )
        return left


def _cap_output(lane: Lane, payload: dict[str, Any], output: int) -> int:
    """Hold a request to its lane's output cap, rewriting its max_tokens if it asked more."""
    cap = lane.max_output_tokens
    if cap is None or output <= cap:
        return output
    field = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
    payload[field] = cap
    return cap


@dataclass(slots=True)
class _Started:
    """An attempt whose first bytes arrived: its permits live on `stack`."""

    stack: AsyncExitStack
    grant: Grant
    answer: Answer


class _Failed(Exception):
    """An attempt failed upstream before its first bytes; the request may try again."""

    def __init__(self, error: GatewayError, worth_another: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.worth_another = worth_another


class Answer:
    """An upstream answer whose first bytes are in hand: from here on its provider is
    fixed, and no retry can happen without the client seeing it."""

    __slots__ = ("_body", "_call", "_first", "_rest", "_upstream")

    def __init__(self, upstream: UpstreamResponse, call: Call) -> None:
        self._upstream = upstream
        self._call = call
        self._body = b""
        self._first = b""
        self._rest: AsyncIterator[bytes] | None = None

    async def prime(self) -> None:
        if self._call.stream:
            self._rest = self._upstream.chunks()
            self._first = await anext(self._rest)
        else:
            self._body = await self._upstream.read()

    async def read(self) -> bytes:
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self._rest is not None, "chunks() of a non-streamed answer"
        yield self._first
        async for chunk in self._rest:
            yield chunk
