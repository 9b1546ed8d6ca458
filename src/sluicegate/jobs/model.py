"""Jobs, files and batches as plain values: what the store keeps, with no database in it.

Times are unix seconds: jobs outlive processes, so a monotonic clock would not do.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sluicegate.core.types import Endpoint


class JobState(enum.Enum):
    """The value is both the stored form and the metric label."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset(JobState) - {JobState.QUEUED, JobState.RUNNING}


class BatchStatus(enum.Enum):
    """OpenAI's batch statuses, spelled as its API spells them."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in _FINAL_BATCH_STATUSES


_FINAL_BATCH_STATUSES = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


def _new_id(prefix: str) -> Callable[[], str]:
    return lambda: prefix + uuid.uuid4().hex


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One request accepted for later; `body` is its JSON exactly as the caller sent it.

    A job with a `version_key` is superseded by a later one of the same tenant and key
    with a higher `version`. `lease_owner` holds a running job until `lease_until`; a
    queued job is not handed out before `not_before`. `created_at` and `updated_at` are
    stamped by the store. Payloads stay out of the repr, and so out of logs.
    """

    tenant: str
    kind: Endpoint
    body: bytes = field(repr=False)
    lane: str
    priority: int = 0
    deadline_at: float | None = None
    idempotency_key: str | None = None
    version_key: str | None = None
    version: int | None = None
    batch_id: str | None = None
    custom_id: str | None = None
    request_id: str | None = None
    """The id of the request that submitted it; its runs go upstream and into the logs
    under it."""
    id: str = field(default_factory=_new_id("job_"))
    state: JobState = JobState.QUEUED
    attempts: int = 0
    lease_owner: str | None = None
    lease_until: float | None = None
    not_before: float | None = None
    cancel_requested: bool = False
    result: bytes | None = field(default=None, repr=False)
    error: dict[str, Any] | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    def __post_init__(self) -> None:
        if (self.version_key is None) != (self.version is None):
            raise ValueError("version_key and version go together")


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredFile:
    """An uploaded or generated file (batch input, output or errors), without its content,
    which the store keeps as chunks and hands out a chunk at a time; `size` and
    `created_at` are stamped by the store once the file is whole."""

    tenant: str
    purpose: str
    filename: str
    id: str = field(default_factory=_new_id("file-"))
    size: int = 0
    created_at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """An OpenAI batch; its requests are jobs carrying its id.

    `status_at` records when the batch entered each status (OpenAI's `*_at` fields).
    `created_at` and `updated_at` are stamped by the store.
    """

    tenant: str
    input_file_id: str
    endpoint: str
    completion_window: str
    id: str = field(default_factory=_new_id("batch_"))
    status: BatchStatus = BatchStatus.VALIDATING
    total_requests: int = 0
    completed_requests: int = 0
    failed_requests: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    expires_at: float | None = None
    status_at: dict[str, float] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0


class Purged(NamedTuple):
    """What one retention pass deleted."""

    jobs: int
    batches: int
    files: int


class Backlog(NamedTuple):
    """Queued jobs and how long the oldest has waited (0 when none is queued)."""

    size: int
    oldest_age_s: float
