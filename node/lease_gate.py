"""The lease worker's slots: as many as the node's capacity, and none while the node has too little room.

A node takes a session by taking a `hold_node` task from the lease queue, and its worker polls that queue only
with a free slot in hand. Here the slots come from `LeaseSlots`, which hands out none while `shortage()` names a
reason (its scratch disk is short or filled up: activities/disks.py). So a node whose disk is full stops polling:
the session it lost goes to another node instead of bouncing back, and no lease spins between it and the queue. The
polls already out when the disk fills are refused by `hold_node` itself (as a draining node refuses its leases), and
the session's workflow then starts another lease. The room is checked again every RECHECK_S, so the node polls again
within about a second of space coming back.

A slot can also be handed over: a render that yields its slot to a session waiting for one (docs/scheduling.md,
"Preemption") frees it on this node, and the session it yields to has asked this node for it on the node's own lease
queue (`c.handed_lease_task_queue`). That lease `claim`s the next slot freed here, ahead of the shared queue's polls,
so the matcher cannot give the slot to another session first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from temporalio.worker import (
    CustomSlotSupplier,
    FixedSizeSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    WorkerTuner,
)

RECHECK_S = 1.0  # how often a node without a free slot, or without room, looks again
OTHER_SLOTS = 100  # the SDK's default for the slot kinds the lease worker does not use (it runs no workflows)


class LeaseSlots(CustomSlotSupplier):
    """At most `capacity` leases at once, and none while `shortage()` is not None."""

    def __init__(self, capacity: int, shortage: Callable[[], str | None], recheck_s: float = RECHECK_S) -> None:
        self._capacity, self._shortage, self._recheck_s = capacity, shortage, recheck_s
        self._taken = 0
        self._claims: list[object] = []  # handed leases waiting for a slot, first come first served
        self._lock = threading.Lock()  # the SDK may release a slot from a thread of its own
        self._freed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        self._loop = asyncio.get_running_loop()
        while True:
            self._freed.clear()
            if (permit := self.try_reserve_slot(ctx)) is not None:
                return permit
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), timeout=self._recheck_s)

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        with self._lock:
            # A slot freed while a handed lease waits for one is that lease's, not the shared queue's.
            if self._taken + len(self._claims) >= self._capacity or self._shortage() is not None:
                return None
            self._taken += 1
        return SlotPermit()

    async def claim(self, timeout_s: float) -> bool:
        """Take the next free slot for a handed lease, ahead of the shared queue's polls (and of later claims);
        False if none frees within `timeout_s`. A slot claimed is given back with `unclaim`."""
        self._loop = asyncio.get_running_loop()
        me = object()
        deadline = self._loop.time() + timeout_s
        with self._lock:
            self._claims.append(me)
        try:
            while True:
                self._freed.clear()
                with self._lock:
                    if self._claims[0] is me and self._taken < self._capacity:
                        self._taken += 1
                        return True
                left = deadline - self._loop.time()
                if left <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), timeout=min(left, self._recheck_s))
        finally:
            with self._lock:
                self._claims.remove(me)
            self._wake()  # the claim ahead is gone: the next claim, or a poll, may take the slot

    def unclaim(self) -> None:
        """A claimed slot's lease has ended."""
        self._free()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        return

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        self._free()

    def _free(self) -> None:
        with self._lock:
            self._taken -= 1
        self._wake()

    def _wake(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has stopped
                self._loop.call_soon_threadsafe(self._freed.set)


def lease_tuner(slots: LeaseSlots) -> WorkerTuner:
    """The lease worker's tuner: its activity slots are `slots`."""
    other = FixedSizeSlotSupplier(OTHER_SLOTS)
    return WorkerTuner.create_composite(
        workflow_supplier=other,
        activity_supplier=slots,
        local_activity_supplier=other,
        nexus_supplier=other,
    )
