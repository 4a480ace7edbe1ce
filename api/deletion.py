"""Deleting a session (`DELETE /v1/renders/{id}`, a render or a live session alike): stop its workflow through the
ordinary cancellation (never terminated: its cleanup runs), wait until the workflow has closed, so nothing of the
session writes any more (its last chunk, its playlist's end, its sinks' hand-over), then remove its objects and keep
its tombstone (`monologue.lifecycle.delete_session`, which also fences any chunk still finishing on a node).

Idempotent: a deleted session answers 204 again, and a DELETE that failed half-way (storage down) is finished by the
next one. A session that does not stop within STOP_WAIT_S is left cancelling: the caller is told to ask again."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from monologue import contracts as c, lifecycle
from monologue.db import SessionRow
from monologue.repo import lifecycle as repo_lifecycle

from .deps import Services
from .submit import cancel_workflow

log = structlog.get_logger("api.deletion")

# How long a DELETE waits for a session's workflow to close: a chunk to finish (cancellation reaches it at its next
# heartbeat) and its sinks to hand over; longer, and the caller is told to come back (409 with Retry-After).
STOP_WAIT_S = 30.0


class StillStopping(Exception):
    """The session's workflow has not closed within STOP_WAIT_S; its cancellation stands."""


async def delete(services: Services, row: SessionRow) -> None:
    """Stop the session, wait for its workflow to close, remove its objects and keep its tombstone. StillStopping if
    it does not close in time; TransientError (storage) or RPCError (Temporal) when a service beneath fails."""
    if repo_lifecycle.purged(row):
        return
    workflow_id = row.workflow_id or c.render_workflow_id(row.id)
    # Also when the session has ended: its workflow may still be handing its sinks over (up to SINK_DRAIN_S, or until
    # a completed session's sinks are done), which a cancel cuts short; nothing is worth delivering now. An RPCError
    # here (closed already, never started, Temporal down) is for `_closed` to sort out.
    with contextlib.suppress(RPCError):
        await cancel_workflow(services, row)
    if not await _closed(services.temporal, workflow_id, STOP_WAIT_S):
        raise StillStopping(
            f"render {row.id} is still stopping (its cancellation was asked); DELETE it again in a few seconds"
        )
    removed = await asyncio.to_thread(lifecycle.delete_session, services.sessions, services.store, row.id)
    log.info("render deleted", session_id=row.id, objects=removed)


async def _closed(client: Client, workflow_id: str, timeout_s: float) -> bool:
    """Whether the session's workflow (its latest run, following continue-as-new) has closed within `timeout_s`.
    A workflow Temporal does not know (never started, or its history long deleted) is closed."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    if described.status != WorkflowExecutionStatus.RUNNING:
        return True
    try:
        await asyncio.wait_for(handle.result(follow_runs=True), timeout=timeout_s)
    except TimeoutError:
        return False
    except WorkflowFailureError:  # how a cancelled or failed run ends: closed, which is all that is asked
        pass
    return True
