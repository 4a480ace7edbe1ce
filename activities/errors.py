"""Translate Monologue's errors into Temporal's at the activity edge."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from monologue.errors import InputError


@contextmanager
def activity_context(**ids: object) -> Iterator[structlog.stdlib.BoundLogger]:
    """Bind the workflow's and the caller's ids to every log line, and make bad input non-retryable."""
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
