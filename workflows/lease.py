"""The node a session holds, inside RenderWorkflow: the lease race, and activities pinned to the held node.

A `hold_node` activity on the lease queue is taken by a node with a free slot, which signals NODE_ACQUIRED and
heartbeats until released; the session's pinned work then runs on that node's own queue. The lease queue is ordered
by Temporal's matcher: a `Priority` per lease (its `QueueClass`: live, moving, then renders by priority) with the
tenant as fairness key. A live session or one whose node was lost, waiting, asks a render to yield
(`ask_to_yield`); a render asked (the YIELD_SLOT signal) gives its slot up at its next chunk boundary and queues again
as `yielded`, below the session it gave way to, and a second lease of the asker waits on that node's own lease queue
for the slot (handed: `c.handed_lease_task_queue`), beside its lease on the shared queue. If the lease dies
(node killed: heartbeat timeout; node shutting down: NodeDraining) or a pinned activity stops (it cannot start:
schedule-to-start timeout; it went silent: heartbeat timeout), the node is lost and the caller takes another
lease. Workflow code: standard library, temporalio and the stdlib-only contracts only."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError as ActivityTimeout, TimeoutType

from workflows.shared import RETRY, SHORT, abandon, run_shared, start_shared

# A pinned activity whose heartbeats stopped is not retried: its retry would wait on the same (hung) node's
# queue, whose slot the hung attempt still holds, until schedule_to_start; failing at once moves the session
# now. "TemporalTimeout:Heartbeat" is the server's name for that failure type.
PINNED_RETRY = dataclasses.replace(
    RETRY, non_retryable_error_types=[*(RETRY.non_retryable_error_types or []), "TemporalTimeout:Heartbeat"]
)

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c

Result = TypeVar("Result")

# Sessions started before issue 27 scheduled their leases with no priority and never asked a render to yield.
PRIORITY_PATCH = "lease-priority-and-preemption"
# Sessions started before the `yielded` class waited for a free slot after losing their node, asking nobody.
NODE_LOST_ASKS_PATCH = "node-lost-sessions-ask"
# Sessions started before this awaited each ask before looking at their lease again: an ask whose node died held them
# (until its start_to_close timeout, 5 min then) past the node their lease had found meanwhile, its slot idle.
ASK_ALONGSIDE_PATCH = "ask-to-yield-alongside-the-lease"
# Sessions started before this asked twice as long apart each time when live, too: a live session must start within
# seconds (MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S), and at 1, 3 and 7 s it asked only twice within 5.
LIVE_ASKS_STEADILY_PATCH = "live-sessions-ask-steadily"
# Sessions started before this asked ever less often after losing their node too (at 1, 3, 7 s): one whose first
# asked render could not yield (it had just ended or lost its own node) waited 8 s more.
LOST_ASKS_STEADILY_PATCH = "lost-sessions-ask-steadily"
# Sessions started before this first asked after `preempt_after_s`: a second lost before a live session's or a lost
# session's ask, with every slot busy. The policy now asks nobody while a node reports a free slot, so the first ask
# goes out with the lease.
ASK_AT_ONCE_PATCH = "ask-with-the-lease"
# Sessions started before this waited on the shared lease queue alone after their ask: the slot the render gave up
# went to whichever lease Temporal's matcher ranked first (a moving or yielded session, or another tenant's render at
# a fairness tie), not always to the asker. Now a handed lease of the asker waits on that render's node for the slot.
HANDOFF_PATCH = "slot-handed-to-its-asker"
HANDED_WAIT_S = 15.0  # a handed lease waits this long for its node to free a slot (a chunk boundary), then queues
ASK_EVERY_MAX_S = 30.0  # a session that still waits asks a render to yield at least this often
STEADY_ASKS_S = 10.0  # a waiting live or lost session asks every `preempt_after_s` this long, then as others do


class NodeLost(Exception):
    """The node holding the session died, is draining, or stopped taking its work."""


class NodeLease:
    """Hold a node for the session and run activities on it, watching the lease while they run."""

    def __init__(self, request: c.RenderInput, progress: c.Progress, on_acquired: Callable[[], None]) -> None:
        self._request, self._progress, self._on_acquired = request, progress, on_acquired
        self._orchestration = request.orchestration
        self._handle: workflow.ActivityHandle[None] | None = None
        # The current lease's number: a stale lease's signal is ignored, and the node's writes carry it (its
        # fencing token, c.FENCING). It counts on from the session's earlier runs.
        self._number = request.resume.lease
        self._offered: c.NodeAcquired | None = None
        self.node_id: str | None = None
        # Under way already (resumed, continued as new, or moved in this run): its next lease queues as moving.
        self._moving = request.resume.cursor > 0
        self._lost = False  # its node was lost in this run and it holds none yet: it asks for a slot
        self._yielded = False  # it gave its slot up to a live or moving session: it queues below them
        self.yield_for: c.YieldSlot | None = None  # the request this render was asked to give its slot up for
        # While a lease of the shared queue waits and asks (its number): the node whose slot an ask's render gives
        # up (`_handed_node`, until a handed lease waits for it there: `_handed`, beside the shared one).
        self._asking_lease: int | None = None
        self._handed_node: str | None = None
        self._handed: workflow.ActivityHandle[None] | None = None

    @property
    def queue_class(self) -> c.QueueClass:
        request = self._request
        return c.QueueClass.of(request.kind, request.options.priority, moving=self._moving, yielded=self._yielded)

    @property
    def asks(self) -> c.AskReason | None:
        """Why this session, waiting for a node, may ask a render to yield (None: it may not): a live session; a
        session whose node was lost (the render that yields to it queues as `yielded`, below it); a render, for its
        tenant's fair share. A session resumed or continued as new, or one that yielded itself, takes the next free
        slot in its class and asks nobody."""
        if self._request.kind is c.SessionKind.LIVE:
            return c.AskReason.LIVE
        if self._lost:
            return c.AskReason.NODE_LOST if workflow.patched(NODE_LOST_ASKS_PATCH) else None
        return None if self._moving or self._yielded else c.AskReason.FAIR_SHARE

    def ask_to_yield(self, asked: c.YieldSlot) -> bool:
        """A waiting session asked for this render's slot (the YIELD_SLOT signal): it goes at the next chunk boundary.
        False when it cannot: a live session, or no node held (there is no slot to give)."""
        if self._request.kind is c.SessionKind.RENDER and self.node_id is not None:
            self.yield_for = asked
            return True
        return False

    @property
    def number(self) -> int:
        """The number of the lease last taken (the fencing token of the work run under it)."""
        return self._number

    def offer(self, acquired: c.NodeAcquired) -> None:
        """A node took the lease (the NODE_ACQUIRED signal): the first to, when a handed lease waits beside it."""
        if acquired.lease == self._number and self._offered is None:
            self._offered = acquired

    async def hold(self) -> None:
        """Hold a node: start a lease, wait until a node with a free slot takes it, set the session up there. While it
        waits, a render asked to yield for it names its node, and a handed lease (the same number) waits there for
        that slot, beside the shared one: the first a node takes is kept, the other given up."""
        while self.node_id is None:
            self._number += 1
            self._offered, self._handed_node = None, None
            prioritized = workflow.patched(PRIORITY_PATCH)
            self._progress.queue_class = self.queue_class
            self._handle = self._start_lease(prioritized, None)
            await self._wait_for_node(asking=prioritized)
            self._keep_the_lease_taken()
            if self._offered is None:  # the lease ended before any node took it
                abandon(self._handle)
                self._handle = None
                continue
            self.node_id = self._offered.node_id
            self._lost = False
            self._progress.node_id = self.node_id
            self._on_acquired()
            init = c.InitSessionInput(
                session_id=self._request.session_id,
                node_id=self.node_id,
                options=self._request.options,
                session_kind=self._request.kind,
                lease=self._number,
            )
            try:
                await self.run(c.INIT_SESSION, init, c.InitSessionResult)
            except NodeLost:
                self.lose()

    def _hand(self) -> None:
        """Wait for the slot on `_handed_node` too (a handed lease there, in place of an earlier one)."""
        if self._handed is not None:
            abandon(self._handed)
        self._handed = self._start_lease(True, self._handed_node)
        self._handed_node = None

    def _keep_the_lease_taken(self) -> None:
        """Of the shared lease and a handed one, keep the one a node took (`_handle`) and give the other up."""
        handed, self._handed = self._handed, None
        if handed is None:
            return
        if self._offered is not None and self._offered.handed:
            if self._handle is not None:
                abandon(self._handle)
            self._handle = handed
        else:
            abandon(handed)

    def _start_lease(self, prioritized: bool, handed_to: str | None) -> workflow.ActivityHandle[None]:
        """A lease on the shared queue, or one handed to node `handed_to` (its own lease queue: a dead node's has no
        poller, and the lease gives up after the lease timeout)."""
        timeout = timedelta(seconds=self._orchestration.lease_timeout_s)
        shared = c.lease_task_queue(workflow.info().task_queue)
        return workflow.start_activity(
            c.HOLD_NODE,
            c.HoldNodeInput(
                session_id=self._request.session_id,
                workflow_id=workflow.info().workflow_id,
                lease=self._number,
                heartbeat_s=min(1.0, self._orchestration.lease_timeout_s / 4),
                handed_wait_s=0.0 if handed_to is None else HANDED_WAIT_S,
            ),
            task_queue=shared if handed_to is None else c.handed_lease_task_queue(handed_to),
            # Waiting for a free slot can take as long as other sessions take; a held lease lasts the session.
            schedule_to_close_timeout=timedelta(days=7),
            schedule_to_start_timeout=None if handed_to is None else timeout,
            heartbeat_timeout=timeout,
            retry_policy=RetryPolicy(maximum_attempts=1),  # this workflow decides what to do next
            priority=self._priority() if prioritized else Priority.default,
        )

    def _priority(self) -> Priority:
        """The lease's place in Temporal's queue: its class, then its tenant's share by weight."""
        return Priority(
            priority_key=self.queue_class.priority_key,
            fairness_key=self._request.tenant,
            fairness_weight=self._orchestration.fairness_weight,
        )

    async def _wait_for_node(self, *, asking: bool) -> None:
        """Until a node takes the lease (or it ends). A session that may ask (`asks`) asks a render to yield as it
        starts the lease (the policy asks nobody while a node reports a free slot) and again while it still waits (the
        policy asks one render per asker, and another once that one's node has gone silent): after `preempt_after_s`,
        then twice as long apart each time up to ASK_EVERY_MAX_S, so a long wait keeps the history short; a live
        session, and one whose node was lost, asks every `preempt_after_s` for its first STEADY_ASKS_S. An ask that
        marks a render names its node (`_handed_node`): a handed lease waits there for that render's slot."""
        after = self._orchestration.preempt_after_s
        if not asking or after <= 0 or (why := self.asks) is None:
            await workflow.wait_condition(self._offered_or_ended)
            return
        alongside = workflow.patched(ASK_ALONGSIDE_PATCH)
        steady = (why is c.AskReason.LIVE and workflow.patched(LIVE_ASKS_STEADILY_PATCH)) or (
            why is c.AskReason.NODE_LOST and workflow.patched(LOST_ASKS_STEADILY_PATCH)
        )
        steady_until = workflow.now() + timedelta(seconds=STEADY_ASKS_S if steady else 0)
        # An ask that marks a render names its node: a handed lease waits for the slot there, beside this one.
        self._asking_lease = self._number if alongside and workflow.patched(HANDOFF_PATCH) else None
        # One ask in flight at most; the first goes out with the lease (the policy asks nobody while a slot is free).
        pending = self._start_ask(why) if alongside and workflow.patched(ASK_AT_ONCE_PATCH) else None
        while True:
            try:
                await workflow.wait_condition(self._found_or_handed, timeout=timedelta(seconds=after))
                if not self._offered_or_ended():  # an ask named the node whose slot is given up: wait there too
                    self._hand()
                    continue
                self._asking_lease = None
                return  # an ask still in flight finishes on its own (the render it marks yields to a later asker)
            except TimeoutError:
                if not alongside:
                    await self._ask_a_render_to_yield(why)
                elif pending is None or pending.done():
                    pending = self._start_ask(why)
                if workflow.now() >= steady_until:
                    after = min(2 * after, max(after, ASK_EVERY_MAX_S))

    async def _ask_a_render_to_yield(self, why: c.AskReason) -> None:
        """The ask as sessions started before ASK_ALONGSIDE_PATCH make it: awaited."""
        try:
            await run_shared(c.ASK_TO_YIELD, self._asking(why), c.AskToYieldResult, SHORT)
        except ActivityError as err:  # no render yields this time; the session still waits for a free slot
            self._ask_failed(err)

    def _start_ask(self, why: c.AskReason) -> workflow.ActivityHandle[c.AskToYieldResult]:
        """Ask a render to yield, not waiting for the answer: the lease may find a node meanwhile."""
        handle = start_shared(c.ASK_TO_YIELD, self._asking(why), c.AskToYieldResult, SHORT)
        handle.add_done_callback(self._ask_done)
        return handle

    def _ask_done(self, handle: asyncio.Future[c.AskToYieldResult]) -> None:
        if handle.cancelled():
            return
        if isinstance(error := handle.exception(), ActivityError):
            self._ask_failed(error)
        elif error is None and handle.result().node_id and self._asking_lease == self._number:
            self._handed_node = handle.result().node_id

    def _ask_failed(self, err: ActivityError) -> None:
        session_id = self._request.session_id
        workflow.logger.warning("ask to yield failed", extra={"session_id": session_id, "error": str(err)})

    def _asking(self, why: c.AskReason) -> c.AskToYieldInput:
        request = self._request
        return c.AskToYieldInput(
            session_id=request.session_id, tenant=request.tenant, queue_class=self.queue_class, why=why
        )

    def _offered_or_ended(self) -> bool:
        return self._offered is not None or self._handle is None or self._handle.done()

    def _found_or_handed(self) -> bool:
        return self._offered_or_ended() or self._handed_node is not None

    async def run(self, name: str, arg: Any, result_type: type[Result]) -> Result:
        """Run an activity on the held node, watching the lease: if the node goes, so does the activity."""
        return await self.wait(self.start(name, arg, result_type), name)

    def start(self, name: str, arg: Any, result_type: type[Result]) -> workflow.ActivityHandle[Result]:
        if self.node_id is None:
            raise NodeLost("no node held")
        return workflow.start_activity(
            name,
            arg,
            result_type=result_type,
            task_queue=c.node_task_queue(self.node_id),
            # A dead node's queue has no poller: only schedule_to_start notices that.
            schedule_to_start_timeout=timedelta(seconds=3 * self._orchestration.lease_timeout_s),
            start_to_close_timeout=timedelta(minutes=15),
            # Nodes heartbeat during a chunk, so a hung one is noticed in seconds.
            heartbeat_timeout=timedelta(seconds=self._orchestration.heartbeat_timeout_s),
            retry_policy=PINNED_RETRY,
        )

    async def wait(self, handle: workflow.ActivityHandle[Result], name: str) -> Result:
        """The activity's result, unless the lease ends first (node lost or draining). An activity that found its
        node's disk full (NodeDiskFull) loses the node too: the session moves, as it would from a dead node."""
        lease = self._handle
        if lease is None:
            raise NodeLost("no node held")
        await workflow.wait([handle, lease], return_when=asyncio.FIRST_COMPLETED)
        if not handle.done():
            if _draining(lease):
                try:
                    finished: Result = await handle  # a draining node finishes the activity it has
                    return finished
                except ActivityError as err:
                    raise NodeLost(f"node {self.node_id} drained during {name}") from err
            abandon(handle)
            raise NodeLost(f"node {self.node_id} lost during {name}")
        try:
            result: Result = handle.result()
            return result
        except ActivityError as err:
            if isinstance(err.cause, ActivityTimeout) and err.cause.type in (
                TimeoutType.SCHEDULE_TO_START,
                TimeoutType.HEARTBEAT,
            ):
                raise NodeLost(f"node {self.node_id} stopped taking work ({err.cause.type.name})") from err
            if isinstance(err.cause, ApplicationError) and err.cause.type == c.NODE_DISK_FULL:
                message = f"node {self.node_id}'s disk is full during {name}: {err.cause.message}"
                session_id = self._request.session_id
                workflow.logger.warning("node disk full", extra={"session_id": session_id, "error": message})
                raise NodeLost(message) from err
            if isinstance(err.cause, ApplicationError) and err.cause.type == c.LEASE_FENCED:
                # The session's row knows a newer lease than this run's (c.FENCING): the next lease counts on from it.
                newest = err.cause.details[0] if err.cause.details else 0
                self._number = max(self._number, int(newest) if isinstance(newest, int) else 0)
                raise NodeLost(f"lease fenced during {name}: {err.cause.message}") from err
            raise

    def ended(self) -> bool:
        """The lease has ended under the session (the node died or is draining) though no wait has said so yet."""
        return self._handle is not None and self._handle.done()

    def lose(self) -> None:
        """The node is gone: give up its lease; the next `hold` takes another node."""
        workflow.logger.warning("node lost", extra={"session_id": self._request.session_id, "node_id": self.node_id})
        self.release()
        self._moving = self._lost = True
        self._progress.node_changes += 1

    def give_way(self) -> str:
        """Give the slot up to the session that asked (at a chunk boundary): the next lease queues as `yielded`, or
        in the render's own class when it yields to a fairer share. Returns the node given up."""
        node_id, asked = self.node_id or "", self.yield_for
        self.release()
        self._moving = False
        self._yielded = asked is None or asked.as_moving
        self._progress.preemptions += 1
        return node_id

    def release(self) -> None:
        """Give the node's slot back (the lease activity sees the cancellation at its next heartbeat)."""
        if self._handle is not None:
            abandon(self._handle)
        self._handle, self.node_id, self.yield_for = None, None, None


def _draining(lease: workflow.ActivityHandle[None]) -> bool:
    error = lease.exception() if lease.done() and not lease.cancelled() else None
    return (
        isinstance(error, ActivityError)
        and isinstance(error.cause, ApplicationError)
        and (error.cause.type == c.NODE_DRAINING)
    )
