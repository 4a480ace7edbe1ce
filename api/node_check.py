"""Running a check on a node and waiting for it: the API has no media stack, so a session's uploads
(`validate_inputs`) and an avatar's portrait (`prepare_avatar`) are decoded and checked by a worker of the shared
queue, through a one-activity workflow the API awaits with a deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError as TemporalTimeout

from monologue.errors import InputError

from .deps import Services
from .errors import ValidationUnavailable

R = TypeVar("R")


async def check_on_node(
    services: Services, workflow: str, request: Any, *, workflow_id: str, result_type: type[R], what: str
) -> R:
    """Run `workflow` on a worker and wait for its result: InputError with the activity's message if the input is
    bad, ValidationUnavailable if no worker finished it within MONOLOGUE_API__VALIDATE_TIMEOUT_S (`what`: what was
    being checked, for that message)."""
    settings = services.settings
    timeout_s = settings.api.validate_timeout_s
    try:
        result: R = await services.temporal.execute_workflow(
            workflow,
            request,
            id=workflow_id,
            task_queue=settings.temporal.task_queue,
            result_type=result_type,
            # Temporal ends the check at the deadline even when no worker ever picked it up.
            execution_timeout=timedelta(seconds=timeout_s),
        )
        return result
    except WorkflowFailureError as err:
        cause = err.cause.cause if isinstance(err.cause, ActivityError) else err.cause
        if isinstance(cause, ApplicationError) and cause.non_retryable:
            raise InputError(cause.message) from None  # the activity's InputError, message unchanged
        if isinstance(err.cause, TemporalTimeout):
            raise ValidationUnavailable(
                f"no node checked {what} within {timeout_s:g} s (MONOLOGUE_API__VALIDATE_TIMEOUT_S): no node"
                f" polls the task queue {settings.temporal.task_queue!r}, or all are busy; try again later"
            ) from None
        raise
