from __future__ import annotations

import pytest

from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import FINAL_STATES, Job, JobState


def test_only_queued_and_running_are_unfinished():
    assert set(JobState) - FINAL_STATES == {JobState.QUEUED, JobState.RUNNING}
    assert not any(s.final for s in (JobState.QUEUED, JobState.RUNNING))


def test_a_version_key_needs_a_version():
    with pytest.raises(ValueError, match="together"):
        Job(tenant="t", kind=Endpoint.CHAT, body=b"{}", lane="batch", version_key="doc")


def test_payloads_stay_out_of_the_repr():
    job = Job(tenant="t", kind=Endpoint.CHAT, body=b"secret prompt", lane="batch")
    assert job.id.startswith("job_")
    assert "secret" not in repr(job)
