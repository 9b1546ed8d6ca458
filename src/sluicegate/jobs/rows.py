"""Values to and from table rows: the one place that knows how a field is stored.

Columns are named as the fields. Enums are stored as their values, JSON as text and
flags as integers, which both databases give back alike.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import orjson

from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Batch, BatchStatus, Job, JobState, StoredFile
from sluicegate.jobs.sql import Row


def columns(cls: type[Job | StoredFile | Batch]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _json(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def _values(value: Job | StoredFile | Batch) -> Row:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def job_row(job: Job) -> Row:
    return _values(job) | {
        "kind": job.kind.value,
        "state": job.state.value,
        "cancel_requested": int(job.cancel_requested),
        "error": json_text(job.error),
    }


def job_from_row(row: Row) -> Job:
    return Job(
        **row
        | {
            "kind": Endpoint(row["kind"]),
            "state": JobState(row["state"]),
            "cancel_requested": bool(row["cancel_requested"]),
            "error": _json(row["error"]),
        }
    )


def file_row(file: StoredFile) -> Row:
    """The row a file is begun with: no size, which hides it, until it is whole."""
    return _values(file) | {"size": None}


def file_from_row(row: Row) -> StoredFile:
    return StoredFile(**row)


def batch_row(batch: Batch) -> Row:
    return _values(batch) | {
        "status": batch.status.value,
        "metadata": json_text(batch.metadata),
        "errors": json_text(batch.errors),
        "status_at": json_text(batch.status_at),
    }


def batch_from_row(row: Row) -> Batch:
    return Batch(
        **row
        | {
            "status": BatchStatus(row["status"]),
            "metadata": _json(row["metadata"]),
            "errors": _json(row["errors"]),
            "status_at": _json(row["status_at"]),
        }
    )
