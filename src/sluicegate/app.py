"""Wiring: config -> objects -> an ASGI app (`Runtime`). The only module that imports everything."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from redis.asyncio import Redis

from sluicegate.admission.boundary import Boundary
from sluicegate.api.apart import apart
from sluicegate.api.asgi import Handler, Router
from sluicegate.api.batches import BatchRoutes
from sluicegate.api.budget import BodyBudget
from sluicegate.api.degraded import mark_degraded
from sluicegate.api.gateway import Gateway
from sluicegate.api.intake import Intake
from sluicegate.api.jobs import JobRoutes
from sluicegate.api.ledger import BatchLedger
from sluicegate.api.login import Logins
from sluicegate.api.requestids import with_request_ids
from sluicegate.api.spend import SpendRoutes
from sluicegate.api.statuspage import StatusPage
from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.fleet_breaker import BreakerSync, FleetBreaker
from sluicegate.capacity.gates import AimdGate, BackendGate, MetricsGate, OpenGate
from sluicegate.capacity.pools import Pool
from sluicegate.config import ConfigError
from sluicegate.core import keys
from sluicegate.core.clock import Clock, MonotonicClock
from sluicegate.core.leases import LEASE_TTL_S, Leases
from sluicegate.core.limits import LimitStore
from sluicegate.core.spend import BudgetStore
from sluicegate.core.types import (
    Budget,
    Deployment,
    Endpoint,
    JobPolicy,
    Lane,
    LogPolicy,
    OverloadState,
    RedisPolicy,
    Settings,
    TracingPolicy,
)
from sluicegate.guardrails.build import AskFor, Guardrails
from sluicegate.guardrails.guardmodel import Ask, Messages
from sluicegate.guardrails.plugin import PluginError
from sluicegate.jobs.clock import UnixClock
from sluicegate.jobs.postgres import open_postgres
from sluicegate.jobs.spend import SqlSpendRecord
from sluicegate.jobs.sqlite import open_sqlite
from sluicegate.jobs.sqlstore import SqlJobStore
from sluicegate.observability.access import AccessLog
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.observability.siblings import Seat, Siblings
from sluicegate.observability.status import snapshot, whole_server
from sluicegate.observability.tracing import Spans
from sluicegate.pipeline import Inbound, Pipeline
from sluicegate.providers.anthropic import AnthropicProvider
from sluicegate.providers.backend_metrics import MetricsPoller
from sluicegate.providers.base import Provider
from sluicegate.providers.openai import OpenAIProvider
from sluicegate.scheduling.attempt import Target
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.fairness import Fairness, RoundRobin, VirtualTokenCounter
from sluicegate.scheduling.fleet_fairness import FairnessSync, FleetVirtualTokenCounter, Queued
from sluicegate.scheduling.overload import OverloadMonitor, OverloadWatch
from sluicegate.scheduling.routing import placement_for
from sluicegate.spend.book import SpendBook
from sluicegate.spend.budgets import Budgets
from sluicegate.spend.gate import SpendGate
from sluicegate.stores.budget_memory import MemoryBudgetStore
from sluicegate.stores.budgets import RedisBudgetStore
from sluicegate.stores.failover import FailoverStore
from sluicegate.stores.memory import MemoryLimitStore
from sluicegate.stores.redis import RedisLimitStore, listener
from sluicegate.stores.resp import RespConnection
from sluicegate.supervisor import ALIVE
from sluicegate.worker import Workers

DRAIN_S = 1.0
"""How long a stopping replica waits for the releases still on their way to Redis."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """The wired objects: the ASGI app, the pipeline for in-process (library) callers and
    the clock it runs on, and the job workers, whose store is opened at startup."""

    app: Handler
    pipeline: Pipeline
    clock: Clock
    pools: dict[str, Pool]
    dispatchers: dict[str, Dispatcher]
    workers: Workers
    metrics: GatewayMetrics
    background: list[asyncio.Task[None]]
    """The loops that run for the server's lifetime (dispatchers, watchers), once started."""
    shared: FailoverStore | None
    """The fleet's shared limit store, when one is configured."""
    start: Callable[[], Awaitable[None]]
    """Starts what the policies need without the HTTP app or the job workers (library
    mode); the app's startup runs it first."""
    stop: Callable[[], Awaitable[None]]
    """Stops what `start` started, releases still on their way to Redis drained first."""
    gateway: Gateway


def build(
    settings: Settings,
    clock: Clock | None = None,
    providers: Mapping[str, Provider] | None = None,
    store: LimitStore | None = None,
    *,
    store_down: bool = False,
    seat: Seat | None = None,
) -> Runtime:
    """Wire `settings`; tests may hand in their own clock, providers and limit store.
    `store_down`: the shared store was found unreachable at start (begin degraded).
    `seat`: this process is one worker of `serve --workers N`."""
    clock = clock or MonotonicClock()
    policy = settings.redis
    if policy is not None and seat is not None:
        policy = counting_workers(policy, seat.count)
    ttl_s = policy.lease_ttl_s if policy is not None else LEASE_TTL_S
    shared = redis = None
    if store is None and policy is not None:
        redis = redis_store(policy)
        store = shared = FailoverStore(redis, clock, policy.when_down, ttl_s, degraded=store_down)
    fleet = redis is not None
    leases = Leases(store or MemoryLimitStore(clock), clock, ttl_s, detached=fleet)
    metrics = GatewayMetrics(
        tenant_labels=settings.metrics.tenant_labels, cache_s=settings.metrics.cache_s
    )
    pools = {name: Pool(spec, leases) for name, spec in settings.pools.items()}
    deployments = [d for model in settings.models.values() for d in model.deployments]
    providers = providers or {d.name: make_provider(d) for d in deployments}
    gates = {d.name: make_gate(d, clock, fleet=fleet) for d in deployments}
    monitor = OverloadMonitor(settings.scheduling.overload, clock)
    breakers = {d.name: make_breaker(d, clock, fleet=fleet) for d in deployments}
    dispatchers = {}
    for name, model in settings.models.items():
        targets = [
            Target(d, tuple(pools[p] for p in d.pools), gates[d.name], breakers[d.name])
            for d in model.deployments
        ]
        dispatchers[name] = Dispatcher(
            name,
            settings.scheduling.lanes,
            targets,
            fairness_factory(settings, name, clock, fleet=fleet),
            clock,
            metrics.queue_waited,
            pause_rule(settings, monitor),
            placement_for(model, targets),
            reserve=settings.scheduling.reserve,
            disabled=settings.scheduling.disabled,
        )
    metrics.watch(pools.values(), dispatchers.values(), gates)
    metrics.watch_overload(monitor)
    if shared is not None:
        metrics.watch_store(shared)
    pollers = [
        MetricsPoller(d.metrics, gate, leases.store.in_use, metrics.scrape_failed(d.name))
        for d in deployments
        if d.metrics is not None and isinstance(gate := gates[d.name], MetricsGate)
    ]
    boundary = Boundary(leases, settings.routes, settings.aggregate)
    access = access_log(settings.logs, metrics)
    spans, flush_spans = tracing(settings.tracing)
    built: list[Pipeline] = []
    guardrails = guardrails_of(settings, clock, metrics, guard_calls(settings, clock, built))
    wall = UnixClock()
    spend = spending(settings, metrics, wall, policy)
    pipeline = Pipeline(
        settings,
        providers,
        dispatchers,
        boundary,
        monitor,
        metrics,
        clock,
        access=access,
        spans=spans,
        guardrails=guardrails,
        spend=spend,
    )
    built.append(pipeline)
    watch = OverloadWatch(
        monitor,
        settings.scheduling,
        dispatchers.values(),
        [g for g in gates.values() if isinstance(g, MetricsGate)],
        pipeline.ttft,
        clock,
    )

    def own_status() -> dict[str, Any]:
        document = snapshot(monitor, dispatchers.values(), gates, pools.values())
        document["slo"] = pipeline.slo.view()
        document["history"] = pipeline.slo.history()
        document["spend"] = spend_view(settings, spend)
        if seat is not None:
            document["answered"] = metrics.answered_total()
        return document

    def answer(kind: str) -> bytes:
        """What this worker tells a sibling asking for its numbers."""
        if kind == "metrics":
            return metrics.samples()
        if kind == "alive":
            return ALIVE
        return orjson.dumps(own_status()) if kind == "status" else b""

    siblings = None if seat is None else Siblings(seat, answer)
    if siblings is not None:
        metrics.share(siblings)
        metrics.restarted(siblings.seat.restarts)

    async def status() -> dict[str, Any]:
        if siblings is None or seat is None:
            return own_status()
        documents = await siblings.ask("status")
        documents[seat.index] = own_status()
        return whole_server(seat.index, seat.count, documents)

    gateway = Gateway(settings, pipeline, metrics, clock, status)
    workers = Workers(settings, pipeline, metrics, clock, wall)
    intake = Intake(settings, wall, workers.wake, pace_clock=clock)
    page = StatusPage(
        status,
        settings.admin_keys,
        Logins(settings.admin_keys, wall),
        clock,
        settings.edge.status_viewers,
        lambda: gateway.ready,
    )
    ledger = BatchLedger(intake)
    spend_routes = SpendRoutes(spend, settings.admin_keys)
    background: list[asyncio.Task[None]] = []
    listeners: list[Redis] = []

    def fleet_jobs(
        policy: RedisPolicy, redis: RedisLimitStore, shared: FailoverStore
    ) -> Iterator[Coroutine[None, None, None]]:
        """The loops a replica runs for the fleet: circuits synced, and the pools' waiters
        woken when any replica frees a slot."""
        fleet = [b for b in breakers.values() if isinstance(b, FleetBreaker)]
        if fleet:
            yield BreakerSync(fleet, redis, clock, shared.replica, policy.sync_s).run()
        shares = fleet_shares(dispatchers.values())
        if shares:
            yield FairnessSync(shares, redis, clock, shared.replica, policy.sync_s).run()
        by_slot = {pool.slot.key: pool for pool in pools.values()}
        redis.announce(by_slot)
        # A prefill budget with room again wakes its deployment's waiters, as a slot of
        # any of its pools would.
        by_key = by_slot | {keys.prefill(d.name): pools[d.pools[0]] for d in deployments}
        listeners.append(listener(policy.url, policy.connect_timeout_s))

        def freed(key: str) -> None:
            pool = by_key.get(key)
            if pool is not None:
                pool.freed()

        yield redis.watch_releases(listeners[0], freed, policy.when_down.probe_s)

    scrapes: list[aiohttp.ClientSession] = []
    job_stores: list[SqlJobStore] = []
    records: list[SqlSpendRecord] = []

    async def job_store() -> SqlJobStore:
        """The jobs database, opened once for whichever needs it first (jobs, spend)."""
        if not job_stores:
            job_stores.append(await open_job_store(settings.jobs, wall))
        return job_stores[0]

    async def start_policies() -> None:
        """Everything the policies need running: providers, dispatchers, watchers, the
        shared store's loops and the backend scrapes (all a library caller needs)."""
        for provider in providers.values():
            await provider.start()
        if access is not None:
            access.start()
        loop = asyncio.get_running_loop()
        background.extend(loop.create_task(d.run()) for d in dispatchers.values())
        background.append(loop.create_task(watch.run()))
        background.append(loop.create_task(leases.run()))
        if shared is not None:
            await shared.run_once()
            background.append(loop.create_task(shared.run()))
        if policy is not None and redis is not None and shared is not None:
            background.extend(loop.create_task(job) for job in fleet_jobs(policy, redis, shared))
        if pollers:
            scrapes.append(aiohttp.ClientSession())
            background.extend(loop.create_task(p.run(scrapes[0])) for p in pollers)
        if spend is not None:
            if settings.jobs.enabled:
                records.append(SqlSpendRecord((await job_store()).database))
            record = records[0] if records else None
            spend_routes.attach(record)
            await start_spend(spend, record)
            background.append(loop.create_task(keep_spend(spend, record)))
        for task in background:
            task.add_done_callback(_report_crash)

    async def stop_policies() -> None:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for session in scrapes:
            await session.close()
        for provider in providers.values():
            await provider.close()
        await guardrails.close()
        if shared is not None:
            await leases.drain(DRAIN_S)
            await shared.close()
        for client in listeners:
            await client.aclose()
        if access is not None:
            await asyncio.to_thread(access.close)
        if flush_spans is not None:
            await asyncio.to_thread(flush_spans)
        if spend is not None:
            await last_flush(spend, records[0] if records else None)
        while job_stores:
            await job_stores.pop().close()

    async def startup() -> None:
        await start_policies()
        if settings.jobs.enabled:
            jobs = await job_store()
            intake.attach(jobs)
            workers.start(jobs, ledger.job_finished)
        if siblings is not None:
            await siblings.start()
        gc.collect()
        gc.freeze()
        gateway.ready = True

    async def shutdown() -> None:
        gateway.ready = False
        if siblings is not None:
            await siblings.close()
        intake.attach(None)
        if job_stores:
            await workers.stop()
        await stop_policies()

    router = gateway.routes(
        Router(on_startup=[startup], on_shutdown=[shutdown]),
        metrics=settings.metrics.listen is None,
    )
    page.routes(router)
    JobRoutes(intake).routes(router)
    BatchRoutes(intake, ledger).routes(router)
    spend_routes.routes(router)
    app: Handler = BodyBudget(router, settings.edge.max_body_bytes_in_flight)
    if shared is not None:
        app = mark_degraded(app, lambda: shared.degraded)
    listen_apart = settings.metrics.listen
    if listen_apart is not None:
        app = apart(app, gateway.metrics_routes(Router()), listen_apart[1])
    app = with_request_ids(app)
    return Runtime(
        app,
        pipeline,
        clock,
        pools,
        dispatchers,
        workers,
        metrics,
        background,
        shared,
        start_policies,
        stop_policies,
        gateway,
    )


def guardrails_of(
    settings: Settings, clock: Clock, metrics: GatewayMetrics, ask_for: AskFor
) -> Guardrails:
    """The configured guardrails; a checker that cannot be built is a config error."""
    try:
        return Guardrails(settings.guardrails, clock, metrics, ask_for)
    except PluginError as exc:
        raise ConfigError(str(exc)) from None


def guard_calls(settings: Settings, clock: Clock, pipeline: list[Pipeline]) -> AskFor:
    """A guard model's `ask`: a chat request through the gateway's own pipeline (built
    after the guardrails, hence the list), as the configured tenant in the configured
    lane. It waits in that lane's queue and takes its deployment's pool permits like any
    request, passes no guardrail (no recursion), and takes only its tenant's gates, not
    the route's or the aggregate's (those guard the HTTP edge, which it never crosses).
    The guardrail's budget bounds the whole call, its wait for a permit included."""
    tenants = {tenant.name: tenant for tenant in settings.tenants}

    def ask_for(checker: Mapping[str, Any]) -> Ask:
        tenant, lane = tenants[checker["tenant"]], checker["lane"]
        body = {"model": checker["model"], "max_tokens": checker["max_tokens"], "temperature": 0}

        async def ask(messages: Messages) -> str:
            async def payload() -> dict[str, Any]:
                return {**body, "messages": messages}

            inbound = Inbound(
                Endpoint.CHAT, tenant, clock.now(), payload, lane=lane, interactive=False,
                guarded=False,
            )  # fmt: skip
            async with pipeline[0].run(inbound) as answer:
                raw = await answer.read()
            return str(orjson.loads(raw)["choices"][0]["message"]["content"])

        return ask

    return ask_for


def spending(
    settings: Settings, metrics: GatewayMetrics, wall: Clock, redis: RedisPolicy | None
) -> SpendGate | None:
    """None when no deployment has a price and no budget is set: requests then pay
    nothing for spend."""
    policy = settings.spend
    if not policy.priced(settings.models):
        return None
    book = SpendBook(policy, wall, metrics.spent)
    if not policy.budgets:
        return SpendGate(settings, book, None)
    store: BudgetStore = MemoryBudgetStore()
    if redis is not None:
        connection = RespConnection(redis.url, redis.connect_timeout_s)
        store = RedisBudgetStore(connection, redis.key_prefix, redis.timeout_s)

    def used(budget: Budget, ratio: float) -> None:
        metrics.budget_used(budget.tenant, budget.model, budget.period.value, ratio, budget.soft)

    return SpendGate(settings, book, Budgets(policy, store, wall, used))


async def start_spend(spend: SpendGate, record: SqlSpendRecord | None) -> None:
    """Budgets learn where to rebuild their counters from, and build them now if the
    shared store has none (a new fleet, or Redis restarted while no replica ran), so
    the first requests are not refused while they are built."""
    budgets = spend.budgets
    if budgets is None or record is None:
        return

    async def spent_rows(first_day: str) -> list[tuple[str, str, str, int]]:
        await spend.book.flush(record)
        return await record.since(first_day)

    budgets.attach_record(spent_rows)
    try:
        await budgets.rebuild()
    except Exception as exc:
        logging.getLogger("sluicegate").warning("budget counters not built at start: %s", exc)


async def keep_spend(spend: SpendGate, record: SqlSpendRecord | None) -> None:
    """Write spend to the durable record and pay budgets what they are owed, every
    flush interval, for the process's lifetime."""
    budgets, every_s, clock = spend.budgets, spend.book.flush_s, MonotonicClock()
    then = None if budgets is None else budgets.pay_owed
    if record is not None:
        await spend.book.run(record, every_s, clock, then)
    elif budgets is not None:
        await budgets.run(every_s, clock)


async def last_flush(spend: SpendGate, record: SqlSpendRecord | None) -> None:
    """At a stop, what is still unwritten goes to the durable record: a rolling restart
    (a price change) loses no spend."""
    if record is not None:
        try:
            await spend.book.flush(record)
        except Exception as exc:
            logging.getLogger("sluicegate").error("spend not written at stop: %s", exc)
    if spend.budgets is not None:
        await spend.budgets.pay_owed()
        await spend.budgets.close()


def spend_view(settings: Settings, spend: SpendGate | None) -> dict[str, Any]:
    if spend is None:
        unpriced = ", ".join(
            sorted(d.name for m in settings.models.values() for d in m.deployments)
        )
        return {"tenants": {}, "unpriced_deployments": unpriced}
    view = spend.book.view(settings.models)
    if spend.budgets is not None:
        view["budgets_owed"] = spend.budgets.owed
    return view


def access_log(policy: LogPolicy, metrics: GatewayMetrics) -> AccessLog | None:
    """None when off, so the pipeline pays nothing for it."""
    if policy.access == "off":
        return None
    path = None if policy.access_path is None else Path(policy.access_path)
    return AccessLog(policy.access, policy.access_sample, path, dropped=metrics.access_line_dropped)


def tracing(policy: TracingPolicy) -> tuple[Spans, Callable[[], None] | None]:
    """The pipeline's spans and what flushes them at the end: OpenTelemetry's when
    tracing is on (imported only then), else marks that record nothing."""
    if not policy.enabled:
        return Spans(), None
    try:
        from sluicegate.observability import otel
    except ImportError as exc:
        raise ConfigError(
            f"tracing.enabled needs OpenTelemetry ({exc.name} is missing): "
            "pip install 'sluicegate[otel]'"
        ) from None
    made = otel.provider(policy)
    return otel.OtelSpans(made), made.shutdown


def counting_workers(policy: RedisPolicy, workers: int) -> RedisPolicy:
    """Each of `serve --workers N`'s workers is a replica: until Redis has told a live
    count, a degraded worker assumes at least N, so its local share is limit / N and the
    server admits each limit once, not N times."""
    down = policy.when_down
    if down.expected_replicas >= workers:
        return policy
    return dataclasses.replace(
        policy, when_down=dataclasses.replace(down, expected_replicas=workers)
    )


def redis_store(policy: RedisPolicy) -> RedisLimitStore:
    connection = RespConnection(policy.url, policy.connect_timeout_s)
    return RedisLimitStore(connection, policy.key_prefix, policy.timeout_s)


def fleet_shares(
    dispatchers: Iterable[Dispatcher],
) -> list[tuple[FleetVirtualTokenCounter, Queued]]:
    """Every lane's fleet fairness policy with its queue's counts, each told to wake its
    dispatcher after a sync (it may have held back)."""
    found = []
    for dispatcher in dispatchers:
        for queue in dispatcher.queues.values():
            if isinstance(queue.fairness, FleetVirtualTokenCounter):
                queue.fairness.on_change(dispatcher.kick)
                found.append((queue.fairness, queue.queued_counts))
    return found


def make_breaker(deployment: Deployment, clock: Clock, *, fleet: bool) -> Breaker:
    """A fleet breaker needs the shared store; config validation says so for `serve`,
    and a test handing in its own store gets local breakers."""
    if fleet and deployment.breaker.scope == "fleet":
        return FleetBreaker(deployment.name, deployment.breaker, clock)
    return Breaker(deployment.breaker, clock, name=deployment.name)


def _report_crash(task: asyncio.Task[None]) -> None:
    """These loops run for the process's lifetime: one that ends with an error is a bug
    that would otherwise stall its queue silently, so say so loudly."""
    if not task.cancelled() and (err := task.exception()) is not None:
        logging.getLogger("sluicegate").critical(
            "background task %s stopped", task.get_coro(), exc_info=err
        )


async def open_job_store(policy: JobPolicy, clock: Clock) -> SqlJobStore:
    if policy.store == "postgres":
        assert policy.postgres_dsn is not None, "config validation requires it"
        return await open_postgres(
            policy.postgres_dsn,
            policy.postgres_schema,
            clock,
            statement_timeout_s=policy.statement_timeout_s,
            acquire_timeout_s=policy.store_timeout_s,
        )
    return await open_sqlite(policy.sqlite_path, clock, policy.store_timeout_s)


def make_gate(deployment: Deployment, clock: Clock, *, fleet: bool) -> BackendGate:
    """In a fleet, a metrics gate bounds the whole fleet's sends between two scrapes."""
    if deployment.metrics is not None:
        key = keys.backend_in_flight(deployment.name) if fleet else None
        return MetricsGate(deployment.metrics, clock, key)
    if deployment.adaptive is not None:
        return AimdGate(deployment.adaptive)
    return OpenGate()


def pause_rule(settings: Settings, monitor: OverloadMonitor) -> Callable[[Lane], bool]:
    """From `batch_paused` on, the bottom lane is not dispatched (unless it is the only one)."""
    bottom, top = settings.scheduling.bottom, settings.scheduling.top

    def paused(lane: Lane) -> bool:
        return lane is bottom and lane is not top and monitor.state >= OverloadState.BATCH_PAUSED

    return paused


def fairness_factory(
    settings: Settings, model: str, clock: Clock, *, fleet: bool
) -> Callable[[Lane], Fairness]:
    """A fleet's VTC needs the shared store; a test handing in its own store gets local
    counters."""
    scheduling = settings.scheduling
    weights = {tenant.name: tenant.weight for tenant in settings.tenants}
    rates = (scheduling.input_weight, scheduling.output_weight)

    def make(lane: Lane) -> Fairness:
        if scheduling.fairness == "round_robin":
            return RoundRobin()
        if fleet and scheduling.fairness_scope == "fleet":
            return FleetVirtualTokenCounter(f"{model}:{lane.name}", clock, weights, *rates)
        return VirtualTokenCounter(weights, *rates)

    return make


def make_provider(deployment: Deployment) -> Provider:
    if deployment.provider == "openai":
        return OpenAIProvider(deployment)
    if deployment.provider == "anthropic":
        return AnthropicProvider(deployment)
    raise ConfigError(f"deployment {deployment.name!r}: unknown provider {deployment.provider!r}")
