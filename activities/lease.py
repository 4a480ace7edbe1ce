"""The node lease: how a session holds one of a node's slots, and how a lost node is noticed.

`hold_node` runs on the lease queue, which every node polls with as many slots as it has capacity,
so a session waits (in order) until some node has a free slot. Once started it tells the workflow
which node it is on (a signal), then heartbeats until the workflow cancels it. If the node dies, the
heartbeats stop and Temporal fails the activity after the heartbeat timeout: that is how the workflow
learns it must move the session. A node shutting down ends its leases with NodeDraining at once; a node without
room for a session's files (`shortage`, activities/disks.py) refuses new leases with NodeDiskFull, and its lease
worker stops polling meanwhile (node/lease_gate.py).

A lease can also be handed to a session: a render asked to yield its slot tells its asker which node it is on, and
the asker starts a second lease, beside its shared one, on that node's own lease queue (`c.handed_lease_task_queue`)
with `handed_wait_s` set. There `hold_node` first claims the next slot freed on this node (`claim_slot`, ahead of the
shared queue), or gives up after `handed_wait_s` with NoSlotHanded (the session still waits on the shared queue).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from monologue import contracts as c, metrics


class HandedSlots(Protocol):
    """The node's lease slots, as a handed lease takes one (node/lease_gate.py's LeaseSlots)."""

    async def claim(self, timeout_s: float) -> bool: ...

    def unclaim(self) -> None: ...


class NodeLease:
    def __init__(
        self,
        *,
        client: Client,
        node_id: str,
        shortage: Callable[[], str | None] = lambda: None,
        slots: HandedSlots | None = None,
    ) -> None:
        """`shortage`: why the node must take no new session now (None: it may). `slots`: the node's lease slots,
        which a handed lease claims one of (None: no lease is handed here)."""
        self._client = client
        self._node_id = node_id
        self._shortage = shortage
        self._slots = slots
        self.draining = asyncio.Event()
        # The sessions whose leases run here now, for the node registry. A list, not a set: across a
        # continue-as-new the same session can briefly hold two leases.
        self._held: list[str] = []

    def held_sessions(self) -> list[str]:
        """Ids of the sessions holding a slot of this node now."""
        return sorted(set(self._held))

    @activity.defn(name=c.HOLD_NODE)
    async def hold_node(self, request: c.HoldNodeInput) -> None:
        """Hold a slot of this node for the session until cancelled (the workflow releases it)."""
        log = structlog.get_logger("lease").bind(
            session_id=request.session_id, workflow_id=request.workflow_id, node_id=self._node_id, lease=request.lease
        )
        self._refuse_if_unable(log)
        if request.handed_wait_s <= 0:
            await self._hold(request, log, handed=False)
            return
        if self._slots is None or not await claim_slot(self._slots, request):
            log.info("no slot handed", waited_s=request.handed_wait_s)
            raise ApplicationError(f"no slot of node {self._node_id} was freed in time", type=c.NO_SLOT_HANDED)
        try:
            self._refuse_if_unable(log)  # it may have begun draining, or filled its disk, while the lease waited
            await self._hold(request, log, handed=True)
        finally:
            self._slots.unclaim()

    def _refuse_if_unable(self, log: Any) -> None:
        if self.draining.is_set():
            raise ApplicationError(f"node {self._node_id} is shutting down", type=c.NODE_DRAINING, non_retryable=True)
        if (short := self._shortage()) is not None:  # a poll that was out when the disk filled
            log.warning("lease refused: no room", reason=short)
            refusal = f"node {self._node_id} takes no session: {short}"
            raise ApplicationError(refusal, type=c.NODE_DISK_FULL, non_retryable=True)

    async def _hold(self, request: c.HoldNodeInput, log: Any, *, handed: bool) -> None:
        waited = datetime.now(UTC) - activity.info().current_attempt_scheduled_time
        metrics.QUEUE_WAIT.observe(max(0.0, waited.total_seconds()))
        handle = self._client.get_workflow_handle(request.workflow_id)
        await handle.signal(c.NODE_ACQUIRED, c.NodeAcquired(lease=request.lease, node_id=self._node_id, handed=handed))
        log.info("node acquired", handed=handed)
        self._held.append(request.session_id)
        try:
            while not self.draining.is_set():
                activity.heartbeat()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.draining.wait(), timeout=request.heartbeat_s)
        except asyncio.CancelledError:
            log.info("node released")
            raise
        finally:
            self._held.remove(request.session_id)
        log.info("node draining: handing the session back")
        raise ApplicationError(f"node {self._node_id} is shutting down", type=c.NODE_DRAINING, non_retryable=True)


async def claim_slot(slots: HandedSlots, request: c.HoldNodeInput) -> bool:
    """A handed lease's slot: the next one freed on the node within `handed_wait_s`, heartbeating while it waits (the
    workflow sees a dead node's lease time out, and cancels one it no longer wants: then the claim is withdrawn, and a
    slot it took meanwhile given back)."""
    claim = asyncio.ensure_future(slots.claim(request.handed_wait_s))
    try:
        while not claim.done():
            activity.heartbeat()
            await asyncio.wait([claim], timeout=request.heartbeat_s)
    except BaseException:
        claim.cancel()
        if claim.done() and not claim.cancelled() and claim.result():
            slots.unclaim()
        raise
    return claim.result()
