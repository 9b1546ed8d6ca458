"""Library mode on the memory store: the grant, the caller's fallback, failures counted
against the deployment, and refusals raised before the block runs. No backend is
needed: the caller makes (here, pretends to make) the call itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluicegate import GatewayError, Governor


def write(tmp_path: Path, **tenant_limits) -> Path:
    def deployment(name: str) -> dict:
        return {
            "name": name,
            "base_url": f"http://{name}.invalid/v1",
            "model": f"{name}-model",
            "api_key_env": "KEY",
            "breaker": {"consecutive_failures": 1},
        }

    config = {
        "models": [
            {
                "name": "chat",
                "strategy": "fallback",
                "deployments": [deployment("a"), deployment("b")],
            }
        ],
        "tenants": [{"name": "t", "keys": [{"env": "KEY"}], "limits": tenant_limits}],
    }
    path = tmp_path / "library.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def governor(tmp_path: Path, **tenant_limits) -> Governor:
    return Governor.from_config(write(tmp_path, **tenant_limits), {"KEY": "sk-key"})


async def test_the_grant_names_the_deployment_and_what_is_left(tmp_path):
    async with governor(tmp_path) as g:
        async with g.attempt(model="chat", tenant="t", prompt_tokens=10, max_tokens=5) as grant:
            assert (grant.deployment, grant.base_url) == ("a", "http://a.invalid/v1")
            assert (grant.upstream_model, grant.api_key) == ("a-model", "sk-key")
            assert grant.tried == {"a"}
            assert grant.left == ("b",)
            grant.report(10, 5)
        async with g.attempt(
            model="chat", tenant="t", prompt_tokens=10, max_tokens=5, avoid=grant.tried
        ) as second:
            assert second.deployment == "b"
            assert second.tried == {"a", "b"}
            assert second.left == ()


async def test_library_mode_needs_no_tenant_key_variables(tmp_path):
    """Library mode never checks a caller's key, so a tenant's key variable may be unset;
    a deployment's own key variable is still read."""
    path = write(tmp_path)
    text = path.read_text().replace("- env: KEY", "- env: TENANT_KEY_NOT_SET")
    path.write_text(text)
    g = Governor.from_config(path, {"KEY": "sk-key"})
    async with g, g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1) as grant:
        assert grant.api_key == "sk-key"
        grant.report(1, 1)


async def test_an_exception_in_the_block_is_the_deployments_failure(tmp_path):
    async with governor(tmp_path) as g:
        with pytest.raises(ConnectionError):
            async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1):
                raise ConnectionError("the provider hung up")
        # a's circuit opened after its one allowed failure: the chain skips it
        async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1) as grant:
            assert grant.deployment == "b"


async def test_a_refusal_is_raised_before_the_block(tmp_path):
    async with governor(tmp_path, max_concurrency=1) as g:
        async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1):
            with pytest.raises(GatewayError) as refused:
                async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1):
                    raise AssertionError("the block must not run")
            assert refused.value.code == "tenant_concurrency_limited"
            assert refused.value.status == 429
        async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1):
            pass  # the slot came back when the first attempt ended


async def test_an_unknown_tenant_or_model_is_refused(tmp_path):
    async with governor(tmp_path) as g:
        with pytest.raises(GatewayError) as unknown:
            async with g.attempt(model="chat", tenant="nobody", prompt_tokens=1, max_tokens=1):
                pass
        assert unknown.value.code == "tenant_not_found"
        with pytest.raises(GatewayError) as missing:
            async with g.attempt(model="nope", tenant="t", prompt_tokens=1, max_tokens=1):
                pass
        assert missing.value.code == "model_not_found"


async def test_attempts_need_the_governor_entered(tmp_path):
    with pytest.raises(RuntimeError, match="async with"):
        async with governor(tmp_path).attempt(
            model="chat", tenant="t", prompt_tokens=1, max_tokens=1
        ):
            pass


async def test_a_reported_throttle_cools_the_pool_for_every_caller(tmp_path):
    path = write(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["pools"] = [{"name": "p", "max_concurrency": 8}]
    for deployment in config["models"][0]["deployments"]:
        deployment["pools"] = ["p"]
        del deployment["breaker"]  # the default's circuit stays closed after one failure
    path.write_text(yaml.safe_dump(config))
    async with Governor.from_config(path, {"KEY": "sk-key"}) as g:
        async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1) as grant:
            grant.throttled(retry_after_s=30)
        with pytest.raises(GatewayError) as cooling:
            async with g.attempt(model="chat", tenant="t", prompt_tokens=1, max_tokens=1):
                raise AssertionError("the block must not run")
        assert cooling.value.code == "pool_cooling_down"
        assert 25 < cooling.value.retry_after_s <= 30


async def test_a_library_caller_spends_what_it_reports_and_its_budget_holds(tmp_path):
    path = write(tmp_path)
    config = yaml.safe_load(path.read_text())
    for deployment in config["models"][0]["deployments"]:
        deployment["price"] = {"input": 1000, "cached_input": 500, "output": 2000}
    config["spend"] = {"budgets": [{"tenant": "t", "amount": 0.05, "period": "daily"}]}
    path.write_text(yaml.safe_dump(config))
    async with Governor.from_config(path, {"KEY": "sk-key"}) as g:
        # Reserves 10 in and 10 out at $0.001 and $0.002 a token: $0.03.
        async with g.attempt(model="chat", tenant="t", prompt_tokens=10, max_tokens=10) as grant:
            grant.report(10, 2, cached_tokens=4)
        spend = g._runtime.pipeline.spend
        assert (
            spend.book.view({})["tenants"]["t"]["chat"]["nanos"]
            == 6_000_000 + 2_000_000 + 4_000_000
        )
        with pytest.raises(GatewayError) as refused:
            async with g.attempt(model="chat", tenant="t", prompt_tokens=10, max_tokens=20):
                pass
        assert refused.value.code == "budget_exceeded"
