"""The node lease: how a session holds one of a node's slots, and how a lost node is noticed.

`hold_node` runs on the lease queue, which every node polls with as many slots as it has capacity,
so a session waits (in order) until some node has a free slot. Once started it tells the workflow
which node it is on (a signal), then heartbeats until the workflow cancels it. If the node dies, the
heartbeats stop and Temporal fails the activity after the heartbeat timeout: that is how the workflow
learns it must move the session. A node shutting down ends its leases with NodeDraining at once; a node without
room for a session's files (`shortage`, activities/disks.py) refuses new leases with NodeDiskFull, and its lease
worker stops polling meanwhile (node/lease_gate.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

import structlog
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from monologue import contracts as c, metrics


class NodeLease:
    def __init__(self, *, client: Client, node_id: str, shortage: Callable[[], str | None] = lambda: None) -> None:
        """`shortage`: why the node must take no new session now (None: it may)."""
        self._client = client
        self._node_id = node_id
        self._shortage = shortage
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
        if self.draining.is_set():
            raise ApplicationError(f"node {self._node_id} is shutting down", type=c.NODE_DRAINING, non_retryable=True)
        if (short := self._shortage()) is not None:  # a poll that was out when the disk filled
            log.warning("lease refused: no room", reason=short)
            refusal = f"node {self._node_id} takes no session: {short}"
            raise ApplicationError(refusal, type=c.NODE_DISK_FULL, non_retryable=True)
        waited = datetime.now(UTC) - activity.info().current_attempt_scheduled_time
        metrics.QUEUE_WAIT.observe(max(0.0, waited.total_seconds()))
        handle = self._client.get_workflow_handle(request.workflow_id)
        await handle.signal(c.NODE_ACQUIRED, c.NodeAcquired(lease=request.lease, node_id=self._node_id))
        log.info("node acquired")
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
