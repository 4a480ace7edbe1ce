"""A fake one-node cluster on the real dev server's matcher (started with `cli.stack.matcher_flags()`), for the lease
tests (`test_lease_order.py`: who gets a node first; `test_lease_moves.py`: how a waiting session asks and a lost one
moves). Fake activities under the real names (tests/workflows/test_render_workflow.py); the node's lease slots are
the real `LeaseSlots`, and a handed lease claims one with the real `claim_slot`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.lease import claim_slot
from monologue import contracts as c
from node.lease_gate import LeaseSlots, lease_tuner
from tests.workflows.test_render_workflow import FakeNodes, orchestration
from workflows.render import RenderWorkflow

Handle = WorkflowHandle[RenderWorkflow, c.RenderResult]
DEADLINE_S = 120.0  # how long a test waits for a state before failing (a loaded machine is slow, never this slow)


async def until(check: Callable[[], Any], what: str) -> None:
    """Wait for `check()` to hold (polling): the state, not a guess of how long it takes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)


class Cluster:
    """One fake node with `slots` slots (one by default) on a fresh queue. `dispatched` lists sessions in the order
    their leases started (`handed`: those taken from the node's handed lease queue). A lease in `dead` stops
    heartbeating and keeps its slot, as a killed node's slot is gone. The slots are the node's real `LeaseSlots`, which
    the shared queue's lease worker reserves and a handed lease claims (node/lease_gate.py)."""

    def __init__(self, env: WorkflowEnvironment, *, chunk_s: float = 0.0, slots: int = 1) -> None:
        self.slots = slots
        self.dead: set[tuple[str, int]] = set()  # (session, lease number)
        self.env = env
        self.fake = FakeNodes(env, frames=97, chunk_s=chunk_s)
        self.queue = self.fake.queue
        self.node_id = f"n-{uuid.uuid4().hex[:8]}"
        self.dispatched: list[str] = []
        self.handed: list[str] = []
        self.gate = LeaseSlots(slots, lambda: None, recheck_s=0.05)
        self.holding: set[tuple[str, int]] = set()  # the leases a slot runs now (a dead one keeps its slot)
        self.handles: dict[str, Handle] = {}
        self.released: set[str] = set()  # sessions ended by the test: their lease gives the slot back at once
        self.asked: list[str] = []  # renders asked to yield
        self.asks: list[tuple[str, c.AskReason, c.QueueClass]] = []  # who asked, why, in which class
        self.yielded: list[c.RecordYieldInput] = []
        self.hold_asks: asyncio.Event | None = None  # set: every ask waits for it (a node killed under the ask)
        self.refuse_asks = False  # no render may yield (every ask answers that none was asked)
        self.hand_to: str | None = None  # the node an ask names (None: this one)

    def sched(self) -> list[object]:
        """`ask_to_yield` asks the render holding the slot, and nobody while a slot is free (the real policy is tested
        in tests/monologue)."""

        @activity.defn(name=c.ASK_TO_YIELD)
        async def ask_to_yield(request: c.AskToYieldInput) -> c.AskToYieldResult:
            self.asks.append((request.session_id, request.why, request.queue_class))
            if self.hold_asks is not None:
                await self.hold_asks.wait()
            holder = self.dispatched[-1] if self.dispatched else None
            # As the policy: a render that gave its slot to a fairer share is at its share, and does not ask back.
            gave_way = request.why is c.AskReason.FAIR_SHARE and request.session_id in self.asked
            free = len(self.holding) < self.slots
            refused = self.refuse_asks or free or holder is None or holder == request.session_id or holder in self.asked
            if refused or gave_way:
                return c.AskToYieldResult(asked=None)
            self.asked.append(holder)
            as_moving = request.why is not c.AskReason.FAIR_SHARE  # as activities/sched.py does
            slot = c.YieldSlot(for_session=request.session_id, as_moving=as_moving)
            await self.handles[holder].signal(c.YIELD_SLOT, slot)
            return c.AskToYieldResult(asked=holder, node_id=self.hand_to or self.node_id)

        @activity.defn(name=c.RECORD_YIELD)
        def record_yield(request: c.RecordYieldInput) -> None:
            self.yielded.append(request)

        return [ask_to_yield, record_yield]

    def lease(self) -> list[object]:
        @activity.defn(name=c.HOLD_NODE)
        async def hold_node(request: c.HoldNodeInput) -> None:
            if request.handed_wait_s <= 0:
                await self._hold(request)
                return
            assert await claim_slot(self.gate, request), f"no slot handed to {request.session_id}"
            try:
                self.handed.append(request.session_id)
                await self._hold(request, handed=True)
            finally:
                self.gate.unclaim()

        return [hold_node]

    async def _hold(self, request: c.HoldNodeInput, *, handed: bool = False) -> None:
        self.dispatched.append(request.session_id)
        lease = (request.session_id, request.lease)
        self.holding.add(lease)
        try:
            handle = self.env.client.get_workflow_handle(request.workflow_id)
            acquired = c.NodeAcquired(lease=request.lease, node_id=self.node_id, handed=handed)
            await handle.signal(c.NODE_ACQUIRED, acquired)
            while request.session_id not in self.released:  # until the workflow releases the slot (or ends)
                if lease not in self.dead:
                    activity.heartbeat()
                await asyncio.sleep(0.05)
        finally:
            self.holding.discard(lease)

    @asynccontextmanager
    async def workers(self, *, with_lease: bool = True, with_workflows: bool = True) -> AsyncIterator[None]:
        """The shared queue's and the node's workers; the lease queue's (`slots`) unless `with_lease` is False; the
        workflows run here unless `with_workflows` is False (then in `workflow_worker`, which a test may stop)."""
        queues: list[tuple[str, list[object], list[type]]] = [
            (self.queue, [*self.fake.shared(), *self.sched()], [RenderWorkflow] if with_workflows else []),
            (c.node_task_queue(self.node_id), self.fake.node(self.node_id), []),
        ]
        if with_lease:
            queues.append((c.lease_task_queue(self.queue), self.lease(), []))
            queues.append((c.handed_lease_task_queue(self.node_id), self.lease(), []))
        with ThreadPoolExecutor(8) as executor:
            async with AsyncExitStack() as stack:
                for queue, activities, workflows in queues:
                    shared_leases = queue == c.lease_task_queue(self.queue)
                    worker = Worker(
                        self.env.client,
                        task_queue=queue,
                        workflows=workflows,
                        activities=activities,
                        activity_executor=executor,
                        tuner=lease_tuner(self.gate) if shared_leases else None,
                        workflow_failure_exception_types=[Exception],
                    )
                    await stack.enter_async_context(worker)
                yield

    def workflow_worker(self) -> Worker:
        """A worker of the sessions' workflows alone (with `workers(with_workflows=False)`)."""
        return Worker(
            self.env.client,
            task_queue=self.queue,
            workflows=[RenderWorkflow],
            workflow_failure_exception_types=[Exception],
        )

    async def start(
        self,
        name: str,
        *,
        tenant: str = "a",
        priority: c.RenderPriority = c.RenderPriority.NORMAL,
        kind: c.SessionKind = c.SessionKind.RENDER,
        resume: c.ResumePoint | None = None,
        **changes: Any,
    ) -> Handle:
        request = c.RenderInput(
            session_id=name,
            tenant=tenant,
            kind=kind,
            options=c.RenderOptions(chunk_frames=20, i_frames=4, priority=priority),
            orchestration=orchestration(**{"preempt_after_s": 0.0, "idle_timeout_s": 600.0, **changes}),
            resume=resume or c.ResumePoint(),
        )
        handle = await self.env.client.start_workflow(
            RenderWorkflow.run, request, id=f"render-{name}-{uuid.uuid4().hex[:6]}", task_queue=self.queue
        )
        self.handles[name] = handle
        return handle

    async def waiting_for_a_node(self, handle: Handle) -> bool:
        """Its lease is scheduled and no node has started it."""
        description = await handle.describe()
        pending = description.raw_description.pending_activities
        scheduled = PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
        return any(item.activity_type.name == c.HOLD_NODE and item.state == scheduled for item in pending)

    async def dispatch_all(self, count: int) -> list[str]:
        """Let the one slot go round: each session dispatched is ended at once, freeing the slot for the next."""
        for taken in range(count):
            await until(self._more(taken), f"dispatch {taken + 1} of {count} (so far {self.dispatched})")
            await self.end(self.dispatched[taken])
        return self.dispatched

    async def end(self, name: str) -> None:
        """End the session and give its slot back now (a terminated workflow's lease would notice only at its next
        heartbeat, seconds later)."""
        await self.handles[name].terminate("its place in the order is all this test needs")
        self.released.add(name)

    def _more(self, taken: int) -> Callable[[], Any]:
        async def check() -> bool:
            return len(self.dispatched) > taken

        return check


async def queue_up(cluster: Cluster, sessions: list[tuple[str, dict[str, Any]]]) -> None:
    """Queue the sessions' leases in this order (nobody polls the lease queue): each is started once the one before
    waits for a node (a render's lease is queued once its `prepare` is done)."""
    for name, arguments in sessions:
        handle = await cluster.start(name, **arguments)
        await until(lambda handle=handle: cluster.waiting_for_a_node(handle), f"{name}'s lease to be queued")


async def has_call(calls: list[str], prefix: str) -> bool:
    return any(call.startswith(prefix) for call in calls)


async def holds(cluster: Cluster, name: str) -> bool:
    return bool(cluster.dispatched) and cluster.dispatched[-1] == name


async def lost_beside_a_render(cluster: Cluster) -> tuple[Handle, Handle]:
    """Two slots held, both under way: "lost" (its lease timeout 2 s, asking every 0.2 s), then tenant b's "render"."""
    lost = await cluster.start("lost", lease_timeout_s=2.0, preempt_after_s=0.2)
    await until(lambda: holds(cluster, "lost"), "the first session to hold a slot")
    render = await cluster.start("render", tenant="b")
    await until(lambda: holds(cluster, "render"), "the render to hold the other slot")
    await until(lambda: has_call(cluster.fake.calls, "N1"), "both to be under way")
    return lost, render
