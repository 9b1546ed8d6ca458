"""The hand-off queue between the claimer and the workers, under each full-queue policy."""

from __future__ import annotations

import asyncio

from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Job
from sluicegate.worker import Handoff


def job() -> Job:
    return Job(tenant="alice", kind=Endpoint.CHAT, body=b"{}", lane="batch")


async def test_wait_claims_only_what_fits_and_waits_for_room():
    handoff = Handoff(2, "wait")
    assert handoff.wanted() == 2
    assert handoff.offer(job())
    assert handoff.wanted() == 1
    assert handoff.offer(job())
    assert handoff.wanted() == 0
    room = asyncio.ensure_future(handoff.room())
    await asyncio.sleep(0)
    assert not room.done()
    await handoff.take()
    await asyncio.wait_for(room, 1)
    assert handoff.wanted() == 1


async def test_reject_claims_a_queues_worth_and_refuses_what_does_not_fit():
    handoff = Handoff(2, "reject")
    offered = [handoff.offer(job()) for _ in range(3)]
    assert offered == [True, True, False]
    assert handoff.wanted() == 2


async def test_closing_ends_the_wait_for_room_and_drain_returns_the_queued_jobs():
    handoff = Handoff(1, "wait")
    queued = job()
    handoff.offer(queued)
    room = asyncio.ensure_future(handoff.room())
    await asyncio.sleep(0)
    handoff.close()
    await asyncio.wait_for(room, 1)
    assert handoff.drain() == [queued]
    assert handoff.drain() == []
