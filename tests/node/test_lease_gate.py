"""A node without room for a session's files takes no lease (issue 28, item 4): its lease worker reserves no slot (so
it does not poll), a lease already polled for is refused with NodeDiskFull, and /readyz says why; once room is back
the node takes leases again."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.lease import NodeLease
from cli.stack import temporal_binary
from monologue import contracts as c
from node.http_port import NodeHealth
from node.lease_gate import LeaseSlots, lease_tuner

SHORT = "scratch /x: 12 KiB free, under min_free_scratch_mb (64 MiB)"


class Room:
    """What the node's disks say: `reason` is None while there is room."""

    reason: str | None = None

    def __call__(self) -> str | None:
        return self.reason


async def test_no_slot_is_reserved_while_the_disk_is_short_and_one_is_once_room_is_back() -> None:
    room = Room()
    slots = LeaseSlots(capacity=2, shortage=room, recheck_s=0.01)
    ctx: Any = None
    first = await slots.reserve_slot(ctx)
    room.reason = SHORT
    assert slots.try_reserve_slot(ctx) is None
    waiting = asyncio.create_task(slots.reserve_slot(ctx))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    room.reason = None
    assert await asyncio.wait_for(waiting, timeout=5) is not None
    assert slots.try_reserve_slot(ctx) is None  # capacity 2: both taken
    slots.release_slot(ctx)
    assert slots.try_reserve_slot(ctx) is not None and first is not None


async def test_a_released_slot_wakes_a_waiting_reservation_at_once() -> None:
    slots = LeaseSlots(capacity=1, shortage=Room(), recheck_s=60.0)
    ctx: Any = None
    await slots.reserve_slot(ctx)
    waiting = asyncio.create_task(slots.reserve_slot(ctx))
    await asyncio.sleep(0.05)
    slots.release_slot(ctx)
    assert await asyncio.wait_for(waiting, timeout=5) is not None


async def test_a_lease_polled_for_before_the_disk_filled_is_refused_with_node_disk_full() -> None:
    room = Room()
    room.reason = SHORT
    lease = NodeLease(client=None, node_id="n1", shortage=room)  # type: ignore[arg-type]  (refused before any call)
    request = c.HoldNodeInput(session_id="s", workflow_id="w", lease=1, heartbeat_s=1.0)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(lease.hold_node, request)
    assert (refused.value.type, refused.value.non_retryable) == (c.NODE_DISK_FULL, True)
    assert refused.value.message == f"node n1 takes no session: {SHORT}"
    assert lease.held_sessions() == []


async def test_a_handed_lease_claims_the_next_freed_slot_ahead_of_the_shared_queue() -> None:
    """A render gave its slot up for a session that waits on this node's handed lease queue: the slot freed is the
    claim's, though the shared queue's poller asked for one first; the poller gets the next."""
    slots = LeaseSlots(capacity=1, shortage=Room(), recheck_s=60.0)
    ctx: Any = None
    await slots.reserve_slot(ctx)  # the render's lease
    poll = asyncio.create_task(slots.reserve_slot(ctx))
    claim = asyncio.create_task(slots.claim(timeout_s=30.0))
    await asyncio.sleep(0.05)
    slots.release_slot(ctx)  # the render yields
    assert await asyncio.wait_for(claim, timeout=5) is True
    await asyncio.sleep(0.05)
    assert not poll.done()
    slots.unclaim()  # the handed session ends
    assert await asyncio.wait_for(poll, timeout=5) is not None


async def test_a_claim_that_no_slot_frees_gives_up_and_leaves_nothing_held() -> None:
    slots = LeaseSlots(capacity=1, shortage=Room(), recheck_s=0.01)
    ctx: Any = None
    await slots.reserve_slot(ctx)
    assert await slots.claim(timeout_s=0.05) is False
    cancelled = asyncio.create_task(slots.claim(timeout_s=30.0))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    slots.release_slot(ctx)
    assert slots.try_reserve_slot(ctx) is not None  # no claim is left ahead of the shared queue


async def test_a_handed_lease_with_no_slot_freed_in_time_is_refused_with_no_slot_handed() -> None:
    slots = LeaseSlots(capacity=1, shortage=Room(), recheck_s=0.01)
    ctx: Any = None
    await slots.reserve_slot(ctx)
    lease = NodeLease(client=None, node_id="n1", slots=slots)  # type: ignore[arg-type]  (refused before any call)
    request = c.HoldNodeInput(session_id="s", workflow_id="w", lease=1, heartbeat_s=0.02, handed_wait_s=0.1)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(lease.hold_node, request)
    assert refused.value.type == c.NO_SLOT_HANDED and not refused.value.non_retryable
    assert lease.held_sessions() == []
    # A slot claimed by a lease whose node began draining while it waited goes back.
    waiting = dataclasses.replace(request, handed_wait_s=30.0)
    held = asyncio.create_task(ActivityEnvironment().run(lease.hold_node, waiting))
    await asyncio.sleep(0.1)
    lease.draining.set()
    slots.release_slot(ctx)
    with pytest.raises(ApplicationError) as drained:
        await asyncio.wait_for(held, timeout=5)
    assert drained.value.type == c.NODE_DRAINING
    assert slots.try_reserve_slot(ctx) is not None


def test_readiness_names_the_shortage() -> None:
    room = Room()
    health = NodeHealth(capacity=1, polling=True, temporal_ok=True, database_ok=True, shortage=room)
    assert health.report()[0] is True
    room.reason = SHORT
    ready, body = health.report()
    assert not ready and body["status"] == "not ready"
    assert body["checks"] == {"polling": True, "temporal": True, "database": True, "disk": False, "gpu": True}
    assert body["problems"] == {"disk": SHORT}


@workflow.defn(sandboxed=False)
class OneLease:
    """Schedules one lease task on the queue it is given and returns who took it."""

    @workflow.run
    async def run(self, queue: str) -> str:
        return await workflow.execute_activity(
            c.HOLD_NODE, queue, task_queue=queue, start_to_close_timeout=timedelta(seconds=30), result_type=str
        )


async def test_a_short_node_polls_no_lease_until_room_is_back() -> None:
    """Through Temporal's dev server: a lease task waits in the queue, untouched, while the node is short of room
    (its worker reserves no slot, so it does not poll), and the node takes it once room is back."""
    room, taken = Room(), asyncio.Event()
    room.reason = SHORT

    @activity.defn(name=c.HOLD_NODE)
    async def hold_node(queue: str) -> str:
        taken.set()
        return "n1"

    queue = f"leases-{uuid.uuid4().hex}"
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary())
    async with (
        env,
        Worker(env.client, task_queue=f"{queue}-wf", workflows=[OneLease]),
        Worker(env.client, task_queue=queue, activities=[hold_node], tuner=lease_tuner(LeaseSlots(1, room))),
    ):
        handle = await env.client.start_workflow(OneLease.run, queue, id=queue, task_queue=f"{queue}-wf")
        with pytest.raises(TimeoutError):  # a long poll would have taken it within milliseconds
            await asyncio.wait_for(taken.wait(), timeout=3)
        room.reason = None
        assert await asyncio.wait_for(handle.result(), timeout=30) == "n1"
