"""The `jobs:` section: defaults, and one bad value per error, named by its field."""

from __future__ import annotations

import pytest

from sluicegate.config import ConfigError
from sluicegate.core.types import JobPolicy
from tests.config.test_config import base, parse


def with_jobs(**jobs) -> dict:
    return base() | {"jobs": jobs}


def test_an_empty_jobs_section_keeps_jobs_in_sqlite_with_the_documented_defaults():
    policy = parse(with_jobs()).jobs
    assert policy == JobPolicy()
    assert (policy.store, policy.sqlite_path, policy.workers) == ("sqlite", "sluicegate-jobs.db", 8)
    assert (policy.handoff_full, policy.max_attempts, policy.recheck_auth) == ("wait", 5, True)


def test_without_a_jobs_section_the_gateway_keeps_no_jobs():
    assert not parse(base()).jobs.enabled
    assert parse(with_jobs()).jobs.enabled


def test_storage_and_each_tenants_backlog_are_bounded_by_default():
    policy = parse(base()).jobs
    assert (policy.tenant_backlog_max, policy.backlog_max) == (50_000, 100_000)
    assert (policy.retention_s, policy.tenant_storage_max_bytes) == (30 * 86_400.0, 1024**3)
    assert (policy.store_timeout_s, policy.statement_timeout_s) == (5.0, 30.0)
    unbounded = parse(with_jobs(retention_s=None, tenant_storage_max_bytes=None)).jobs
    assert (unbounded.retention_s, unbounded.tenant_storage_max_bytes) == (None, None)


def test_the_postgres_dsn_stays_out_of_the_policy_repr():
    dsn = "postgresql://app:s3cret@db/jobs"
    policy = parse(with_jobs(store="postgres", postgres_dsn=dsn)).jobs
    assert policy.postgres_dsn == dsn
    assert "s3cret" not in repr(policy)


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ({"store": "postgres"}, "jobs: store 'postgres' needs postgres_dsn"),
        ({"heartbeat_s": 30}, "jobs: heartbeat_s must be shorter than lease_s"),
        ({"handoff_full": "drop"}, "jobs.handoff_full: Input should be 'wait' or 'reject'"),
        ({"workers": 0}, "jobs.workers: Input should be greater than or equal to 1"),
        ({"postgres_schema": "Jobs"}, "jobs.postgres_schema: String should match pattern"),
        ({"backlog": 10}, "jobs.backlog: Extra inputs are not permitted"),
        ({"retention_s": 0}, "jobs.retention_s: Input should be greater than 0"),
        ({"tenant_storage_max_bytes": 10}, "jobs.tenant_storage_max_bytes: Input should be"),
        ({"statement_timeout_s": -1}, "jobs.statement_timeout_s: Input should be greater than 0"),
        ({"store_timeout_s": 0}, "jobs.store_timeout_s: Input should be greater than 0"),
    ],
)
def test_each_bad_jobs_field_is_named(jobs, expected):
    with pytest.raises(ConfigError) as info:
        parse(with_jobs(**jobs))
    assert expected in str(info.value)
