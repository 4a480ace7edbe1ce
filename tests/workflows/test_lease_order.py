"""Who gets a node first, on the real dev server's matcher (started with `cli.stack.matcher_flags()`): RenderWorkflow
schedules its lease with a priority (its QueueClass) and its tenant as fairness key, and Temporal dispatches the
lease queue in that order. The fake cluster is `lease_cluster.py`'s; the lease queue has one slot unless a test says
otherwise. Order is asserted, never timing."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from monologue import contracts as c
from tests.workflows.lease_cluster import (
    DEADLINE_S,
    Cluster,
    Handle,
    has_call,
    holds,
    lost_beside_a_render,
    queue_up,
    until,
)
from workflows.render import RenderWorkflow
from workflows.shared import LONG, SHORT

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_slot_goes_to_live_then_moving_then_renders_by_priority_and_tenant(env: WorkflowEnvironment) -> None:
    cluster = Cluster(env)
    moved = c.ResumePoint(cursor=2, frames=97)  # under way already: resumed after its node was lost
    sessions: list[tuple[str, dict[str, Any]]] = [
        ("a1", {}),
        ("a2", {}),
        ("a3", {}),
        ("a4", {}),
        ("low", {"priority": c.RenderPriority.LOW, "tenant": "b"}),
        ("b1", {"tenant": "b"}),
        ("b2", {"tenant": "b"}),
        ("high", {"priority": c.RenderPriority.HIGH}),
        ("moved", {"resume": moved}),
        ("live", {"kind": c.SessionKind.LIVE, "tenant": "b"}),
    ]
    async with cluster.workers(with_lease=False):
        await queue_up(cluster, sessions)
    async with cluster.workers():
        order = await cluster.dispatch_all(len(sessions))
    assert order[:3] == ["live", "moved", "high"]
    assert order[-1] == "low"
    normal = order[3:-1]
    assert sorted(normal) == ["a1", "a2", "a3", "a4", "b1", "b2"]
    # Tenant b's two renders do not wait behind tenant a's four: with equal weights the tenants alternate.
    assert max(normal.index("b1"), normal.index("b2")) <= 3, normal
    assert [name for name in normal if name.startswith("a")] == ["a1", "a2", "a3", "a4"]  # FIFO within a tenant


async def test_dispatches_between_two_tenants_follow_their_weights(env: WorkflowEnvironment) -> None:
    cluster = Cluster(env)
    sessions = [(f"a{i}", {"tenant": "a", "fairness_weight": 1.0}) for i in range(8)]
    sessions += [(f"b{i}", {"tenant": "b", "fairness_weight": 3.0}) for i in range(8)]
    async with cluster.workers(with_lease=False):
        await queue_up(cluster, sessions)
    async with cluster.workers():
        order = await cluster.dispatch_all(8)
    # While both wait, b (weight 3) gets three slots to a's one: 6 of the first 8, within one either way.
    assert 5 <= sum(name.startswith("b") for name in order) <= 7, order


async def test_a_waiting_live_session_takes_a_renders_slot_at_a_chunk_boundary(env: WorkflowEnvironment) -> None:
    cluster = Cluster(env, chunk_s=0.5)  # the render is still under way when the live session comes
    async with cluster.workers():
        render = await cluster.start("render")
        await until(lambda: has_call(cluster.fake.calls, "N1"), "the render to be under way")
        live = await cluster.start("live", kind=c.SessionKind.LIVE, tenant="b", preempt_after_s=0.2)
        await until(lambda: holds(cluster, "live"), "the live session to get the slot")
        assert cluster.asked == ["render"]
        await until(lambda: _recorded(cluster), "the yield to be recorded")  # recorded once the slot is free
        [record] = cluster.yielded
        assert (record.session_id, record.for_session, record.node_id) == ("render", "live", cluster.node_id)
        # Set up on the node it was handed, its lease on the shared queue given up (in the same workflow task).
        await until(lambda: _set_up(live, cluster.node_id), "the live session to be set up on the node")
        assert not await cluster.waiting_for_a_node(live)
        assert await cluster.waiting_for_a_node(render)  # queued again, as yielded, behind the live session
        progress = await render.query(RenderWorkflow.progress)
        assert (progress.preemptions, progress.queue_class) == (1, c.QueueClass.YIELDED)
        await cluster.end("live")
        result = await asyncio.wait_for(render.result(), DEADLINE_S)
    assert cluster.dispatched == ["render", "live", "render"]
    assert (result.frames, result.chunks) == (97, 9)
    generated = [call.split()[0] for call in cluster.fake.calls if call[0] in "NI"]
    # Every chunk was made; the ones dropped at the boundary were made again on the render's next lease, from
    # the anchors (the same frames: tests/test_sched_stack.py checks the hashes through a real node).
    assert set(generated) == {"N0", "N1", "N2", "N3", "N4", "I0", "I1", "I2", "I3"}
    published = [int(call.split()[1]) for call in cluster.fake.calls if call.startswith("publish")]
    assert published == sorted(published) and published[-1] == 97
    # The shared activities that are a transaction or two time out soon on a node killed under them (shared.SHORT).
    timeouts = {**await _scheduled_timeouts(render), **await _scheduled_timeouts(live)}
    wanted = (c.RECORD_YIELD, c.ASK_TO_YIELD, c.NOTIFY_ENDED, c.PUBLISH)
    assert {name: timeouts[name] for name in wanted} == dict.fromkeys(wanted, SHORT)
    assert timeouts[c.PREPARE] == LONG


async def _scheduled_timeouts(handle: Handle) -> dict[str, timedelta]:
    """Each activity type the workflow scheduled → its start_to_close timeout (the last one scheduled)."""
    history = await handle.fetch_history()
    found = {}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            found[scheduled.activity_type.name] = scheduled.start_to_close_timeout.ToTimedelta()
    return found


async def test_a_node_found_while_an_ask_hangs_is_taken_at_once(env: WorkflowEnvironment) -> None:
    """An ask to yield that does not answer (its node killed under it) does not hold the session back: the lease that
    finds a node meanwhile is taken and the session set up there at once. Before ASK_ALONGSIDE_PATCH the session
    awaited the ask (up to its 5-minute timeout), the node's slot idle: the contention bench's 270-s stalls."""
    cluster = Cluster(env, chunk_s=0.5)
    cluster.hold_asks = asyncio.Event()
    async with cluster.workers():
        await cluster.start("render")
        await until(lambda: has_call(cluster.fake.calls, "N1"), "the render to be under way")
        live = await cluster.start("live", kind=c.SessionKind.LIVE, tenant="b", preempt_after_s=0.2)
        await until(lambda: _asked(cluster), "the live session to ask a render to yield")
        await cluster.end("render")  # its slot frees while the ask hangs
        await until(lambda: _set_up(live, cluster.node_id), "the live session to be set up on the node")
        assert not cluster.hold_asks.is_set() and [ask[0] for ask in cluster.asks] == ["live"]
        cluster.hold_asks.set()
        await cluster.end("live")
    assert cluster.dispatched == ["render", "live"] and cluster.asked == []


async def _asked(cluster: Cluster) -> bool:
    return bool(cluster.asks)


async def _set_up(handle: Handle, node_id: str) -> bool:
    progress = await handle.query(RenderWorkflow.progress)
    return bool(progress.node_id == node_id)


async def _recorded(cluster: Cluster) -> bool:
    return bool(cluster.yielded)


async def test_a_render_below_its_tenants_share_asks_and_the_one_that_yields_keeps_its_class(
    env: WorkflowEnvironment,
) -> None:
    cluster = Cluster(env, chunk_s=0.5)
    async with cluster.workers():
        big = await cluster.start("big", tenant="big")
        await until(lambda: has_call(cluster.fake.calls, "N1"), "big's render to be under way")
        small = await cluster.start("small", tenant="small", preempt_after_s=0.2)
        await until(lambda: holds(cluster, "small"), "small's render to get the slot")
        assert ("small", c.AskReason.FAIR_SHARE, c.QueueClass.NORMAL) in cluster.asks
        await until(lambda: _recorded(cluster), "the yield to be recorded")
        progress = await big.query(RenderWorkflow.progress)
        # Yielded to a fairer share: queued again in its own class (the tenants' weights decide), not as moving.
        assert (progress.preemptions, progress.queue_class) == (1, c.QueueClass.NORMAL)
        assert await cluster.waiting_for_a_node(big)
        await asyncio.wait_for(small.result(), DEADLINE_S)  # its lease ends with it, freeing the slot for big
        result = await asyncio.wait_for(big.result(), DEADLINE_S)
    assert cluster.dispatched == ["big", "small", "big"] and cluster.asked == ["big"]
    assert result.frames == 97


async def test_a_session_whose_node_was_lost_takes_a_renders_slot_and_the_render_queues_below_it(
    env: WorkflowEnvironment,
) -> None:
    """Two slots, both held; the first session's lease goes silent (its node killed: the slot is gone with it). It
    queues again as moving and asks; the render yields at a chunk boundary and queues as `yielded`, below it, so the
    slot it gave up goes to the lost session, not back to itself."""
    cluster = Cluster(env, chunk_s=0.5, slots=2)
    async with cluster.workers():
        lost, render = await lost_beside_a_render(cluster)
        cluster.dead.add(("lost", 1))
        await until(lambda: holds(cluster, "lost"), "the lost session to get the render's slot")
        # Each asked with its first lease too, while a slot was free (nobody asked); then the lost one, as moving.
        assert ("lost", c.AskReason.NODE_LOST, c.QueueClass.MOVING) in cluster.asks
        assert cluster.asked == ["render"]
        await until(lambda: _recorded(cluster), "the yield to be recorded")
        progress = await render.query(RenderWorkflow.progress)
        assert (progress.preemptions, progress.queue_class) == (1, c.QueueClass.YIELDED)
        assert await cluster.waiting_for_a_node(render)
        await asyncio.wait_for(lost.result(), DEADLINE_S)  # its lease ends with it, freeing the slot for the render
        await asyncio.wait_for(render.result(), DEADLINE_S)
        cluster.released.add("lost")  # the dead lease's activity ends with the test
    assert cluster.dispatched == ["lost", "render", "lost", "render"]
