"""Translate Monologue's errors into Temporal's at the activity edge."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.disks import disk_full_message, no_room, watched_node
from monologue import contracts as c
from monologue.errors import InputError, LeaseFenced


@contextmanager
def activity_context(**ids: object) -> Iterator[structlog.stdlib.BoundLogger]:
    """Bind the workflow's and the caller's ids to every log line, make bad input and a fenced write (a newer
    lease holds the session: c.FENCING) non-retryable, and name a full disk (NodeDiskFull: activities/disks.py)."""
    info = activity.info()
    with structlog.contextvars.bound_contextvars(
        workflow_id=info.workflow_id,
        run_id=info.workflow_run_id,
        activity=info.activity_type,
        attempt=info.attempt,
        **ids,
    ):
        log = structlog.get_logger("activity")
        try:
            yield log
        except InputError as err:
            log.warning("bad input", error=str(err))
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err
        except LeaseFenced as err:
            log.warning("write fenced: a newer lease holds the session", error=str(err))
            raise ApplicationError(str(err), err.newest, type=c.LEASE_FENCED, non_retryable=True) from err
        except Exception as err:
            if (full := no_room(err)) is None:
                raise
            message = disk_full_message(full, info.activity_type)
            log.error("disk full", error=message)
            # On the node's own queue a retry would come back to the same disk: the workflow moves the session
            # instead. Elsewhere (shared, sink queues) Temporal's retry may run on another node.
            node = watched_node()
            pinned = node is not None and info.task_queue == c.node_task_queue(node)
            raise ApplicationError(message, type=c.NODE_DISK_FULL, non_retryable=pinned) from err
