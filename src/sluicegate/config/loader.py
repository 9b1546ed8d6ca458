"""Read a config file into the frozen runtime `Settings`, or fail with a message per field."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sluicegate.config.problems import across, described, path
from sluicegate.config.schema import (
    ChatRouteConfig,
    CheckerConfig,
    DeploymentConfig,
    GatewayConfig,
    GuardrailsConfig,
    JobsConfig,
    KeyConfig,
    OverloadConfig,
    PoolConfig,
    PriceConfig,
    QuotaConfig,
    RedisConfig,
    RouteConfig,
    SchedulingConfig,
    SpendConfig,
)
from sluicegate.core.guarding import (
    Action,
    CheckerSpec,
    GuardrailPolicy,
    GuardrailRule,
    GuardrailSpec,
    OnFailure,
    Placement,
    default_failure,
)
from sluicegate.core.limits import Rate
from sluicegate.core.types import (
    AdaptiveLimit,
    BackendMetrics,
    BreakerPolicy,
    Budget,
    DegradedPolicy,
    Deployment,
    EdgeLimits,
    Endpoint,
    JobPolicy,
    Ladder,
    Lane,
    LogPolicy,
    MetricsPolicy,
    Model,
    OverloadPolicy,
    Period,
    PoolSpec,
    PrefixAffinity,
    Price,
    Quota,
    RedisPolicy,
    RetryPolicy,
    RoutePolicy,
    Scheduling,
    Settings,
    SpendPolicy,
    Tenant,
    Timeouts,
    TracingPolicy,
    WhenDown,
)
from sluicegate.spend.prices import NANOS

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A config problem, worded for the operator: each line names the field and the reason."""


def load_settings(
    path: Path | str, env: Mapping[str, str] | None = None, *, callers_keys: bool = True
) -> Settings:
    """The config at `path`, `${VAR}` read from `env`. Without `callers_keys` (library
    mode, which never authenticates a caller) the tenants' and admins' keys are left
    out, so their environment variables need not be set."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    return parse_settings(raw, source, os.environ if env is None else env, callers_keys)


def parse_settings(
    raw: object, source: str, env: Mapping[str, str], callers_keys: bool = True
) -> Settings:
    """The settings `raw` describes, or a `ConfigError` naming every problem at once:
    each field in a wrong shape, each variable not set, and each reference across
    sections whose fields parsed."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    unset: dict[tuple[Any, ...], str] = {}
    expanded = _interpolate(raw, env, (), unset)
    problems = [f"{path(at)}: environment variable {name} is not set" for at, name in unset.items()]
    try:
        config = GatewayConfig.model_validate(expanded)
    except ValidationError as exc:
        problems += [line for loc, line in described(exc) if loc not in unset]
        problems += across(expanded, exc)
        raise ConfigError(_report(source, problems)) from None
    settings = _to_settings(config, env, callers_keys, problems)
    if problems:
        raise ConfigError(_report(source, problems))
    return settings


def _report(source: str, problems: list[str]) -> str:
    """One problem on one line; several as a list under the file's name."""
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return "\n".join([f"{source}: invalid configuration", *(f"  {p}" for p in problems)])


def _interpolate(
    value: Any, env: Mapping[str, str], at: tuple[Any, ...], unset: dict[tuple[Any, ...], str]
) -> Any:
    """Expand `${VAR}` and `${VAR:-default}` in string values (not in the YAML text); a
    variable not set is noted in `unset` and its reference left as written."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env, (*at, k), unset) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, (*at, i), unset) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        unset[at] = name
        return match.group(0)

    expanded = _VAR.sub(substitute, value)
    if expanded != value and _VAR.fullmatch(value) and _looks_numeric(expanded):
        return yaml.safe_load(expanded)
    return expanded


def _looks_numeric(text: str) -> bool:
    return re.fullmatch(r"-?\d+(\.\d+)?|true|false", text) is not None


def _cache_salt(tenant: str) -> str:
    """A tenant's cache salt: the same on every replica, so that its prompts find their
    cache wherever they went. A caller cannot send one of its own (the pipeline drops
    it), so knowing another tenant's salt lets it probe nothing."""
    return hashlib.sha256(f"sluicegate cache salt\n{tenant}".encode()).hexdigest()[:32]


def _to_settings(
    config: GatewayConfig, env: Mapping[str, str], callers_keys: bool, problems: list[str]
) -> Settings:
    """The runtime settings; a key or secret that cannot be read is added to `problems`."""
    models = {
        m.name: Model(
            m.name,
            tuple(
                _deployment(d, m.name, env, (f"models[{i}].deployments[{j}]", problems))
                for j, d in enumerate(m.deployments)
            ),
            m.strategy,
            PrefixAffinity(**m.prefix_affinity.model_dump()),
        )
        for i, m in enumerate(config.models)
    }
    tenants: list[Tenant] = []
    keys: dict[bytes, Tenant] = {}
    for t_index, spec in enumerate(config.tenants):
        tenant = Tenant(
            spec.name,
            None if spec.models is None else frozenset(spec.models),
            _quota(spec.limits),
            spec.limits.max_prompt_tokens,
            spec.weight,
            spec.lane,
            None if spec.lanes is None else frozenset(spec.lanes),
            _cache_salt(spec.name) if spec.isolate_cache else None,
        )
        tenants.append(tenant)
        for k_index, key in enumerate(spec.keys if callers_keys else ()):
            where = f"tenants[{t_index}].keys[{k_index}]"
            digest = _key_digest(key, env, (where, problems))
            if digest is None:
                continue
            if digest in keys:
                problems.append(f"{where}: the same key is already given to another tenant")
            keys[digest] = tenant
    return Settings(
        host=config.server.host,
        port=config.server.port,
        max_body_bytes=config.server.max_body_bytes,
        models=models,
        tenants=tuple(tenants),
        keys=keys,
        routes={e: _route(getattr(config.routes, e.value)) for e in Endpoint},
        aggregate=_quota(config.aggregate),
        pools=_pools(config),
        scheduling=_scheduling(config.scheduling, config.store),
        admin_keys=frozenset(
            digest
            for i, key in enumerate(config.admin.keys if callers_keys else ())
            if (digest := _key_digest(key, env, (f"admin.keys[{i}]", problems))) is not None
        ),
        jobs=_jobs(config.jobs),
        redis=_redis(config.redis) if config.store == "redis" else None,
        edge=EdgeLimits(**config.server.model_dump(exclude={"host", "port", "max_body_bytes"})),
        logs=LogPolicy(**config.logs.model_dump()),
        metrics=MetricsPolicy(
            frozenset(
                digest
                for i, key in enumerate(config.metrics.keys)
                if (digest := _key_digest(key, env, (f"metrics.keys[{i}]", problems))) is not None
            ),
            None if config.metrics.port is None else (config.metrics.host, config.metrics.port),
            config.metrics.tenant_labels,
            config.metrics.cache_s,
        ),
        tracing=TracingPolicy(**config.tracing.model_dump()),
        guardrails=_guardrails(config.guardrails),
        spend=_spend(config.spend),
    )


def _guardrails(spec: GuardrailsConfig) -> GuardrailPolicy:
    """The guardrails section, its version a digest of the section as parsed."""
    checks = {
        c.name: GuardrailSpec(
            c.name,
            _checker(c.checker, c.budget_s),
            Action(c.action),
            Placement(c.placement),
            default_failure(Action(c.action)) if c.on_failure is None else OnFailure(c.on_failure),
            None if c.fallback is None else _checker(c.fallback, c.budget_s),
            c.window,
            c.cache_ttl_s,
            c.cache_size,
        )
        for c in spec.checks
    }
    rules = tuple(
        GuardrailRule(
            tuple(r.guardrails),
            None if r.routes is None else frozenset(r.routes),
            None if r.lanes is None else frozenset(r.lanes),
            None if r.tenants is None else frozenset(r.tenants),
            r.cut_streams,
        )
        for r in spec.apply
    )
    version = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16]
    return GuardrailPolicy(checks, rules, version)


def _checker(spec: CheckerConfig, budget_s: float) -> CheckerSpec:
    settings = spec.model_dump(mode="json", exclude={"kind", "budget_s"})
    return CheckerSpec(spec.kind, settings, spec.budget_s or budget_s)


def _jobs(spec: JobsConfig | None) -> JobPolicy:
    """Without a `jobs:` section the gateway keeps no jobs, and no database."""
    if spec is None:
        return JobPolicy(**JobsConfig().model_dump(), enabled=False)
    return JobPolicy(**spec.model_dump())


def _redis(spec: RedisConfig | None) -> RedisPolicy:
    assert spec is not None, "config validation requires it"
    down = spec.when_down
    return RedisPolicy(
        url=spec.url,
        key_prefix=spec.key_prefix,
        timeout_s=spec.timeout_s,
        connect_timeout_s=spec.connect_timeout_s,
        lease_ttl_s=spec.lease_ttl_s,
        sync_s=spec.sync_s,
        at_start=spec.at_start,
        when_down=DegradedPolicy(
            WhenDown(down.concurrency), WhenDown(down.rates), spec.probe_s, spec.expected_replicas
        ),
    )


def _per_minute(limit: float | None) -> Rate | None:
    return None if limit is None else Rate(limit=limit, period_s=60.0, burst=limit)


def _quota(spec: QuotaConfig) -> Quota:
    return Quota(
        spec.max_concurrency,
        _per_minute(spec.requests_per_minute),
        _per_minute(spec.tokens_per_minute),
    )


def _route(spec: RouteConfig) -> RoutePolicy:
    return RoutePolicy(
        max_concurrency=spec.max_concurrency,
        default_timeout_s=spec.default_timeout_s,
        max_timeout_s=spec.max_timeout_s or spec.default_timeout_s,
        min_attempt_s=spec.min_attempt_s,
        max_output_tokens=spec.max_output_tokens,
        max_prompt_tokens=spec.max_prompt_tokens,
        lane=spec.lane,
        retry=RetryPolicy(**spec.retry.model_dump()),
        hedge_after_s=spec.hedge_after_s,
        reasoning_effort=spec.reasoning_effort,
        first_byte_s=spec.first_byte_s,
        max_messages=spec.max_messages if isinstance(spec, ChatRouteConfig) else None,
    )


def _scheduling(spec: SchedulingConfig, store: str) -> Scheduling:
    lanes = tuple(Lane(**lane.model_dump()) for lane in spec.lanes)
    return Scheduling(
        lanes=lanes,
        default_lane=spec.default_lane or lanes[0].name,
        fairness=spec.fairness,
        fairness_scope=spec.fairness_scope or ("fleet" if store == "redis" else "local"),
        input_weight=spec.input_weight,
        output_weight=spec.output_weight,
        cost_alpha=spec.cost_alpha,
        cost_beta=spec.cost_beta,
        cost_gamma=spec.cost_gamma,
        reserve=spec.reserve,
        overload=_overload(spec.overload),
        disabled=frozenset(spec.disable),
    )


def _overload(spec: OverloadConfig) -> OverloadPolicy:
    fields = spec.model_dump(exclude={"ladder"})
    return OverloadPolicy(**fields, ladder=Ladder(**spec.ladder.model_dump()))


def _backend_metrics(spec: DeploymentConfig, base_url: str) -> BackendMetrics | None:
    m = spec.metrics
    if m is None:
        return None
    url = str(m.url) if m.url is not None else base_url.removesuffix("/v1") + "/metrics"
    return BackendMetrics(url, m.interval_s, m.stale_after_s, m.on_stale, m.max_num_seqs)


def _adaptive(spec: DeploymentConfig) -> AdaptiveLimit | None:
    a = spec.adaptive
    if a is None:
        return None
    return AdaptiveLimit(a.initial, a.minimum, a.maximum, a.latency_target_s, a.decrease)


def _pools(config: GatewayConfig) -> dict[str, PoolSpec]:
    """Declared pools, plus one per deployment that names none (its connection limit)."""
    pools = {p.name: _pool(p) for p in config.pools}
    for model in config.models:
        for d in model.deployments:
            if not d.pools:
                pools[d.name] = PoolSpec(d.name, d.max_connections)
    return pools


def _pool(spec: PoolConfig) -> PoolSpec:
    return PoolSpec(
        spec.name,
        spec.max_concurrency,
        _per_minute(spec.requests_per_minute),
        _per_minute(spec.tokens_per_minute),
    )


Problems = tuple[str, list[str]]
"""Where in the config a part is, and the list its problems go to."""


def _deployment(
    spec: DeploymentConfig, model: str, env: Mapping[str, str], report: Problems
) -> Deployment:
    api_key = None
    if spec.api_key_env is not None:
        api_key = env.get(spec.api_key_env) or None
        if api_key is None:
            where, problems = report
            problems.append(
                f"{where}.api_key_env (deployment {spec.name!r}): "
                f"environment variable {spec.api_key_env} is not set"
            )
    t = spec.timeouts
    base_url = str(spec.base_url).rstrip("/")
    return Deployment(
        name=spec.name,
        provider=spec.provider,
        base_url=base_url,
        upstream_model=spec.model or model,
        api_key=api_key,
        timeouts=Timeouts(t.connect_s, t.read_s, t.total_s, t.first_byte_s, t.output_token_s),
        max_connections=spec.max_connections,
        pools=tuple(spec.pools) or (spec.name,),
        cancel_grace_s=spec.cancel_grace_s,
        idle_connection_s=spec.idle_connection_s,
        metrics=_backend_metrics(spec, base_url),
        adaptive=_adaptive(spec),
        pass_priority=spec.pass_priority,
        pass_cache_salt=spec.pass_cache_salt,
        resumable=spec.resumable,
        breaker=BreakerPolicy(**spec.breaker.model_dump()),
        throttle_cooldown_s=spec.throttle_cooldown_s,
        max_cooldown_s=spec.max_cooldown_s,
        max_response_bytes=spec.max_response_bytes,
        context_window=spec.context_window,
        price=_price(spec.price),
    )


def _price(spec: PriceConfig | None) -> Price | None:
    if spec is None:
        return None
    cached = spec.input if spec.cached_input is None else spec.cached_input
    return Price(spec.input, cached, spec.output, spec.batch_discount)


def _spend(spec: SpendConfig) -> SpendPolicy:
    budgets = tuple(
        Budget(b.tenant, round(b.amount * NANOS), Period(b.period), b.model, b.soft)
        for b in spec.budgets
    )
    return SpendPolicy(budgets, spec.time_zone, spec.flush_s, WhenDown(spec.when_down))


def _key_digest(key: KeyConfig, env: Mapping[str, str], report: Problems) -> bytes | None:
    """The key's hash; None, with the problem reported, when its variable is not set."""
    if key.sha256 is not None:
        return bytes.fromhex(key.sha256)
    assert key.env is not None
    value = env.get(key.env)
    if not value:
        where, problems = report
        problems.append(f"{where}.env: environment variable {key.env} is not set")
        return None
    return hashlib.sha256(value.encode()).digest()
