"""The runtime snapshot of the configuration: plain frozen values, parsed once at start."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sluicegate.core.errors import ErrorType, GatewayError, not_found
from sluicegate.core.guarding import GuardrailPolicy
from sluicegate.core.limits import Rate


class Endpoint(enum.Enum):
    """The inference routes; the value is the metric label."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"

    @property
    def path(self) -> str:
        return _PATHS[self]

    @property
    def streams(self) -> bool:
        return self is not Endpoint.EMBEDDINGS


_PATHS = {
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.EMBEDDINGS: "/v1/embeddings",
}


@dataclass(frozen=True, slots=True)
class Timeouts:
    """`read_s` bounds each wait for upstream bytes (the gap between stream chunks);
    `first_byte_s`, when set, bounds dispatch to the answer's first bytes. A non-streamed
    answer's first bytes come with its whole body, so its wait (`first_byte_s`, else
    `read_s`) grows by `output_token_s` for each output token asked for."""

    connect_s: float
    read_s: float
    total_s: float
    first_byte_s: float | None = None
    output_token_s: float = 0.1


@dataclass(frozen=True, slots=True)
class BackendMetrics:
    """How the dispatcher reads a backend's own queue (vLLM's Prometheus metrics).

    `on_stale` says what a missing or old sample means: `hold` dispatches nothing,
    `pools` falls back to the pools' concurrency alone, `saturated` is `hold` for
    every lane but also counts as overload. `max_num_seqs` is the backend's running-batch
    size (vLLM's flag): requests sent since the last sample fill its free slots before
    they count as waiting. Unknown (None), every such request counts as waiting, which
    is safe but admits only about one background request per sample.
    """

    url: str
    interval_s: float = 0.25
    stale_after_s: float = 1.0
    on_stale: str = "pools"
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True)
class AdaptiveLimit:
    """AIMD concurrency for backends without metrics: x`decrease` when an attempt's
    time to first byte exceeds `latency_target_s`, +1 per window otherwise."""

    initial: int
    minimum: int
    maximum: int
    latency_target_s: float
    decrease: float = 0.9


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """Open after `consecutive_failures` in a row, or a `failure_ratio` over the last
    `window` attempts (once `min_attempts` were seen); stay open `open_s`, then let
    `half_open_probes` attempts through; a failed probe doubles the next open time, up
    to `max_open_s`. On success, ramp the deployment's concurrency up from `ramp_from`
    over `ramp_s` (jittered), so a backlog is not released at once."""

    consecutive_failures: int = 5
    failure_ratio: float = 0.5
    window: int = 20
    min_attempts: int = 10
    open_s: float = 5.0
    max_open_s: float = 60.0
    half_open_probes: int = 1
    ramp_s: float = 10.0
    ramp_from: int = 1
    scope: str = "local"
    """`fleet`: the counts and the state are shared by every replica (`store: redis`)."""


@dataclass(frozen=True, slots=True)
class Price:
    """What a deployment's provider bills, in dollars per million tokens: prompt tokens
    read from its prefix cache at `cached_input`, the rest at `input`, output at
    `output`; jobs and batches pay `1 - batch_discount` of that."""

    input: float
    cached_input: float
    output: float
    batch_discount: float = 0.0


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    provider: str
    base_url: str
    upstream_model: str
    api_key: str | None
    timeouts: Timeouts
    max_connections: int
    pools: tuple[str, ...]
    cancel_grace_s: float = 0.1
    idle_connection_s: float = 4.0
    """Below the backend's keep-alive, so the gateway closes an idle connection before
    the backend does and never sends a request into one closing under it."""
    metrics: BackendMetrics | None = None
    adaptive: AdaptiveLimit | None = None
    pass_priority: bool = False
    pass_cache_salt: bool = False
    resumable: bool = False
    breaker: BreakerPolicy = BreakerPolicy()
    throttle_cooldown_s: float = 5.0
    max_cooldown_s: float = 300.0
    max_response_bytes: int = 64 * 1024 * 1024
    context_window: int | None = None
    price: Price | None = None
    """None: its answers cost nothing, which `/admin/status` says."""

    def __repr__(self) -> str:
        return f"Deployment({self.name!r}, {self.provider}, {self.base_url})"


@dataclass(frozen=True, slots=True)
class PrefixAffinity:
    """How `prefix_affinity` cuts prompts and how much it remembers: blocks of
    `block_bytes` rendered bytes (about a quarter as many tokens), at most
    `index_blocks` per deployment (about its KV cache in tokens / (block_bytes / 4)),
    and a deployment fuller than `max_load_ratio` x the mean, and more than one request's
    share of its batch above the mean, gives way."""

    block_bytes: int = 512
    index_blocks: int = 8192
    max_load_ratio: float = 1.25


@dataclass(frozen=True, slots=True)
class Model:
    """`fallback` tries deployments in their listed order (a chain); `round_robin`
    rotates the first choice; `least_loaded` tries the one with the most room first;
    `prefix_affinity` the one that holds the longest part of the prompt in its cache
    (`scheduling.placement`). Whichever, a failed attempt moves to another one."""

    name: str
    deployments: tuple[Deployment, ...]
    strategy: str = "round_robin"
    prefix_affinity: PrefixAffinity = PrefixAffinity()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Up to `max_attempts` attempts per request, with full-jitter exponential backoff
    (uniform(0, min(cap_s, base_s x 2^n))) between them, all inside the deadline."""

    max_attempts: int = 3
    base_s: float = 0.05
    cap_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Quota:
    """Limits on one caller (a tenant) or on all of them together (the aggregate)."""

    max_concurrency: int | None = None
    requests: Rate | None = None
    tokens: Rate | None = None


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """Per-route rules. `max_concurrency` is refused beyond, with no queue. After
    `hedge_after_s` without a first byte, a second attempt goes to another deployment;
    `reasoning_effort` is sent when a request sets none. A caller's own deadline is held
    to `max_timeout_s`. `max_messages` bounds a chat
    request's messages, and with them the work of every pass over them."""

    max_concurrency: int | None = None
    default_timeout_s: float = 600.0
    max_timeout_s: float = 600.0
    min_attempt_s: float = 0.05
    max_output_tokens: int = 4096
    max_prompt_tokens: int | None = None
    lane: str | None = None
    retry: RetryPolicy = RetryPolicy()
    hedge_after_s: float | None = None
    reasoning_effort: str | None = None
    first_byte_s: float | None = None
    max_messages: int | None = None


@dataclass(frozen=True, slots=True)
class Lane:
    """A class of work with its own promise (SLOs) and queue rules.

    A higher `priority` is more important. `max_backend_waiting` is how many requests
    may wait in the backend's own queue when this lane dispatches (0: only into an
    empty queue). `max_share` caps the lane's part of each pool, which reserves the
    rest for the lanes above it. `max_dispatch_rate` (per second) spreads the lane's
    dispatches evenly, so its prefills do not reach a backend in waves. A request met
    the lane's SLOs (`ttft_slo_s`, `tpot_slo_s`, `e2e_slo_s`) when it succeeded within
    every one set (`core.slo`).
    """

    name: str
    priority: int = 0
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    e2e_slo_s: float | None = None
    max_output_tokens: int | None = None
    max_prompt_tokens: int | None = None
    max_cost: float | None = None
    demote_to: str | None = None
    queue_size: int = 0
    max_queue_age_s: float = 30.0
    max_backend_waiting: int = 2
    max_kv_usage: float | None = None
    max_share: float = 1.0
    starvation_s: float | None = None
    max_dispatch_rate: float | None = None


class OverloadState(enum.IntEnum):
    NORMAL = 0
    DEGRADED = 1
    BATCH_PAUSED = 2
    INTERACTIVE_ONLY = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Ladder:
    """What each state does. From `degraded`: drop n/best_of, cap interactive output,
    trim the oldest conversation turns to a prompt budget, send background work to a
    smaller model. From `batch_paused`: background lanes are not dispatched. At
    `interactive_only`: every lane but the top one is refused (503 `overloaded`)."""

    drop_n: bool = True
    interactive_max_tokens: int | None = None
    trim_prompt_tokens: int | None = None
    background_model: str | None = None


@dataclass(frozen=True, slots=True)
class OverloadPolicy:
    """Pressure thresholds (signal / promise) at which each state is entered, checked
    every `interval_s`; a state is left after `hold_s` below threshold x `leave_ratio`."""

    degraded_at: float = 0.7
    batch_paused_at: float = 0.85
    interactive_only_at: float = 1.0
    leave_ratio: float = 0.8
    hold_s: float = 5.0
    interval_s: float = 0.5
    ladder: Ladder = Ladder()

    def threshold(self, state: OverloadState) -> float:
        return {
            OverloadState.NORMAL: 0.0,
            OverloadState.DEGRADED: self.degraded_at,
            OverloadState.BATCH_PAUSED: self.batch_paused_at,
            OverloadState.INTERACTIVE_ONLY: self.interactive_only_at,
        }[state]


class Mechanism(enum.StrEnum):
    """A scheduling mechanism an operator may switch off (`scheduling.disable`): to see
    what it does for their traffic, or to rule it out while chasing a problem."""

    PREFILL_BUDGET = "prefill_budget"
    PREDICTOR = "predictor"
    """Admission by predicted time to first token, and CoDel shedding."""
    WITHIN_SHARE = "within_share"
    """The within-share verdict; without it nobody is within, so nothing is reserved
    for them and no stream hands its slot over."""
    TURNOVER = "turnover"
    """A hand-over's expected pause from the rate slots come free."""
    HANDOVER = "handover"


@dataclass(frozen=True, slots=True)
class Scheduling:
    """Lane order, fairness and the admission cost proxy alpha*prompt + beta*max_tokens +
    gamma*tool_risk (tool_risk is 1 when the request offers tools)."""

    lanes: tuple[Lane, ...] = (Lane("default"),)
    default_lane: str = "default"
    fairness: str = "vtc"
    fairness_scope: str = "local"
    """`fleet`: the virtual counters and who waits are shared by every replica."""
    input_weight: float = 1.0
    output_weight: float = 2.0
    cost_alpha: float = 1.0
    cost_beta: float = 1.0
    cost_gamma: float = 0.0
    reserve: float = 0.25
    """At most this share of the batch is kept free for top-lane requests within their
    tenant's share (`scheduling/reserve.py`); 0: none."""
    overload: OverloadPolicy = field(default_factory=OverloadPolicy)
    disabled: frozenset[Mechanism] = frozenset()

    @property
    def top(self) -> Lane:
        """The most important lane: the one overload protects."""
        return max(self.lanes, key=lambda lane: lane.priority)

    @property
    def bottom(self) -> Lane:
        return min(self.lanes, key=lambda lane: lane.priority)

    def lane(self, name: str) -> Lane | None:
        return next((lane for lane in self.lanes if lane.name == name), None)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    allowed_models: frozenset[str] | None
    quota: Quota = field(default_factory=Quota)
    max_prompt_tokens: int | None = None
    weight: float = 1.0
    lane: str | None = None
    lanes: frozenset[str] | None = None
    """The lanes it may ask for by header; None: its own lane and every lower one."""
    cache_salt: str | None = None
    """Sent as vLLM's `cache_salt` to deployments that take it: its prompts share the
    backend's prefix cache with its own alone, so no other tenant can tell by timing
    what it sent. None: the cache is shared."""

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    max_concurrency: int
    requests: Rate | None = None
    tokens: Rate | None = None


@dataclass(frozen=True, slots=True)
class JobPolicy:
    """Durable jobs: where they are kept, how workers claim and retry them, and how large
    the backlog may grow before new jobs are refused (`None`: no bound).

    `handoff_full` says what the claimer does when the local hand-off queue is full:
    `wait` stops claiming until there is room; `reject` hands the job straight back to
    the store for another worker or replica. A refused dispatch is not a failure: the job
    goes back after a full-jitter backoff (at least the refusal's Retry-After) until it
    was claimed `max_attempts` times. What ended more than `retention_s` ago is deleted.
    """

    store: str = "sqlite"
    sqlite_path: str = "sluicegate-jobs.db"
    enabled: bool = True
    """False without a `jobs:` section: no store is opened, the job routes refuse."""
    postgres_dsn: str | None = field(default=None, repr=False)
    postgres_schema: str = "sluicegate"
    workers: int = 8
    handoff_size: int = 16
    handoff_full: str = "wait"
    lease_s: float = 30.0
    heartbeat_s: float = 10.0
    poll_s: float = 0.5
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    backlog_max: int | None = 100_000
    tenant_backlog_max: int | None = 50_000
    backlog_max_age_s: float | None = None
    recheck_auth: bool = True
    default_deadline_s: float = 86_400.0
    expiry_sweep_s: float = 1.0
    max_file_bytes: int = 16 * 1024 * 1024
    retention_s: float | None = 30 * 86_400.0
    retention_sweep_s: float = 60.0
    tenant_storage_max_bytes: int | None = 1024**3
    tenant_submissions_per_minute: float | None = 600.0
    """A tenant's jobs, uploads and batches per minute, in one process (GCRA)."""
    tenant_max_concurrency: int | None = 64
    """A tenant's requests on the job, file and batch routes at once, in one process."""
    store_timeout_s: float = 5.0
    statement_timeout_s: float = 30.0


class WhenDown(enum.StrEnum):
    """What a kind of limit does while the shared limit store is unreachable."""

    LOCAL_SHARE = "local_share"
    FAIL_CLOSED = "fail_closed"
    FAIL_OPEN = "fail_open"


@dataclass(frozen=True, slots=True)
class DegradedPolicy:
    concurrency: WhenDown
    rates: WhenDown
    probe_s: float
    """How often a degraded replica tries the shared store again."""
    expected_replicas: int
    """The live count to assume until the shared store has told one."""


@dataclass(frozen=True, slots=True)
class RedisPolicy:
    """The shared limit store of a fleet (`store: redis`)."""

    url: str = field(repr=False)
    key_prefix: str
    timeout_s: float
    """Bound on each call: a later answer is a strike (three in a row degrade)."""
    connect_timeout_s: float
    """Bound on opening a connection, apart from calls: a TLS or AUTH set-up over a
    distant link may take longer than one call may wait, and it goes on meanwhile."""
    lease_ttl_s: float
    sync_s: float
    """How often shared state read from a snapshot (fleet circuits) is exchanged."""
    at_start: str
    """`degraded`: start without Redis under `when_down`; `fail`: refuse to start."""
    when_down: DegradedPolicy


@dataclass(frozen=True, slots=True)
class LogPolicy:
    access: Literal["off", "sampled", "on"] = "off"
    access_sample: float = 0.01
    access_path: str | None = None


@dataclass(frozen=True, slots=True)
class MetricsPolicy:
    keys: frozenset[bytes] = frozenset()
    """sha256 digests of the bearer tokens that may read `/metrics`; empty: anyone."""
    listen: tuple[str, int] | None = None
    """An address of its own for `/metrics`, which the API's address then does not serve."""
    tenant_labels: bool = True
    cache_s: float = 1.0


@dataclass(frozen=True, slots=True)
class TracingPolicy:
    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "sluicegate"
    sample_ratio: float = 1.0


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """What one client connection may cost: the server enforces the first four before
    the app sees a request, the edge the rest."""

    max_connections: int = 4096
    header_timeout_s: float = 10.0
    max_headers: int = 100
    max_header_bytes: int = 16 * 1024
    """The request line and every header together."""
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    """The longest one send to a client may wait for it to read."""
    keep_alive_s: float = 75.0
    """How long an idle connection stays open between requests: longer than clients
    and load balancers keep theirs (httpx 5 s, aiohttp 15 s, common balancers 60 s), so
    the client always closes first and never sends into a connection closing under it."""
    max_body_bytes_in_flight: int = 512 * 1024 * 1024
    """Request bodies held at once by the process, from arrival to their request's end."""
    status_viewers: int = 8
    """Status pages following the live feed at once: each costs a status document a
    second (and, with workers, a question to every sibling)."""
    stop_grace_s: float = 5.0
    """On a stop signal, how long requests in flight may still take before they are cut."""


class Period(enum.StrEnum):
    """A budget's period, aligned to the calendar in the spend policy's time zone."""

    DAILY = "daily"
    MONTHLY = "monthly"


@dataclass(frozen=True, slots=True)
class Budget:
    """`amount_nanos` (billionths of a dollar) per `period` for `tenant`, on one `model`
    or (None) on all of them; `soft` is the share of it past which the gateway warns."""

    tenant: str
    amount_nanos: int
    period: Period = Period.MONTHLY
    model: str | None = None
    soft: float | None = 0.8


@dataclass(frozen=True, slots=True)
class SpendPolicy:
    """Budgets and where spend is kept: `time_zone` aligns periods and days; the durable
    record is written every `flush_s`; `when_down` says what a budget does while the
    shared store cannot decide (`fail_open` counts the spend there once it is back)."""

    budgets: tuple[Budget, ...] = ()
    time_zone: str = "UTC"
    flush_s: float = 1.0
    when_down: WhenDown = WhenDown.FAIL_CLOSED

    def priced(self, models: Mapping[str, Model]) -> bool:
        """Whether anything is to be counted: a price anywhere, or a budget."""
        return bool(self.budgets) or any(
            d.price is not None for m in models.values() for d in m.deployments
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway needs at run time; `keys` maps sha256(key) to its tenant."""

    host: str
    port: int
    max_body_bytes: int
    models: dict[str, Model]
    tenants: tuple[Tenant, ...]
    keys: dict[bytes, Tenant]
    routes: dict[Endpoint, RoutePolicy]
    aggregate: Quota
    pools: dict[str, PoolSpec]
    scheduling: Scheduling = field(default_factory=Scheduling)
    admin_keys: frozenset[bytes] = frozenset()

    def model_for(self, tenant: Tenant, name: str) -> Model:
        """The model `name`, if it exists and `tenant` may use it (404 / 403 otherwise)."""
        model = self.models.get(name)
        if model is None:
            raise not_found(f"the model {name!r} does not exist", "model_not_found")
        if not tenant.may_use(name):
            raise GatewayError(
                403, "model_not_allowed", f"this key may not use the model {name!r}",
                ErrorType.PERMISSION, should_retry=False,
            )  # fmt: skip
        return model

    jobs: JobPolicy = JobPolicy()
    redis: RedisPolicy | None = None
    """The shared limit store; None: this process's memory."""
    edge: EdgeLimits = EdgeLimits()
    logs: LogPolicy = LogPolicy()
    metrics: MetricsPolicy = MetricsPolicy()
    tracing: TracingPolicy = TracingPolicy()
    guardrails: GuardrailPolicy = field(default_factory=GuardrailPolicy)
    spend: SpendPolicy = SpendPolicy()
