"""The pass-through config keeps what routes a request and drops every limit and retry."""

from __future__ import annotations

from sluicegate.bench.stack import PASSTHROUGH_CONNECTIONS, passthrough, sim_flags

POLICY = {
    "server": {"max_body_bytes": 8192},
    "scheduling": {
        "fairness": "vtc",
        "default_lane": "chat",
        "lanes": [{"name": "chat", "priority": 10, "queue_size": 8}, {"name": "batch"}],
    },
    "aggregate": {"max_concurrency": 4},
    "routes": {"chat": {"max_concurrency": 2}},
    "pools": [{"name": "p", "max_concurrency": 2}],
    "models": [
        {
            "name": "m",
            "deployments": [
                {"name": "d", "base_url": "http://x/v1", "pools": ["p"], "metrics": {}},
            ],
        }
    ],
    "tenants": [{"name": "a", "keys": [{"env": "K"}], "lane": "chat", "limits": {"x": 1}}],
}


def test_passthrough_keeps_models_tenants_and_lane_names_only():
    one_attempt = {"retry": {"max_attempts": 1}}
    assert passthrough(POLICY) == {
        "server": {"max_body_bytes": 8192},
        "routes": {"chat": one_attempt, "completions": one_attempt, "embeddings": one_attempt},
        "models": [
            {
                "name": "m",
                "deployments": [
                    {
                        "name": "d",
                        "base_url": "http://x/v1",
                        "max_connections": PASSTHROUGH_CONNECTIONS,
                        "breaker": {"consecutive_failures": 10**9, "min_attempts": 10**9},
                    }
                ],
            }
        ],
        "tenants": [{"name": "a", "keys": [{"env": "K"}]}],
        "scheduling": {"default_lane": "chat", "lanes": [{"name": "chat"}, {"name": "batch"}]},
    }


def test_sim_flags_spell_options_as_the_simulator_reads_them():
    flags = sim_flags({"max_num_seqs": 16, "hang": False, "down": True, "slowdown": 1.5})
    assert flags == ["--max-num-seqs", "16", "--no-hang", "--down", "--slowdown", "1.5"]
