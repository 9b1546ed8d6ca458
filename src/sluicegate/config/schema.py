"""The config file's schema. Unknown keys are errors: a typo must not silently do nothing."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from sluicegate.core.types import Mechanism

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.:/-]*$")]
Seconds = Annotated[float, Field(gt=0)]


def _unique(what: str, names: list[str]) -> None:
    for problem in _duplicates(what, names):
        raise ValueError(problem)


def _duplicates(what: str, names: list[str]) -> Iterator[str]:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            yield f"duplicate name {name!r} in {what}"
        seen.add(name)


def _close(name: str, known: Iterable[str]) -> str:
    """A did-you-mean for a name close to a known one."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_connections: int = Field(default=4096, ge=1, description="open client connections")
    header_timeout_s: Seconds = Field(default=10.0, description="a request's line and headers")
    max_headers: int = Field(default=100, ge=8)
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, description="line + headers")
    body_timeout_s: Seconds = Field(default=30.0, description="a request's whole body")
    write_timeout_s: Seconds = Field(default=30.0, description="one send to a client")
    keep_alive_s: Seconds = Field(
        default=75.0, description="an idle client connection between requests"
    )
    max_body_bytes_in_flight: int = Field(
        default=512 * 1024 * 1024, ge=1024 * 1024, description="every request body held at once"
    )
    status_viewers: int = Field(
        default=8, ge=1, description="status pages following /admin/live at once, per process"
    )
    stop_grace_s: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="on SIGTERM/SIGINT, requests in flight get this long before they are cut",
    )


class QuotaConfig(Strict):
    """Rates are smooth (GCRA): a full minute's worth may arrive at once, then it refills."""

    max_concurrency: int | None = Field(default=None, ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class TenantLimitsConfig(QuotaConfig):
    max_prompt_tokens: int | None = Field(default=None, ge=1)


class PoolConfig(Strict):
    name: Name
    max_concurrency: int = Field(ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class RetryConfig(Strict):
    max_attempts: int = Field(default=3, ge=1, le=10)
    base_s: float = Field(default=0.05, ge=0)
    cap_s: float = Field(default=2.0, ge=0)


class BreakerConfig(Strict):
    consecutive_failures: int = Field(default=5, ge=1)
    failure_ratio: float = Field(default=0.5, gt=0, le=1)
    window: int = Field(default=20, ge=1)
    min_attempts: int = Field(default=10, ge=1)
    open_s: Seconds = 5.0
    max_open_s: Seconds = 60.0
    half_open_probes: int = Field(default=1, ge=1)
    ramp_s: float = Field(default=10.0, ge=0)
    ramp_from: int = Field(default=1, ge=1)
    scope: Literal["local", "fleet"] = Field(
        default="local", description="fleet: counts and state shared by all replicas"
    )


class RouteConfig(Strict):
    max_concurrency: int | None = Field(default=None, ge=1)
    default_timeout_s: Seconds = 600.0
    max_timeout_s: Seconds | None = Field(
        default=None, description="the longest deadline a caller may ask for (default_timeout_s)"
    )
    min_attempt_s: float = Field(default=0.05, ge=0)
    max_output_tokens: int = Field(default=4096, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    lane: str | None = None
    retry: RetryConfig = RetryConfig()
    hedge_after_s: Seconds | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    first_byte_s: Seconds | None = Field(
        default=None, description="overrides the deployments' first-byte timeout"
    )

    @model_validator(mode="after")
    def _longest_after_default(self) -> RouteConfig:
        if self.max_timeout_s is not None and self.max_timeout_s < self.default_timeout_s:
            raise ValueError("max_timeout_s must be at least default_timeout_s")
        return self


class ChatRouteConfig(RouteConfig):
    max_messages: int = Field(
        default=4096, ge=1, description="the most messages one request may carry (400 beyond)"
    )


class RoutesConfig(Strict):
    chat: ChatRouteConfig = ChatRouteConfig()
    completions: RouteConfig = RouteConfig()
    embeddings: RouteConfig = RouteConfig()


class LaneConfig(Strict):
    name: Name
    priority: int = 0
    ttft_slo_s: Seconds | None = None
    tpot_slo_s: Seconds | None = None
    e2e_slo_s: Seconds | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    demote_to: str | None = None
    queue_size: int = Field(default=0, ge=0)
    max_queue_age_s: Seconds = 30.0
    max_backend_waiting: int = Field(default=2, ge=0)
    max_kv_usage: float | None = Field(default=None, gt=0, le=1)
    max_share: float = Field(default=1.0, gt=0, le=1)
    starvation_s: Seconds | None = None
    max_dispatch_rate: float | None = Field(default=None, gt=0)


class LadderConfig(Strict):
    drop_n: bool = True
    interactive_max_tokens: int | None = Field(default=None, ge=1)
    trim_prompt_tokens: int | None = Field(default=None, ge=1)
    background_model: str | None = None


class OverloadConfig(Strict):
    degraded_at: float = Field(default=0.7, gt=0)
    batch_paused_at: float = Field(default=0.85, gt=0)
    interactive_only_at: float = Field(default=1.0, gt=0)
    leave_ratio: float = Field(default=0.8, gt=0, lt=1)
    hold_s: float = Field(default=5.0, ge=0)
    interval_s: Seconds = 0.5
    ladder: LadderConfig = LadderConfig()

    @model_validator(mode="after")
    def _ordered(self) -> OverloadConfig:
        if not self.degraded_at <= self.batch_paused_at <= self.interactive_only_at:
            raise ValueError("need degraded_at <= batch_paused_at <= interactive_only_at")
        return self


class SchedulingConfig(Strict):
    lanes: list[LaneConfig] = Field(default_factory=lambda: [LaneConfig(name="default")])
    default_lane: str | None = Field(default=None, description="default: the first lane")
    fairness: Literal["vtc", "round_robin"] = "vtc"
    fairness_scope: Literal["local", "fleet"] | None = Field(
        default=None, description="vtc: counters shared by the fleet; default fleet with redis"
    )
    input_weight: float = Field(default=1.0, ge=0)
    output_weight: float = Field(default=2.0, ge=0)
    cost_alpha: float = Field(default=1.0, ge=0)
    cost_beta: float = Field(default=1.0, ge=0)
    cost_gamma: float = Field(default=0.0, ge=0)
    reserve: float = Field(
        default=0.25,
        ge=0,
        le=0.5,
        description="most of the batch kept free for top-lane requests within their "
        "tenant's share, where the top lane sets ttft_slo_s; 0: none (fully work-conserving)",
    )
    overload: OverloadConfig = OverloadConfig()
    disable: list[Mechanism] = Field(
        default_factory=list, description="scheduling mechanisms switched off"
    )

    @model_validator(mode="after")
    def _lanes_exist(self) -> SchedulingConfig:
        _unique("lanes", [lane.name for lane in self.lanes])
        by_name = {lane.name: lane for lane in self.lanes}
        if self.default_lane is not None and self.default_lane not in by_name:
            raise ValueError(f"default_lane {self.default_lane!r} is not a lane")
        for lane in self.lanes:
            if lane.demote_to is None:
                continue
            target = by_name.get(lane.demote_to)
            if target is None:
                raise ValueError(f"lane {lane.name!r} demotes to unknown lane {lane.demote_to!r}")
            if target.priority >= lane.priority:
                raise ValueError(f"lane {lane.name!r} must demote to a lower-priority lane")
        return self


class MetricsConfig(Strict):
    url: HttpUrl | None = Field(default=None, description="default: base_url's /metrics")
    interval_s: Seconds = 0.25
    stale_after_s: Seconds = 1.0
    on_stale: Literal["hold", "pools", "saturated"] = "pools"
    max_num_seqs: int | None = Field(default=None, ge=1)


class AdaptiveConfig(Strict):
    initial: int = Field(default=8, ge=1)
    minimum: int = Field(default=1, ge=1)
    maximum: int = Field(default=256, ge=1)
    latency_target_s: Seconds
    decrease: float = Field(default=0.9, gt=0, lt=1)


class TimeoutsConfig(Strict):
    connect_s: Seconds = 5.0
    read_s: Seconds = 60.0
    total_s: Seconds = 600.0
    first_byte_s: Seconds | None = None
    output_token_s: float = Field(
        default=0.1,
        ge=0,
        allow_inf_nan=False,
        description="a non-streamed answer's extra wait per output token",
    )


Dollars = Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)]


class PriceConfig(Strict):
    """Dollars per million tokens, as the provider bills them."""

    input: Dollars
    cached_input: Dollars | None = Field(
        default=None, description="prompt tokens read from the prefix cache; default input"
    )
    output: Dollars
    batch_discount: float = Field(
        default=0.0, ge=0, lt=1, description="the share jobs and batches do not pay"
    )


class DeploymentConfig(Strict):
    name: Name
    provider: Literal["openai", "anthropic"] = "openai"
    base_url: HttpUrl
    model: str | None = Field(default=None, description="upstream model name; default: public")
    api_key_env: str | None = None
    timeouts: TimeoutsConfig = TimeoutsConfig()
    max_connections: int = Field(default=256, ge=1)
    cancel_grace_s: float = Field(default=0.1, ge=0)
    idle_connection_s: Seconds = Field(
        default=4.0,
        description="keep an idle pooled connection this long; below the backend's own "
        "keep-alive (vLLM and uvicorn: 5 s)",
    )
    metrics: MetricsConfig | None = Field(
        default=None, description="read the backend's queue from its Prometheus metrics"
    )
    adaptive: AdaptiveConfig | None = Field(
        default=None, description="an adaptive concurrency limit, for backends without metrics"
    )
    pass_priority: bool = Field(
        default=False, description="send the lane's priority as vLLM's `priority` field"
    )
    pass_cache_salt: bool = Field(
        default=False,
        description="send a tenant's own cache salt (tenants' isolate_cache) as vLLM's "
        "`cache_salt` field",
    )
    resumable: bool = Field(
        default=False,
        description="the backend continues a partial assistant message (vLLM's "
        "`continue_final_message`): a stream beyond its share may give its slot to a "
        "request within its share and resume after",
    )
    breaker: BreakerConfig = BreakerConfig()
    throttle_cooldown_s: Seconds = Field(
        default=5.0, description="cooldown after a 429 that names no Retry-After"
    )
    max_cooldown_s: Seconds = Field(
        default=300.0,
        allow_inf_nan=False,
        description="the longest cooldown or Retry-After a deployment may set",
    )
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="a longer upstream answer is a 502"
    )
    context_window: int | None = Field(
        default=None, ge=1, description="tokens; a context-length error falls back to a larger one"
    )
    pools: list[str] = Field(
        default_factory=list, description="pools gating this deployment; default: its own"
    )
    price: PriceConfig | None = Field(default=None, description="none: its answers cost 0")

    @model_validator(mode="after")
    def _resumable_speaks_openai(self) -> DeploymentConfig:
        if self.resumable and self.provider != "openai":
            raise ValueError(
                "'resumable' needs an OpenAI-compatible server that continues a final "
                "assistant message (vLLM's continue_final_message), not provider "
                f"{self.provider!r}"
            )
        return self


class PrefixAffinityConfig(Strict):
    block_bytes: int = Field(
        default=512, ge=16, le=65536, description="prompt bytes per hashed block"
    )
    index_blocks: int = Field(
        default=8192,
        ge=1,
        le=10_000_000,
        description="blocks remembered per deployment: about its KV cache in tokens "
        "/ (block_bytes / 4)",
    )
    max_load_ratio: float = Field(
        default=1.25,
        gt=1,
        description="an affine deployment fuller than this x the mean, and more than one "
        "request's share of its batch above the mean, gives way",
    )


class ModelConfig(Strict):
    name: Name
    deployments: list[DeploymentConfig] = Field(min_length=1)
    strategy: Literal["round_robin", "fallback", "least_loaded", "prefix_affinity"] = "round_robin"
    prefix_affinity: PrefixAffinityConfig = PrefixAffinityConfig()


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class KeyConfig(Strict):
    """A key is given by its sha256 (hex) or read from an environment variable, never inline."""

    FORMS: ClassVar[str] = "{sha256: ...} or {env: ...}"
    """The forms a key may take, for an error about one in another shape."""

    sha256: str | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> KeyConfig:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of 'sha256' or 'env'")
        if self.sha256 is not None and not _SHA256.match(self.sha256):
            raise ValueError("'sha256' must be 64 lowercase hex characters")
        return self


class TenantConfig(Strict):
    name: Name
    keys: list[KeyConfig] = Field(min_length=1)
    models: list[str] | None = Field(default=None, description="allowed models; omit for all")
    limits: TenantLimitsConfig = TenantLimitsConfig()
    weight: float = Field(default=1.0, gt=0, description="share of service under contention")
    lane: str | None = Field(default=None, description="default lane of this tenant's requests")
    lanes: list[str] | None = Field(
        default=None,
        min_length=1,
        description="lanes it may ask for by header; omit for its own lane and every lower one",
    )
    isolate_cache: bool = Field(
        default=False,
        description="its prompts share the backends' prefix cache with its own alone "
        "(deployments with pass_cache_salt)",
    )


class AdminConfig(Strict):
    keys: list[KeyConfig] = Field(default_factory=list, description="keys for /admin routes")


class JobsConfig(Strict):
    """Durable jobs and batches; every key has a default."""

    store: Literal["sqlite", "postgres"] = "sqlite"
    sqlite_path: str = Field(
        default="sluicegate-jobs.db", min_length=1, description="relative to the working directory"
    )
    postgres_dsn: str | None = None
    postgres_schema: str = Field(default="sluicegate", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    workers: int = Field(default=8, ge=1, description="jobs dispatched at once by this process")
    handoff_size: int = Field(default=16, ge=1, description="claimed jobs waiting for a worker")
    handoff_full: Literal["wait", "reject"] = "wait"
    lease_s: Seconds = 30.0
    heartbeat_s: Seconds = 10.0
    poll_s: Seconds = Field(default=0.5, description="how often an idle claimer looks for jobs")
    max_attempts: int = Field(default=5, ge=1)
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_cap_s: float = Field(default=60.0, ge=0)
    backlog_max: int | None = Field(default=100_000, ge=1)
    tenant_backlog_max: int | None = Field(
        default=50_000, ge=1, description="queued jobs per tenant: one full batch"
    )
    backlog_max_age_s: Seconds | None = None
    recheck_auth: bool = True
    default_deadline_s: Seconds = 86_400.0
    expiry_sweep_s: Seconds = 1.0
    max_file_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    retention_s: Seconds | None = Field(
        default=30 * 86_400.0, description="finished jobs, final batches and files are deleted"
    )
    retention_sweep_s: Seconds = 60.0
    tenant_storage_max_bytes: int | None = Field(
        default=1024**3, ge=1024, description="a tenant's files, job bodies and results"
    )
    tenant_submissions_per_minute: float | None = Field(
        default=600, gt=0, description="a tenant's jobs, uploads and batches, per process"
    )
    tenant_max_concurrency: int | None = Field(
        default=64, ge=1, description="a tenant's job, file and batch requests at once, per process"
    )
    store_timeout_s: Seconds = Field(
        default=5.0, description="longest wait for a database connection or lock"
    )
    statement_timeout_s: Seconds = Field(default=30.0, description="PostgreSQL, per statement")

    @model_validator(mode="after")
    def _consistent(self) -> JobsConfig:
        if self.store == "postgres" and not self.postgres_dsn:
            raise ValueError("store 'postgres' needs postgres_dsn")
        if self.heartbeat_s >= self.lease_s:
            raise ValueError("heartbeat_s must be shorter than lease_s, or leases lapse")
        return self


WhenDownName = Literal["local_share", "fail_closed", "fail_open"]


class WhenDownConfig(Strict):
    """Per kind of limit, what a replica does while Redis is unreachable."""

    concurrency: WhenDownName = "local_share"
    rates: WhenDownName = "local_share"


class RedisConfig(Strict):
    url: str = Field(
        min_length=1, description="redis://, rediss:// (TLS) or unix://; ACL user:password@"
    )
    key_prefix: str = Field(default="sluicegate:", max_length=64)
    timeout_s: Seconds = Field(default=0.05, description="bound on every call to Redis")
    connect_timeout_s: Seconds = Field(
        default=1.0,
        description="bound on opening a connection (TCP, TLS, AUTH); a connection silent "
        "this long while calls wait on it is replaced",
    )
    lease_ttl_s: Seconds = Field(
        default=30.0, ge=1, description="a dead replica's slots come free within this"
    )
    probe_s: Seconds = Field(default=0.5, description="how often a degraded replica retries")
    sync_s: Seconds = Field(
        default=0.1, description="how often fleet circuits are exchanged with Redis"
    )
    expected_replicas: int = Field(
        default=1, ge=1, description="the live count to assume until Redis has told one"
    )
    at_start: Literal["degraded", "fail"] = "degraded"
    when_down: WhenDownConfig = WhenDownConfig()

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return url


class LogsConfig(Strict):
    """The access log; the operator log goes to stderr at `serve --log-level`."""

    access: Literal["off", "sampled", "on"] = Field(
        default="off",
        description="one JSON line per finished request: none, every one that did not "
        "succeed and access_sample of those that did, or every one",
    )
    access_sample: float = Field(
        default=0.01, gt=0, le=1, description="sampled: the share of successes logged"
    )
    access_path: str | None = Field(
        default=None, min_length=1, description="a file the lines are appended to; default stderr"
    )


class MetricsAccessConfig(Strict):
    """Who may read `/metrics`, where, and what it shows."""

    keys: list[KeyConfig] = Field(
        default_factory=list, description="bearer tokens for /metrics; none: open to all"
    )
    host: str | None = Field(
        default=None, description="with port: /metrics only on this address, not the API's"
    )
    port: int | None = Field(default=None, ge=0, le=65535)
    tenant_labels: bool = Field(
        default=True, description="false: families labelled by tenant are left out"
    )
    cache_s: float = Field(
        default=1.0, ge=0, le=60, description="serve --workers: the merged page is reused this long"
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> MetricsAccessConfig:
        if (self.host is None) != (self.port is None):
            raise ValueError("host and port go together")
        return self


class TracingConfig(Strict):
    """OpenTelemetry spans of each request, exported over OTLP/HTTP (`sluicegate[otel]`)."""

    enabled: bool = False
    endpoint: str = Field(
        default="http://127.0.0.1:4318/v1/traces", min_length=1, description="OTLP/HTTP traces"
    )
    service_name: str = Field(default="sluicegate", min_length=1)
    sample_ratio: float = Field(
        default=1.0, ge=0, le=1, description="of new traces; a caller's sampled flag is followed"
    )


class _Checker(Strict):
    budget_s: Seconds | None = Field(
        default=None, le=60, description="as a fallback: its own budget (default the guardrail's)"
    )


class HttpCheckerConfig(_Checker):
    """Posts the text to `url` (docs/guardrails.md has the JSON contract)."""

    kind: Literal["http"]
    url: HttpUrl | None = Field(default=None, description="where the text is posted")
    headers: dict[str, str] = Field(
        default_factory=dict, description="sent with each check (e.g. authorization)"
    )

    @model_validator(mode="after")
    def _needs_url(self) -> HttpCheckerConfig:
        if self.url is None:
            raise ValueError("an http checker needs a url")
        return self


class PluginCheckerConfig(_Checker):
    """Builds the class at `path` (`module:Class`) with `options`."""

    kind: Literal["plugin"]
    path: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="module:Class"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the class"
    )

    @model_validator(mode="after")
    def _needs_path(self) -> PluginCheckerConfig:
        if self.path is None:
            raise ValueError("a plugin checker needs a path (module:Class)")
        return self


PiiKind = Literal["api_key", "email", "iban", "card", "ssn", "ip", "phone"]
"""The PII checker's kinds (`guardrails.pii_kinds.KINDS`, which a test holds equal)."""


class PiiCheckerConfig(_Checker):
    kind: Literal["pii"]
    kinds: list[PiiKind] | None = Field(default=None, min_length=1, description="default: all")
    regions: list[Annotated[str, Field(pattern=r"^[A-Z]{2}$")]] | None = Field(
        default=None,
        min_length=1,
        description="whose national phone formats are read (ISO 3166); default US GB DE FR JP IN",
    )


class TermsCheckerConfig(_Checker):
    kind: Literal["banned_terms"]
    terms: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=100_000, description="literals, matched case-insensitively"
    )
    whole_words: bool = True


InjectionFamily = Literal["override", "persona", "exfiltration", "role_markup"]
"""The injection heuristic's families (`guardrails.injection.FAMILIES`, held equal by a test)."""


class InjectionCheckerConfig(_Checker):
    kind: Literal["injection"]
    families: list[InjectionFamily] | None = Field(
        default=None, min_length=1, description="default: all"
    )


class SizeCheckerConfig(_Checker):
    kind: Literal["size"]
    max_chars: int | None = Field(default=None, ge=1)
    max_lines: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _some_limit(self) -> SizeCheckerConfig:
        if self.max_chars is None and self.max_lines is None:
            raise ValueError("a size checker needs max_chars, max_lines or both")
        return self


class ModerationCheckerConfig(_Checker):
    """An OpenAI-moderation-compatible endpoint."""

    kind: Literal["moderation"]
    url: HttpUrl = Field(description="the endpoint, e.g. https://api.openai.com/v1/moderations")
    model: str | None = Field(default=None, min_length=1)
    api_key: str | None = Field(default=None, min_length=1, description="sent as a bearer token")
    block: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, description="categories that block; default: any hit; others are audited"
    )
    thresholds: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=dict, description="category -> score from which it is hit"
    )
    timeout_s: Seconds = Field(default=5.0, le=60)


class GuardModelCheckerConfig(_Checker):
    """A guard model (Llama Guard) asked through the gateway itself."""

    kind: Literal["guard_model"]
    model: Name = Field(description="a configured model")
    lane: Name = Field(description="the lane its calls wait in")
    tenant: Name = Field(description="the configured tenant its calls are charged to")
    block: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, description="category codes or names that block; default: any unsafe"
    )
    max_tokens: int = Field(default=16, ge=1, le=256, description="a verdict is two short lines")


CheckerConfig = Annotated[
    HttpCheckerConfig
    | PluginCheckerConfig
    | PiiCheckerConfig
    | TermsCheckerConfig
    | InjectionCheckerConfig
    | SizeCheckerConfig
    | ModerationCheckerConfig
    | GuardModelCheckerConfig,
    Field(discriminator="kind"),
]
"""One checker, by its `kind` (docs/guardrails.md, docs/guardrails-checkers.md)."""


class GuardrailConfig(Strict):
    """A named check on prompts (pre_call, parallel) or answers (post_call)."""

    name: Name
    checker: CheckerConfig
    action: Literal["block", "mask", "audit"]
    placement: Literal["pre_call", "parallel", "post_call"]
    budget_s: Seconds = Field(default=0.5, le=60, description="the checker's time per check")
    on_failure: Literal["fail_open", "fail_closed"] | None = Field(
        default=None, description="on timeout or error; default: audit fails open, else closed"
    )
    fallback: CheckerConfig | None = Field(
        default=None, description="asked when the checker cannot answer"
    )
    window: int = Field(
        default=256, ge=1, le=65536, description="post_call on streams: characters held back"
    )
    cache_ttl_s: float = Field(default=60.0, ge=0, le=86_400, description="0: no cache")
    cache_size: int = Field(default=10_000, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _parallel_cannot_mask(self) -> GuardrailConfig:
        if self.placement == "parallel" and self.action == "mask":
            raise ValueError(
                "a parallel guardrail cannot mask: the request is already on its way; "
                "use pre_call to mask"
            )
        return self


class GuardrailRuleConfig(Strict):
    """Apply `guardrails` (in this order) to requests matching every filter given."""

    guardrails: list[Name] = Field(min_length=1)
    routes: list[Literal["chat", "completions", "embeddings"]] | None = None
    lanes: list[Name] | None = None
    tenants: list[Name] | None = None
    cut_streams: bool = Field(
        default=False,
        description="streams start before parallel checks pass, and are cut if one fails",
    )


class GuardrailsConfig(Strict):
    checks: list[GuardrailConfig] = Field(default_factory=list)
    apply: list[GuardrailRuleConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> GuardrailsConfig:
        _unique("guardrails.checks", [c.name for c in self.checks])
        known = {c.name for c in self.checks}
        for rule in self.apply:
            for name in rule.guardrails:
                if name not in known:
                    raise ValueError(
                        f"guardrails.apply names unknown guardrail {name!r}{_close(name, known)}"
                    )
        return self


class BudgetConfig(Strict):
    tenant: str
    model: str | None = Field(default=None, description="one model's spend; default all")
    amount: float = Field(gt=0, le=1e9, allow_inf_nan=False, description="dollars per period")
    period: Literal["daily", "monthly"] = "monthly"
    soft: float | None = Field(
        default=0.8, gt=0, lt=1, description="share of the amount past which it warns"
    )


class SpendConfig(Strict):
    """Budgets, and how spend is kept; prices are set per deployment."""

    time_zone: str = Field(default="UTC", description="an IANA zone: periods and days align to it")
    budgets: list[BudgetConfig] = Field(default_factory=list)
    flush_s: Seconds = Field(
        default=1.0, le=60, description="how often spend is written to the durable record"
    )
    when_down: Literal["fail_closed", "fail_open"] = Field(
        default="fail_closed",
        description="budgets while the shared store cannot decide: refuse (503), or admit "
        "and count the spend there once it is back",
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, zone: str) -> str:
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {zone!r} (an IANA name such as 'Europe/Paris')"
            ) from None
        return zone


class GatewayConfig(Strict):
    server: ServerConfig = ServerConfig()
    routes: RoutesConfig = RoutesConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    aggregate: QuotaConfig = QuotaConfig()
    pools: list[PoolConfig] = Field(default_factory=list)
    admin: AdminConfig = AdminConfig()
    logs: LogsConfig = LogsConfig()
    metrics: MetricsAccessConfig = MetricsAccessConfig()
    tracing: TracingConfig = TracingConfig()
    guardrails: GuardrailsConfig = GuardrailsConfig()
    jobs: JobsConfig | None = Field(
        default=None, description="durable jobs and batches; without it the gateway keeps none"
    )
    store: Literal["memory", "redis"] = Field(
        default="memory", description="where limits and shared state live"
    )
    redis: RedisConfig | None = None
    spend: SpendConfig = SpendConfig()
    models: list[ModelConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _cross_references(self) -> GatewayConfig:
        """Every reference across sections at once, one problem a line."""
        problems = list(self._problems())
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _may_ask(self, tenant: TenantConfig, lane: str) -> bool:
        """As a chat request's lane is allowed (`scheduling.lanes.classify`): the tenant's
        own, one it lists, else one of no higher priority than its own."""
        lanes = {one.name: one for one in self.scheduling.lanes}
        own = tenant.lane or self.routes.chat.lane or self.scheduling.default_lane
        own = own or self.scheduling.lanes[0].name
        if tenant.lanes is not None:
            return lane in tenant.lanes or lane == own
        return own not in lanes or lanes[lane].priority <= lanes[own].priority

    def _guard_models(self, lanes: set[str], tenants: dict[str, TenantConfig]) -> Iterator[str]:
        """A guard model's call names a model, a lane and a tenant that exist. Beside or
        after the model (parallel, post_call), the checked request holds a permit of its
        deployment's pools while its guard call waits for one: the two may share none."""
        models = {m.name: m for m in self.models}
        low = min(self.scheduling.lanes, key=lambda lane: lane.priority)
        high = max(self.scheduling.lanes, key=lambda lane: lane.priority)
        bottom = None if low is high else low.name  # as `Scheduling.bottom` and `.top` pick
        for i, check in enumerate(self.guardrails.checks):
            for where, checker in (("checker", check.checker), ("fallback", check.fallback)):
                if not isinstance(checker, GuardModelCheckerConfig):
                    continue
                at = f"guardrails.checks[{i}].{where}"
                model = models.get(checker.model)
                if model is None:
                    close = _close(checker.model, models)
                    yield f"{at}.model {checker.model!r} is not a model{close}"
                if checker.lane not in lanes:
                    yield f"{at}.lane {checker.lane!r} is not a lane{_close(checker.lane, lanes)}"
                tenant = tenants.get(checker.tenant)
                if tenant is None:
                    yield (
                        f"{at}.tenant {checker.tenant!r} is not a tenant"
                        f"{_close(checker.tenant, tenants)}"
                    )
                elif tenant.models is not None and checker.model not in tenant.models:
                    yield f"{at}.tenant {tenant.name!r} may not use the model {checker.model!r}"
                elif checker.lane in lanes and not self._may_ask(tenant, checker.lane):
                    yield f"{at}.tenant {tenant.name!r} may not ask for the lane {checker.lane!r}"
                if checker.lane == bottom:
                    yield (
                        f"{at}.lane {checker.lane!r} is the lowest-priority lane, which overload "
                        "pauses first, failing every check; give guard calls a higher lane"
                    )
                if model is not None and check.placement != "pre_call":
                    shared = sorted(_pools_of([model]) & _pools_of(self.models, but=model.name))
                    if shared:
                        yield (
                            f"{at}.model {model.name!r}: a {check.placement} guard model may share "
                            f"no pool with the models it checks (shared: {shared}); "
                            "give it its own pool or place it pre_call"
                        )

    def _problems(self) -> Iterator[str]:
        if self.store == "redis" and self.redis is None:
            yield "store 'redis' needs a redis section with its url"
        if self.scheduling.fairness_scope == "fleet" and self.store != "redis":
            yield "scheduling.fairness_scope 'fleet' needs store 'redis'"
        deployments = [d for m in self.models for d in m.deployments]
        for deployment in deployments:
            if deployment.breaker.scope == "fleet" and self.store != "redis":
                yield f"deployment {deployment.name!r}: breaker.scope 'fleet' needs store 'redis'"
        yield from _duplicates("models", [m.name for m in self.models])
        yield from _duplicates("deployments", [d.name for d in deployments])
        yield from _duplicates("tenants", [t.name for t in self.tenants])
        yield from _duplicates("pools", [p.name for p in self.pools])
        pools = {p.name for p in self.pools}
        for deployment in deployments:
            unknown_pools = sorted(set(deployment.pools) - pools)
            if unknown_pools:
                yield f"deployment {deployment.name!r} names unknown pools {unknown_pools}"
            if not deployment.pools and deployment.name in pools:
                yield f"deployment {deployment.name!r} has no pools but a pool has its name"
        lanes = {lane.name for lane in self.scheduling.lanes}
        named = [(f"tenant {t.name!r}", t.lane) for t in self.tenants]
        named += [(f"route {r}", getattr(self.routes, r).lane) for r in RoutesConfig.model_fields]
        named += [
            (f"tenant {t.name!r} lanes", lane) for t in self.tenants for lane in t.lanes or ()
        ]
        for who, lane in named:
            if lane is not None and lane not in lanes:
                yield f"{who} names unknown lane {lane!r}{_close(lane, lanes)}"
        known = {m.name for m in self.models}
        small = self.scheduling.overload.ladder.background_model
        if small is not None and small not in known:
            yield (
                f"scheduling.overload.ladder.background_model {small!r} is not a model"
                f"{_close(small, known)}"
            )
        tenants = {t.name for t in self.tenants}
        for i, rule in enumerate(self.guardrails.apply):
            for lane in rule.lanes or ():
                if lane not in lanes:
                    yield f"guardrails.apply[{i}] names unknown lane {lane!r}{_close(lane, lanes)}"
            for tenant_name in rule.tenants or ():
                if tenant_name not in tenants:
                    yield (
                        f"guardrails.apply[{i}] names unknown tenant {tenant_name!r}"
                        f"{_close(tenant_name, tenants)}"
                    )
        yield from self._guard_models(lanes, {t.name: t for t in self.tenants})
        for tenant in self.tenants:
            unknown = sorted(set(tenant.models or ()) - known)
            if unknown:
                yield f"tenant {tenant.name!r} names unknown models {unknown}"

        yield from self._budget_problems(known)

    def _budget_problems(self, models: set[str]) -> Iterator[str]:
        tenants = {t.name for t in self.tenants}
        seen: set[tuple[str, str | None, str]] = set()
        for i, budget in enumerate(self.spend.budgets):
            where = f"spend.budgets[{i}]"
            if budget.tenant not in tenants:
                close = _close(budget.tenant, tenants)
                yield f"{where} names unknown tenant {budget.tenant!r}{close}"
            if budget.model is not None and budget.model not in models:
                yield f"{where} names unknown model {budget.model!r}{_close(budget.model, models)}"
            priced = {
                m.name for m in self.models if any(d.price is not None for d in m.deployments)
            }
            if (budget.model in models and budget.model not in priced) or not priced:
                what = "its model's deployments" if budget.model else "any deployment"
                yield f"{where}: no price is set on {what}, so it would count nothing"
            key = (budget.tenant, budget.model, budget.period)
            if key in seen:
                yield f"{where}: a second {budget.period} budget for the same tenant and model"
            seen.add(key)
        if self.spend.budgets and self.store == "redis" and self.jobs is None:
            yield (
                "spend.budgets with store 'redis' need a jobs section: its database keeps the "
                "durable record the fleet's counters are rebuilt from"
            )


def _pools_of(models: Iterable[ModelConfig], but: str | None = None) -> set[str]:
    """The pools of the models' deployments (one that names none is its own)."""
    return {
        pool for m in models if m.name != but for d in m.deployments for pool in d.pools or [d.name]
    }
