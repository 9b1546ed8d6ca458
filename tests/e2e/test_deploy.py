"""Every metric deploy/'s Grafana dashboard and alert rules read exists on a live
`/metrics`: a server of two workers on Redis, so the fleet's and the workers' families
are there too."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.names import dashboard_queries, names_in, rule_exprs
from tests.e2e.test_workers import ENV, wait_all_answering, write_config
from tests.support.processes import start
from tests.support.redis import redis_or_skip

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported(page: str) -> set[str]:
    """The names a query may use: each family's samples, present or not yet."""
    names = set()
    for family in text_string_to_metric_families(page):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


async def test_every_metric_the_dashboard_and_the_rules_read_is_exported(sim, http, tmp_path):
    async with redis_or_skip() as (_, prefix):
        path = write_config(tmp_path, sim, prefix, {"max_concurrency": 4})
        proc = start("serve", ["--config", str(path), "--workers", "2"], tmp_path, env=ENV)
        try:
            await wait_all_answering(http, proc)
            async with http.get(f"{proc.url}/metrics") as resp:
                page = await resp.text()
        finally:
            proc.stop()
    names = exported(page)
    wanted = names_in(dashboard_queries())
    assert len(wanted) >= 20, wanted
    assert wanted - names == set(), "the dashboard reads metrics nobody exports"
    assert names_in(rule_exprs()) - names == set(), "the alert rules read metrics nobody exports"
