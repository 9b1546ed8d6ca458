"""The tables, as one list of migrations that both databases apply on open.

DDL names the types `{blob}`, `{real}` and `{bigint}`, which each dialect fills in. A
migration, once released, is never edited: a change is a new version at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.jobs.sql import Database


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        (
            """CREATE TABLE jobs (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                kind TEXT NOT NULL,
                body {blob} NOT NULL,
                lane TEXT NOT NULL,
                priority INTEGER NOT NULL,
                deadline_at {real},
                idempotency_key TEXT,
                version_key TEXT,
                version {bigint},
                batch_id TEXT,
                custom_id TEXT,
                state TEXT NOT NULL,
                attempts INTEGER NOT NULL,
                lease_owner TEXT,
                lease_until {real},
                not_before {real},
                cancel_requested INTEGER NOT NULL,
                result {blob},
                error TEXT,
                created_at {real} NOT NULL,
                updated_at {real} NOT NULL,
                UNIQUE (tenant, idempotency_key)
            )""",
            """CREATE INDEX jobs_live ON jobs (priority DESC, created_at, id)
                WHERE state IN ('queued', 'running')""",
            "CREATE INDEX jobs_deadline ON jobs (deadline_at) WHERE state IN ('queued', 'running')",
            "CREATE INDEX jobs_tenant ON jobs (tenant, created_at, id)",
            "CREATE INDEX jobs_version ON jobs (tenant, version_key, version)",
            "CREATE INDEX jobs_batch ON jobs (batch_id, created_at, id)",
            "CREATE INDEX jobs_state ON jobs (state)",
            """CREATE TABLE files (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                purpose TEXT NOT NULL,
                filename TEXT NOT NULL,
                content {blob} NOT NULL,
                created_at {real} NOT NULL
            )""",
            """CREATE TABLE batches (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                input_file_id TEXT NOT NULL,
                endpoint TEXT NOT NULL,
                completion_window TEXT NOT NULL,
                status TEXT NOT NULL,
                total_requests INTEGER NOT NULL,
                completed_requests INTEGER NOT NULL,
                failed_requests INTEGER NOT NULL,
                output_file_id TEXT,
                error_file_id TEXT,
                metadata TEXT,
                errors TEXT,
                expires_at {real},
                status_at TEXT NOT NULL,
                created_at {real} NOT NULL,
                updated_at {real} NOT NULL
            )""",
        ),
    ),
    Migration(
        2,
        (
            """CREATE INDEX jobs_claim ON jobs (tenant, priority DESC, created_at, id)
                WHERE state IN ('queued', 'running')""",
            "CREATE INDEX jobs_batch_state ON jobs (batch_id, state)",
            """CREATE INDEX jobs_retired ON jobs (updated_at)
                WHERE batch_id IS NULL AND state NOT IN ('queued', 'running')""",
            "CREATE INDEX batches_tenant ON batches (tenant, created_at, id)",
            """CREATE INDEX batches_retired ON batches (updated_at)
                WHERE status IN ('failed', 'completed', 'expired', 'cancelled')""",
            "CREATE INDEX files_tenant ON files (tenant, created_at, id)",
            "CREATE INDEX files_created ON files (created_at)",
        ),
    ),
    Migration(
        3,
        (
            """CREATE TABLE file_chunks (
                file_id TEXT NOT NULL REFERENCES files (id) ON DELETE CASCADE,
                seq INTEGER NOT NULL,
                data {blob} NOT NULL,
                PRIMARY KEY (file_id, seq)
            )""",
            "ALTER TABLE files ADD COLUMN size {bigint}",
            "UPDATE files SET size = LENGTH(content)",
            """WITH RECURSIVE parts (file_id, seq, total) AS (
                SELECT id, 0, LENGTH(content) FROM files WHERE LENGTH(content) > 0
                UNION ALL
                SELECT file_id, seq + 1, total FROM parts WHERE (seq + 1) * 1048576 < total
            )
            INSERT INTO file_chunks (file_id, seq, data)
            SELECT parts.file_id, parts.seq,
                SUBSTR(files.content, parts.seq * 1048576 + 1, 1048576)
            FROM parts JOIN files ON files.id = parts.file_id""",
            "ALTER TABLE files DROP COLUMN content",
            "DROP INDEX jobs_batch",
            "DROP INDEX jobs_batch_state",
            "CREATE INDEX jobs_batch_by_state ON jobs (batch_id, state, created_at, id)",
        ),
    ),
    Migration(
        4,
        (
            """CREATE TABLE tenant_bytes (
                tenant TEXT PRIMARY KEY,
                bytes {bigint} NOT NULL
            )""",
            """INSERT INTO tenant_bytes (tenant, bytes)
            SELECT tenant, SUM(n) FROM (
                SELECT tenant, COALESCE(size, 0) AS n FROM files
                UNION ALL
                SELECT tenant, LENGTH(body) + COALESCE(LENGTH(result), 0) AS n FROM jobs
            ) AS stored GROUP BY tenant""",
        ),
    ),
    Migration(5, ("ALTER TABLE jobs ADD COLUMN request_id TEXT",)),
    Migration(
        6,
        (
            """CREATE TABLE spend (
                tenant TEXT NOT NULL,
                model TEXT NOT NULL,
                day TEXT NOT NULL,
                nanos {bigint} NOT NULL,
                estimated_nanos {bigint} NOT NULL,
                prompt_tokens {bigint} NOT NULL,
                cached_tokens {bigint} NOT NULL,
                output_tokens {bigint} NOT NULL,
                attempts {bigint} NOT NULL,
                PRIMARY KEY (tenant, model, day)
            )""",
            "CREATE INDEX spend_day ON spend (day)",
        ),
    ),
)
"""Version 3 keeps a file's content as 1 MiB chunks, `file_chunks` keyed by (file, seq),
moving each stored file's content there; `files.size` is NULL while a file is written.
A batch's jobs are read a state at a time, in order, from one index that also serves
the counts, the live probe, cancels and retention, in place of `jobs_batch` and
`jobs_batch_state`. Version 4 keeps each tenant's stored bytes (whole files, job bodies
and results) as one counter, `tenant_bytes`, counted from what is stored: a quota check
reads one row, however much the tenant keeps. Version 5 keeps the id of the request that
submitted each job. Version 6 keeps spend per tenant, model and day (`jobs/spend.py`),
added to in batches."""

_CREATE_VERSIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    applied_at {real} NOT NULL
)"""


async def migrate(
    db: Database,
    now: float,
    setup: Sequence[str] = (),
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """Apply the `migrations` `db` lacks, in one transaction; the versions applied.

    `setup` runs first, under the same lock, so replicas starting together neither race
    nor apply a migration twice. Only a test of an upgrade passes fewer `migrations`.
    """
    async with db.write() as session:
        await session.lock("sluicegate.jobs.migrate")
        for statement in (*setup, _CREATE_VERSIONS):
            await session.fetch(statement)
        rows = await session.fetch("SELECT version FROM schema_migrations")
        done = {row["version"] for row in rows}
        pending = [m for m in migrations if m.version not in done]
        for migration in pending:
            for statement in migration.statements:
                await session.fetch(statement)
            await session.fetch(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (:version, :now)",
                {"version": migration.version, "now": now},
            )
        return [m.version for m in pending]
