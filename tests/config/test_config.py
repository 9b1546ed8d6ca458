"""One bad config per error; each message must name the field and the reason."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sluicegate.config import ConfigError, load_settings
from sluicegate.config.loader import parse_settings
from sluicegate.core.types import Endpoint, Mechanism

ENV = {"ALICE_KEY": "sk-alice", "SIM_URL": "http://127.0.0.1:9/v1"}


def base() -> dict:
    return {
        "models": [
            {
                "name": "chat",
                "deployments": [{"name": "sim-a", "base_url": "${SIM_URL}", "model": "sim-model"}],
            }
        ],
        "tenants": [{"name": "alice", "keys": [{"env": "ALICE_KEY"}]}],
    }


def parse(raw: dict, env: dict[str, str] | None = None):
    return parse_settings(raw, "test.yaml", ENV if env is None else env)


def test_valid_config_builds_the_runtime_snapshot():
    raw = base()
    raw["tenants"].append(
        {
            "name": "bob",
            "keys": [{"sha256": hashlib.sha256(b"sk-bob").hexdigest()}],
            "models": ["chat"],
        }
    )
    settings = parse(raw)
    deployment = settings.models["chat"].deployments[0]
    assert deployment.base_url == "http://127.0.0.1:9/v1"
    assert deployment.upstream_model == "sim-model"
    assert settings.keys[hashlib.sha256(b"sk-alice").digest()].name == "alice"
    bob = settings.keys[hashlib.sha256(b"sk-bob").digest()]
    assert bob.may_use("chat")
    assert not bob.may_use("other")


def test_interpolation_default_and_typed_values():
    raw = base()
    raw["server"] = {"port": "${PORT:-8123}", "host": "${HOST:-0.0.0.0}"}
    settings = parse(raw)
    assert settings.port == 8123
    assert settings.host == "0.0.0.0"
    assert parse(raw, {**ENV, "PORT": "9000"}).port == 9000


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c.pop("models"), "models: Field required"),
        (
            lambda c: c["models"][0]["deployments"][0].update(base_url="not a url"),
            "models[0].deployments[0].base_url",
        ),
        (
            lambda c: c["models"][0]["deployments"][0].update(provider="grpc"),
            "models[0].deployments[0].provider",
        ),
        (
            lambda c: c["models"][0]["deployments"][0].update(timeouts={"read_s": -1}),
            "models[0].deployments[0].timeouts.read_s: Input should be greater than 0",
        ),
        (
            lambda c: c["models"][0]["deployments"][0].update(timeouts={"output_token_s": -1}),
            "models[0].deployments[0].timeouts.output_token_s: Input should be greater than",
        ),
        (
            lambda c: c["models"][0]["deployments"][0].update(max_cooldown_s=float("inf")),
            "models[0].deployments[0].max_cooldown_s: Input should be a finite number",
        ),
        (
            lambda c: c["models"][0]["deployments"][0].update(max_response_bytes=10),
            "models[0].deployments[0].max_response_bytes: Input should be greater than",
        ),
        (
            lambda c: c["models"][0]["deployments"][0].update(provider="anthropic", resumable=True),
            "'resumable' needs an OpenAI-compatible server",
        ),
        (lambda c: c["models"][0].update(deployments=[]), "models[0].deployments"),
        (lambda c: c["models"][0].update(colour="red"), "models[0].colour: Extra inputs"),
        (lambda c: c["tenants"][0]["keys"][0].update(sha256="abc"), "tenants[0].keys[0]"),
        (lambda c: c["tenants"][0].update(models=["nope"]), "unknown models ['nope']"),
        (
            lambda c: c["tenants"][0].update(lanes=["vip"]),
            "tenant 'alice' lanes names unknown lane",
        ),
        (lambda c: c["models"].append(c["models"][0]), "duplicate name 'chat' in models"),
        (lambda c: c.update(server={"port": "many"}), "server.port"),
        (
            lambda c: c.update(scheduling={"disable": ["shedding"]}),
            "scheduling.disable[0]: Input should be 'prefill_budget', 'predictor'",
        ),
        (lambda c: c.update(store="redis"), "store 'redis' needs a redis section with its url"),
        (lambda c: c.update(store="etcd"), "store: Input should be 'memory' or 'redis'"),
        (
            lambda c: c.update(store="redis", redis={"url": "http://127.0.0.1:6379"}),
            "redis.url: must start with redis://, rediss:// or unix://",
        ),
        (
            lambda c: c.update(redis={"url": "redis://h", "when_down": {"rates": "guess"}}),
            "redis.when_down.rates: Input should be 'local_share', 'fail_closed' or 'fail_open'",
        ),
        (lambda c: c.update(redis={"url": "redis://h", "timeout_s": 0}), "redis.timeout_s"),
        (
            lambda c: c["models"][0]["deployments"][0].update(breaker={"scope": "fleet"}),
            "deployment 'sim-a': breaker.scope 'fleet' needs store 'redis'",
        ),
    ],
)
def test_each_bad_field_is_named(mutate, expected):
    raw = base()
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert expected in str(info.value)
    assert "test.yaml" in str(info.value)


def test_a_redis_store_reads_its_url_from_the_environment_with_credentials_and_tls():
    raw = {**base(), "store": "redis", "redis": {"url": "${REDIS_URL}", "key_prefix": "gw:"}}
    settings = parse(raw, {**ENV, "REDIS_URL": "rediss://gateway:secret@cache.internal:6380/2"})
    assert settings.redis is not None
    assert settings.redis.url == "rediss://gateway:secret@cache.internal:6380/2"
    assert "secret" not in repr(settings.redis)
    assert settings.redis.when_down.concurrency == "local_share"
    assert parse(base()).redis is None


def test_missing_environment_variable_names_the_field():
    with pytest.raises(ConfigError, match=r"models\[0\]\.deployments\[0\]\.base_url: .*SIM_URL"):
        parse(base(), {"ALICE_KEY": "sk-alice"})


def test_missing_key_variable_names_the_tenant_key():
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.keys\[0\]\.env: .*ALICE_KEY"):
        parse(base(), {"SIM_URL": "http://127.0.0.1:9/v1"})


def test_missing_upstream_key_variable_names_the_deployment():
    raw = base()
    raw["models"][0]["deployments"][0]["api_key_env"] = "UPSTREAM_KEY"
    with pytest.raises(ConfigError, match=r"api_key_env \(deployment 'sim-a'\): .*UPSTREAM_KEY"):
        parse(raw)


def test_one_key_for_two_tenants_is_refused():
    raw = base()
    raw["tenants"].append({"name": "mallory", "keys": [{"env": "ALICE_KEY"}]})
    with pytest.raises(ConfigError, match=r"tenants\[1\]\.keys\[0\]: the same key"):
        parse(raw)


def test_unreadable_and_malformed_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.yaml", ENV)
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(broken, ENV)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_settings(scalar, ENV)


def test_serve_stops_with_a_clear_message_and_no_traceback(tmp_path: Path):
    raw = base()
    raw["models"][0]["deployments"][0]["timeouts"] = {"total_s": "soon"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"ALICE_KEY": "k", "SIM_URL": "http://x/v1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "models[0].deployments[0].timeouts.total_s" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_mechanisms_switched_off_reach_the_scheduling_settings():
    raw = base()
    raw["scheduling"] = {"disable": ["predictor", "turnover"]}
    assert parse(raw).scheduling.disabled == {Mechanism.PREDICTOR, Mechanism.TURNOVER}
    assert parse(base()).scheduling.disabled == frozenset()


def error_of(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse(raw)
    return str(info.value)


def test_an_unknown_key_close_to_a_known_one_gets_a_did_you_mean():
    raw = base()
    raw["scheduling"] = {"lanes": [{"name": "interactive", "ttft_slo": 2}]}
    message = error_of(raw)
    assert "scheduling.lanes[0].ttft_slo" in message
    assert "did you mean 'ttft_slo_s'?" in message


def test_an_unknown_key_far_from_any_names_the_valid_ones():
    raw = base()
    raw["tenants"][0]["keys"] = [{"key": "sk-team-a"}]
    message = error_of(raw)
    assert "tenants[0].keys[0].key" in message
    assert "valid keys here: sha256, env" in message


def test_a_tenant_key_in_the_wrong_shape_names_the_valid_forms():
    raw = base()
    raw["tenants"][0]["keys"] = ["sk-team-a"]
    message = error_of(raw)
    assert "tenants[0].keys[0]" in message
    assert "{sha256: ...} or {env: ...}" in message


def test_a_message_limit_belongs_to_the_chat_route_alone():
    assert parse(base()).routes[Endpoint.CHAT].max_messages == 4096
    raw = base()
    raw["routes"] = {"embeddings": {"max_messages": 10}}
    with pytest.raises(ConfigError, match=r"routes\.embeddings\.max_messages"):
        parse(raw)


def test_a_routes_longest_deadline_is_its_default_unless_raised():
    assert parse(base()).routes[Endpoint.CHAT].max_timeout_s == 600
    raw = base()
    raw["routes"] = {"chat": {"default_timeout_s": 60, "max_timeout_s": 3600}}
    assert parse(raw).routes[Endpoint.CHAT].max_timeout_s == 3600
    raw["routes"] = {"completions": {"default_timeout_s": 60, "max_timeout_s": 30}}
    with pytest.raises(ConfigError, match=r"routes\.completions.*max_timeout_s must be at least"):
        parse(raw)


def test_the_documented_example_key_hash_is_the_hash_of_the_key_it_names():
    """The example hash in docs/configuration.md must teach a random key, and name it,
    so a reader can check the command that makes one."""
    readme = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    found = re.search(
        r"sha256: ([0-9a-f]{64})\s+#\s+\(the sha256 of the example key (sk-\S+)\)", readme
    )
    assert found is not None
    digest, key = found.groups()
    assert hashlib.sha256(key.encode()).hexdigest() == digest
    assert len(key) >= 32
