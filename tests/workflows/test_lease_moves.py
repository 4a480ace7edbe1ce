"""How a waiting session asks and a lost one moves, on the real dev server (the Cluster of lease_cluster.py): a live
session asks steadily while a render asks ever less often, and a render asked to yield whose node died as its chunk
finished moves as lost, not as a yield; the slot a render gives up is handed to the session it yielded to. Read from
the workflows' histories and the fake node's dispatches, never from a clock."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from monologue import contracts as c
from tests.workflows.lease_cluster import DEADLINE_S, Cluster, Handle, has_call, holds, lost_beside_a_render, until
from workflows.render import RenderWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_waiting_live_session_asks_steadily_and_a_render_ever_less_often(env: WorkflowEnvironment) -> None:
    """No render may yield: a waiting live session asks with its lease, then every `preempt_after_s` (it must start
    within seconds; before LIVE_ASKS_STEADILY_PATCH it asked at 1, 3 and 7 s), a render below its tenant's share twice
    as long apart each time (its wait may be long, its history stays short). Read from the workflows' timers, not
    from a clock. (A session whose node was lost asks as a live one does: the next test.)"""
    cluster = Cluster(env, chunk_s=0.5)
    cluster.refuse_asks = True
    async with cluster.workers():
        await cluster.start("big", tenant="big")
        await until(lambda: has_call(cluster.fake.calls, "N1"), "big's render to be under way")
        live = await cluster.start("live", kind=c.SessionKind.LIVE, tenant="b", preempt_after_s=0.2)
        small = await cluster.start("small", tenant="small", preempt_after_s=0.2)
        await until(lambda: _timers_at_least(live, 5), "the live session to wait through five timers")
        await until(lambda: _timers_at_least(small, 4), "small's render to wait through four timers")
        assert (await _timers_s(live))[:5] == [0.2] * 5
        assert (await _timers_s(small))[:4] == [0.2, 0.4, 0.8, 1.6]
        # The first ask goes out with the lease, before any timer (ASK_AT_ONCE_PATCH; the policy asks nobody while a
        # slot is free): a second sooner than after the first `preempt_after_s`.
        for handle in (live, small):
            assert (await _waits(handle))[:3] == [c.HOLD_NODE, c.ASK_TO_YIELD, "timer"]
        assert {ask[1] for ask in cluster.asks} == {c.AskReason.LIVE, c.AskReason.FAIR_SHARE}
        for name in ("big", "live", "small"):
            with contextlib.suppress(RPCError):  # big's render may have ended by itself, and the others then
                await cluster.end(name)


async def test_a_session_whose_node_was_lost_asks_steadily(env: WorkflowEnvironment) -> None:
    """Both slots taken (one by the lost session's dead lease, as a killed node's slot is gone), no render may yield:
    the lost session asks every `preempt_after_s`, as a live one does (before LOST_ASKS_STEADILY_PATCH at 1, 3 and 7
    s: one whose first asked render could not yield waited 8 s more in the contention bench)."""
    cluster = Cluster(env, chunk_s=0.5, slots=2)
    cluster.refuse_asks = True
    async with cluster.workers():
        lost = await cluster.start("lost", lease_timeout_s=2.0, preempt_after_s=0.2)
        await until(lambda: _took_lease(cluster, "lost", 1), "the first session to hold a slot")
        await cluster.start("other", tenant="b")
        await until(lambda: _took_lease(cluster, "other", 1), "the render to hold the other slot")
        cluster.dead.add(("lost", 1))
        await until(lambda: _asked_as(cluster, "lost", c.AskReason.NODE_LOST), "the lost session to ask")
        await until(lambda: _timers_at_least(lost, 4), "the lost session to wait through its timers")
        assert (await _timers_s(lost))[:4] == [0.2] * 4  # its first lease's timer, then one per ask
        for name in ("lost", "other"):
            with contextlib.suppress(RPCError):
                await cluster.end(name)
        cluster.released.add("lost")


async def _asked_as(cluster: Cluster, name: str, why: c.AskReason) -> bool:
    return any(ask[:2] == (name, why) for ask in cluster.asks)


async def _timers_s(handle: Handle) -> list[float]:
    history = await handle.fetch_history()
    return [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        for event in history.events
        if event.HasField("timer_started_event_attributes")
    ]


async def _waits(handle: Handle) -> list[str]:
    """The lease, the asks and the timers in the order the workflow started them (its other activities left out)."""
    history = await handle.fetch_history()
    started: list[str] = []
    for event in history.events:
        if event.HasField("timer_started_event_attributes"):
            started.append("timer")
        elif event.HasField("activity_task_scheduled_event_attributes"):
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            started += [name] if name in (c.HOLD_NODE, c.ASK_TO_YIELD) else []
    return started


async def _timers_at_least(handle: Handle, count: int) -> bool:
    return len(await _timers_s(handle)) >= count


async def test_a_render_asked_to_yield_whose_node_died_meanwhile_moves_as_lost(env: WorkflowEnvironment) -> None:
    """Its workflow hears at once that a chunk finished and that the lease ended (its task was on the dead node, so
    the history grew meanwhile): the render moves as a lost session (queued as moving), and records no yield.
    Before LOST_NOT_YIELDED_PATCH it gave the dead node's slot "up" and queued as `yielded`, behind every moving
    session (a render of the contention bench waited 62 s so)."""
    cluster = Cluster(env, chunk_s=1.0, slots=2)
    async with cluster.workers(with_workflows=False):
        async with cluster.workflow_worker():
            render = await cluster.start("render", lease_timeout_s=2.0)
            await until(lambda: has_call(cluster.fake.calls, "N1"), "the render to be under way")
            cluster.fake.hold_chunks.set()  # no chunk boundary comes before the workflow worker has stopped
            await render.signal(c.YIELD_SLOT, c.YieldSlot(for_session="live", as_moving=True))
            await until(lambda: _handled_signal(render), "the ask to be heard")
        cluster.dead.add(("render", 1))  # its node dies while no workflow runs: both land in its history
        cluster.fake.hold_chunks.clear()
        await until(lambda: _historyhas_call(render, "activity_task_timed_out_event_attributes"), "the lease to end")
        await until(lambda: _chunk_completed_after_signal(render), "a chunk to finish")
        async with cluster.workflow_worker():
            await until(lambda: _took_lease(cluster, "render", 2), "the render to take a new lease")
            progress = await render.query(RenderWorkflow.progress)
            assert (progress.preemptions, progress.node_changes, progress.queue_class) == (0, 1, c.QueueClass.MOVING)
            assert cluster.yielded == []
            with contextlib.suppress(RPCError):
                await cluster.end("render")
        cluster.released.add("render")


async def _events(handle: Handle) -> list[Any]:
    return list((await handle.fetch_history()).events)


async def _historyhas_call(handle: Handle, field: str) -> bool:
    return any(event.HasField(field) for event in await _events(handle))


async def _handled_signal(handle: Handle) -> bool:
    """A workflow task completed after the signal came."""
    events = await _events(handle)
    signalled = [i for i, e in enumerate(events) if e.HasField("workflow_execution_signaled_event_attributes")]
    return bool(signalled) and any(
        e.HasField("workflow_task_completed_event_attributes") for e in events[signalled[0] :]
    )


async def _chunk_completed_after_signal(handle: Handle) -> bool:
    events = await _events(handle)
    signalled = next(i for i, e in enumerate(events) if e.HasField("workflow_execution_signaled_event_attributes"))
    return any(e.HasField("activity_task_completed_event_attributes") for e in events[signalled:])


async def _took_lease(cluster: Cluster, name: str, count: int) -> bool:
    return cluster.dispatched.count(name) >= count


async def test_the_slot_a_render_gives_up_is_handed_to_its_asker_not_to_a_session_queued_before_it(
    env: WorkflowEnvironment,
) -> None:
    """Two slots, both held, and a session resumed elsewhere (moving: it asks nobody) waiting for one. The first
    session's node is killed: it queues as moving too, behind the resumed one, and asks; the render yields, and its
    slot is handed to the session it yielded to, on the node's own lease queue. The shared queue's matcher would
    have given it to the resumed session, first in their class and tenant (as before HANDOFF_PATCH)."""
    cluster = Cluster(env, chunk_s=0.5, slots=2)
    async with cluster.workers():
        lost, render = await lost_beside_a_render(cluster)
        moved = await cluster.start("moved", resume=c.ResumePoint(cursor=2, frames=97))
        await until(lambda: cluster.waiting_for_a_node(moved), "the resumed session's lease to be queued")
        cluster.dead.add(("lost", 1))
        await until(lambda: holds(cluster, "lost"), "the lost session to get the render's slot")
        assert cluster.asked == ["render"] and cluster.handed == ["lost"]
        assert await cluster.waiting_for_a_node(moved) and await cluster.waiting_for_a_node(render)
        for handle in (lost, moved, render):  # each freed slot goes round: lost ends, then moved, then render
            await asyncio.wait_for(handle.result(), DEADLINE_S)
        cluster.released.add("lost")  # the dead lease's activity ends with the test
    assert cluster.dispatched == ["lost", "render", "lost", "moved", "render"]


async def test_a_slot_freed_elsewhere_first_is_taken_and_the_handed_lease_given_up(env: WorkflowEnvironment) -> None:
    """The handed lease waits beside the shared one: here the node the ask names never frees a slot (it does not
    even poll), another session ends, and the lost session takes that slot from the shared queue at once; its handed
    lease is cancelled."""
    cluster = Cluster(env, chunk_s=0.5, slots=2)
    cluster.hand_to = "n-silent"
    handed_queue = c.handed_lease_task_queue("n-silent")
    async with cluster.workers():
        lost, _ = await lost_beside_a_render(cluster)
        cluster.dead.add(("lost", 1))
        await until(lambda: _lease_scheduled_on(lost, handed_queue), "the handed lease to be scheduled")
        await cluster.end("render")  # its slot frees for the shared queue
        await until(lambda: holds(cluster, "lost"), "the lost session to take the freed slot")
        await asyncio.wait_for(lost.result(), DEADLINE_S)
        cluster.released.add("lost")  # the dead lease's activity ends with the test
    assert cluster.dispatched == ["lost", "render", "lost"] and cluster.handed == []
    history = await lost.fetch_history()
    [handed] = [event.event_id for event in history.events if _lease_queue(event) == handed_queue]
    cancelled = [event.activity_task_cancel_requested_event_attributes.scheduled_event_id for event in history.events]
    assert handed in cancelled


async def _lease_scheduled_on(handle: Handle, queue: str) -> bool:
    history = await handle.fetch_history()
    return any(_lease_queue(event) == queue for event in history.events)


def _lease_queue(event: Any) -> str | None:
    """The task queue of a scheduled lease (None: another event)."""
    scheduled = event.activity_task_scheduled_event_attributes
    return str(scheduled.task_queue.name) if scheduled.activity_type.name == c.HOLD_NODE else None
