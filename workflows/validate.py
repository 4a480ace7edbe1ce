"""ValidateInputsWorkflow: one call of `validate_inputs`, which the API awaits before it creates a session.

Why a workflow: the API has no media stack (no av, Pillow, OpenCV or torch), so decoding and checking the
uploads runs on a worker of the shared queue, and Temporal starts activities only from workflows. The API
gives it an execution timeout: no worker in time is a 503, not a session that waits forever.

Pure orchestration, like every workflow: the standard library, temporalio and the contracts only.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c

# Decoding the longest audio the limits allow takes seconds; a worker lost mid-check is retried on another.
DECODE_TIMEOUT = timedelta(seconds=60)
RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3)


@workflow.defn(name=c.VALIDATE_WORKFLOW)
class ValidateInputsWorkflow:
    @workflow.run
    async def run(self, request: c.ValidateInputsInput) -> c.ValidateInputsResult:
        """The normalised inputs' sizes; fails with the activity's non-retryable InputError on bad input."""
        result: c.ValidateInputsResult = await workflow.execute_activity(
            c.VALIDATE_INPUTS,
            request,
            result_type=c.ValidateInputsResult,
            start_to_close_timeout=DECODE_TIMEOUT,
            retry_policy=RETRY,
        )
        return result
