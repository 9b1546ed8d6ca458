"""Every statement of the job store, written once for SQLite and PostgreSQL alike.

Braced words (`{skip_locked}`) are the dialect's; `:name` marks a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluicegate.jobs.model import Batch, Job, StoredFile
from sluicegate.jobs.rows import columns

_LIVE = "state IN ('queued', 'running')"
_HELD = "id = :id AND lease_owner = :owner AND state = 'running'"


def _insert(table: str, names: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)})"


def insert_jobs(rows: int) -> str:
    """`rows` batch jobs in one statement, row i's parameters suffixed `_i`: batch jobs
    carry no idempotency or version key to check."""
    names = columns(Job)
    values = (f"({', '.join(f':{n}_{i}' for n in names)})" for i in range(rows))
    return f"INSERT INTO jobs ({', '.join(names)}) VALUES {', '.join(values)}"


INSERT_JOB = _insert("jobs", columns(Job)) + " ON CONFLICT DO NOTHING RETURNING id"
SELECT_JOB = "SELECT * FROM jobs WHERE tenant = :tenant AND id = :id"
SELECT_EXISTING = """SELECT * FROM jobs
WHERE tenant = :tenant AND (idempotency_key = :idempotency_key OR id = :id) LIMIT 1"""
SUPERSEDE = f"""UPDATE jobs SET state = 'superseded', updated_at = :now
WHERE tenant = :tenant AND version_key = :version_key AND {_LIVE} AND version < (
    SELECT MAX(version) FROM jobs WHERE tenant = :tenant AND version_key = :version_key)"""

_NEWEST_FIRST = "ORDER BY created_at DESC, id DESC LIMIT :limit"
LIST_JOBS = f"SELECT * FROM jobs WHERE tenant = :tenant {_NEWEST_FIRST}"
LIST_JOBS_AFTER = f"""SELECT * FROM jobs WHERE tenant = :tenant AND (created_at, id) < (
    SELECT created_at, id FROM jobs WHERE tenant = :tenant AND id = :after) {_NEWEST_FIRST}"""

_CANCEL = """UPDATE jobs SET
    state = CASE state WHEN 'queued' THEN 'cancelled' ELSE state END,
    cancel_requested = CASE state WHEN 'running' THEN 1 ELSE cancel_requested END,
    updated_at = :now
WHERE tenant = :tenant AND """
CANCEL_JOB = f"{_CANCEL} id = :id AND {_LIVE} RETURNING *"
CANCEL_BATCH_JOBS = f"{_CANCEL} batch_id = :batch_id AND {_LIVE}"

CANCEL_ABANDONED = """UPDATE jobs SET state = 'cancelled', updated_at = :now WHERE id IN (
    SELECT id FROM jobs WHERE state = 'running' AND cancel_requested = 1 AND lease_until <= :now
    {skip_locked})"""


NEXT_TENANT = f"SELECT MIN(tenant) AS tenant FROM jobs WHERE {_LIVE} AND tenant > :after"
"""The first tenant after `:after` with live jobs: one index probe, however many jobs."""


def pick(lane_filter: str) -> str:
    """Ids of one tenant's due jobs, highest priority then oldest first, locked against
    other claimers; a job this owner holds is never picked, even with its lease lapsed."""
    return f"""SELECT id FROM jobs
WHERE tenant = :tenant AND ((state = 'queued' AND (not_before IS NULL OR not_before <= :now))
    OR (state = 'running' AND cancel_requested = 0 AND lease_until <= :now
        AND lease_owner <> :owner))
  AND (deadline_at IS NULL OR deadline_at > :now) AND {lane_filter}
ORDER BY priority DESC, created_at, id LIMIT :limit {{skip_locked}}"""


def claim(id_filter: str) -> str:
    return f"""UPDATE jobs SET state = 'running', lease_owner = :owner, lease_until = :until,
    attempts = attempts + 1, updated_at = :now
WHERE {id_filter} RETURNING *"""


HEARTBEAT = f"""UPDATE jobs SET lease_until = :until
WHERE {_HELD} AND cancel_requested = 0 AND lease_until > :now RETURNING id"""
FINISH = f"""UPDATE jobs SET state = :state, result = :result, error = :error,
    lease_until = NULL, updated_at = :now
WHERE {_HELD} RETURNING tenant"""
RELEASE = f"""UPDATE jobs SET
    state = CASE cancel_requested WHEN 1 THEN 'cancelled' ELSE 'queued' END,
    lease_owner = NULL, lease_until = NULL, not_before = :not_before, error = :error,
    updated_at = :now
WHERE {_HELD} RETURNING id"""
EXPIRE = f"""UPDATE jobs SET state = 'expired', updated_at = :now WHERE id IN (
    SELECT id FROM jobs WHERE {_LIVE} AND deadline_at <= :now {{skip_locked}}) RETURNING id"""


def backlog(names: Iterable[str]) -> str:
    """Queued jobs, filtered by equality on each of `names`."""
    filters = "".join(f" AND {name} = :{name}" for name in names)
    return f"""SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM jobs
WHERE state = 'queued'{filters}"""


COUNT_STATES = "SELECT state, COUNT(*) AS n FROM jobs GROUP BY state"

_WHOLE = "size IS NOT NULL"
"""A file being written has no size yet: only whole files are seen."""
INSERT_FILE = _insert("files", columns(StoredFile))
SELECT_FILE = f"SELECT * FROM files WHERE tenant = :tenant AND id = :id AND {_WHOLE}"
HOLD_PARTIAL_FILE = "SELECT id FROM files WHERE id = :id AND size IS NULL {for_update}"
"""Locks a file being written, so that a chunk is added only while it still exists."""
INSERT_CHUNK = "INSERT INTO file_chunks (file_id, seq, data) VALUES (:id, :seq, :data)"
SHOW_FILE = """UPDATE files SET size = :size, created_at = :now
WHERE id = :id AND size IS NULL RETURNING id"""
DROP_PARTIAL_FILE = "DELETE FROM files WHERE id = :id AND size IS NULL"
SELECT_CHUNK = f"""SELECT data FROM file_chunks WHERE file_id = :id AND seq = :seq
AND EXISTS (SELECT 1 FROM files WHERE id = :id AND tenant = :tenant AND {_WHOLE})"""

INSERT_BATCH = _insert("batches", columns(Batch))
SELECT_BATCH = "SELECT * FROM batches WHERE tenant = :tenant AND id = :id"
SELECT_BATCH_FOR_UPDATE = f"{SELECT_BATCH} {{for_update}}"
UPDATE_BATCH = """UPDATE batches SET status = :status,
    total_requests = :total_requests, completed_requests = :completed_requests,
    failed_requests = :failed_requests, output_file_id = :output_file_id,
    error_file_id = :error_file_id, errors = :errors, status_at = :status_at,
    updated_at = :updated_at
WHERE id = :id AND status = :expected RETURNING id"""
_BATCH_PAGE = "ORDER BY created_at, id LIMIT :limit"
LIST_BATCH_JOBS = f"""SELECT * FROM jobs WHERE tenant = :tenant AND batch_id = :batch_id
AND state = :state {_BATCH_PAGE}"""
LIST_BATCH_JOBS_AFTER = f"""SELECT * FROM jobs WHERE tenant = :tenant AND batch_id = :batch_id
AND state = :state AND (created_at, id) > (SELECT created_at, id FROM jobs WHERE id = :after)
{_BATCH_PAGE}"""
"""A page is one ordered range of the (batch_id, state, created_at, id) index."""
BATCH_LIVE = f"SELECT 1 AS live FROM jobs WHERE batch_id = :batch_id AND {_LIVE} LIMIT 1"
"""Whether a batch has a job left to run: one probe of the (batch_id, state) index."""
BATCH_COUNTS = """SELECT state, COUNT(*) AS n FROM jobs WHERE batch_id = :batch_id
GROUP BY state"""
"""Read from the (batch_id, state) index alone: no job body or result is touched."""

_NEWEST_BATCHES = "ORDER BY created_at DESC, id DESC LIMIT :limit"
LIST_BATCHES = f"SELECT * FROM batches WHERE tenant = :tenant {_NEWEST_BATCHES}"
LIST_BATCHES_AFTER = f"""SELECT * FROM batches WHERE tenant = :tenant AND (created_at, id) < (
    SELECT created_at, id FROM batches WHERE tenant = :tenant AND id = :after) {_NEWEST_BATCHES}"""

_NEWEST_FILES = "ORDER BY created_at DESC, id DESC LIMIT :limit"
LIST_FILES = f"SELECT * FROM files WHERE tenant = :tenant AND {_WHOLE} {_NEWEST_FILES}"
LIST_FILES_AFTER = f"""SELECT * FROM files WHERE tenant = :tenant AND {_WHOLE}
AND (created_at, id) < (SELECT created_at, id FROM files WHERE tenant = :tenant AND id = :after)
{_NEWEST_FILES}"""
DELETE_FILE = f"""DELETE FROM files WHERE tenant = :tenant AND id = :id AND {_WHOLE}
RETURNING tenant, size AS n"""
"""Its chunks go with it (ON DELETE CASCADE)."""

OPEN_TENANT_BYTES = """INSERT INTO tenant_bytes (tenant, bytes) VALUES (:tenant, 0)
ON CONFLICT DO NOTHING"""
CHARGE_BYTES = """UPDATE tenant_bytes SET bytes = bytes + :n
WHERE tenant = :tenant AND bytes + :n <= :quota RETURNING bytes"""
"""Atomic under the row's lock, so concurrent charges never pass the quota together."""
ADD_BYTES = "UPDATE tenant_bytes SET bytes = bytes + :n WHERE tenant = :tenant"
TENANT_BYTES = "SELECT bytes FROM tenant_bytes WHERE tenant = :tenant"
_JOB_BYTES = "tenant, LENGTH(body) + COALESCE(LENGTH(result), 0) AS n"
"""What a deleted job gives back to its tenant's stored bytes."""

_FINAL_BATCH = "status IN ('failed', 'completed', 'expired', 'cancelled')"
_RETIRED_BATCH = f"{_FINAL_BATCH} AND updated_at < :before"
PURGE_BATCH_JOBS = f"""DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE batch_id IN (
    SELECT id FROM batches WHERE {_RETIRED_BATCH}) LIMIT :limit) RETURNING {_JOB_BYTES}"""
PURGE_BATCHES = f"""DELETE FROM batches WHERE id IN (SELECT id FROM batches
    WHERE {_RETIRED_BATCH} AND NOT EXISTS (SELECT 1 FROM jobs WHERE batch_id = batches.id)
    LIMIT :limit) RETURNING tenant, 0 AS n"""
"""A retired batch goes once its jobs are gone, so no transaction deletes more than
`:limit` jobs, however large the batch."""
PURGE_JOBS = f"""DELETE FROM jobs WHERE id IN (SELECT id FROM jobs
    WHERE batch_id IS NULL AND state NOT IN ('queued', 'running') AND updated_at < :before
    LIMIT :limit {{skip_locked}}) RETURNING {_JOB_BYTES}"""
PURGE_FILES = """DELETE FROM files WHERE id IN (SELECT id FROM files
    WHERE created_at < :before LIMIT :limit {skip_locked})
RETURNING tenant, COALESCE(size, 0) AS n"""
"""Partial files too, from when they were begun (never counted: no size yet); chunks go
with their files. Each purge answers the bytes it gives back to each row's tenant."""
