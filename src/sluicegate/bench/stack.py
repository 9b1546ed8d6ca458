"""Where a scenario's traffic goes: its own simulator and gateway, or a URL given to it.

With the policy off, the gateway runs a plain pass-through config: the scenario's own
models, deployments, tenants and lane names (so the lane header still resolves); no
limit, queue or gate of any kind; one attempt per request and circuits that never open.
The comparison then isolates what the policy does rather than what the extra hop costs.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from sluicegate.bench.procs import stack
from sluicegate.bench.scenario import Scenario, Tenant
from sluicegate.bench.traffic import Target

PASSTHROUGH_CONNECTIONS = 4096
"""Connections (and so the default pool) per deployment with the policy off: never a limit."""
_KEEP_TOP = ("server", "models", "tenants")
_KEEP_TENANT = ("name", "keys", "models")
_KEEP_DEPLOYMENT = ("name", "provider", "base_url", "model", "api_key_env", "timeouts")
_KEEP_SCHEDULING = ("lanes", "default_lane")
_KEEP_LANE = ("name",)
_ROUTES = ("chat", "completions", "embeddings")
_ONE_ATTEMPT = {"retry": {"max_attempts": 1}}
_NEVER_OPEN = {"consecutive_failures": 10**9, "min_attempts": 10**9}
"""Kept rather than removed fields, so a limit added to the config later is dropped too."""


class TargetError(RuntimeError):
    """The run cannot address its target: a missing key, or no gateway config to start."""


@contextmanager
def started(scenario: Scenario, logs: Path, serve_args: Sequence[str] = ()) -> Iterator[Target]:
    """`sluicegate sim` with the scenario's flags and a gateway (`serve SERVE_ARGS`) in
    front; stopped after, their logs kept in `logs`."""
    if scenario.gateway is None:
        raise TargetError("gateway: required unless --target is given")
    keys = {t.name: f"sk-bench-{t.name}-{secrets.token_urlsafe(12)}" for t in scenario.tenants}
    env = {t.key_env: keys[t.name] for t in scenario.tenants}
    config = scenario.gateway if scenario.policy == "on" else passthrough(scenario.gateway)
    text = yaml.safe_dump(config, sort_keys=False)
    with stack(sim_flags(scenario.sim), text, env, logs, serve_args) as (sim, gateway):

        def check() -> None:
            sim.check_alive()
            gateway.check_alive()

        yield Target(
            base_url=f"{gateway.url}/v1",
            keys=keys,
            label=f"own gateway, policy {scenario.policy}",
            metrics={"gateway": f"{gateway.url}/metrics", "sim": f"{sim.url}/metrics"},
            sim_url=sim.url,
            check=check,
            gateway_config=config,
        )


def external(scenario: Scenario, url: str, sim_url: str | None) -> Target:
    """Any OpenAI-compatible base URL; each tenant's key is read from its `key_env`."""
    base_url = url.rstrip("/")
    parts = urlsplit(base_url)
    metrics = {"target": f"{parts.scheme}://{parts.netloc}/metrics"}
    if sim_url is not None:
        sim_url = sim_url.rstrip("/")
        metrics["sim"] = f"{sim_url}/metrics"
    return Target(
        base_url=base_url,
        keys=_keys_from_env(scenario.tenants, os.environ),
        label=f"target {base_url}",
        metrics=metrics,
        sim_url=sim_url,
    )


def passthrough(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with every limit, pool, queue, gate, retry and circuit breaker left out."""
    kept = _kept(config, _KEEP_TOP)
    kept["routes"] = dict.fromkeys(_ROUTES, _ONE_ATTEMPT)
    if "scheduling" in config:
        scheduling = _kept(config["scheduling"], _KEEP_SCHEDULING)
        lanes = scheduling.get("lanes") or ()
        kept["scheduling"] = {**scheduling, "lanes": [_kept(lane, _KEEP_LANE) for lane in lanes]}
    kept["tenants"] = [_kept(tenant, _KEEP_TENANT) for tenant in config.get("tenants") or ()]
    kept["models"] = [
        {**model, "deployments": [_open_deployment(d) for d in model.get("deployments") or ()]}
        for model in config.get("models") or ()
    ]
    return kept


def sim_flags(options: Mapping[str, str | int | float | bool]) -> list[str]:
    """`{max_num_seqs: 16, hang: false}` -> `--max-num-seqs 16 --no-hang`."""
    flags: list[str] = []
    for name, value in options.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", str(value)]
    return flags


def _open_deployment(deployment: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **_kept(deployment, _KEEP_DEPLOYMENT),
        "max_connections": PASSTHROUGH_CONNECTIONS,
        "breaker": _NEVER_OPEN,
    }


def _kept(mapping: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: mapping[name] for name in names if name in mapping}


def _keys_from_env(tenants: list[Tenant], env: Mapping[str, str]) -> dict[str, str]:
    unset = [
        f"tenants[{index}].key_env: {tenant.key_env} is not set"
        for index, tenant in enumerate(tenants)
        if not env.get(tenant.key_env)
    ]
    if unset:
        raise TargetError("; ".join(unset))
    return {tenant.name: env[tenant.key_env] for tenant in tenants}
