"""PrepareAvatarWorkflow: one call of `prepare_avatar`, which the API awaits before it records an avatar.

Why a workflow: as for ValidateInputsWorkflow, the API has no media stack, and Temporal starts activities only from
workflows. The API gives it an execution timeout: no worker in time is a 503, not an avatar that waits forever.

Pure orchestration, like every workflow: the standard library, temporalio and the contracts only.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c

# As for a session's uploads (workflows/validate.py): decoding and a face search take well under a second; a worker
# lost mid-check is retried on another.
DECODE_TIMEOUT = timedelta(seconds=60)
RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3)


@workflow.defn(name=c.PREPARE_AVATAR_WORKFLOW)
class PrepareAvatarWorkflow:
    @workflow.run
    async def run(self, request: c.PrepareAvatarInput) -> c.PrepareAvatarResult:
        """The normalised portrait's size; fails with the activity's non-retryable InputError on bad input."""
        result: c.PrepareAvatarResult = await workflow.execute_activity(
            c.PREPARE_AVATAR,
            request,
            result_type=c.PrepareAvatarResult,
            start_to_close_timeout=DECODE_TIMEOUT,
            retry_policy=RETRY,
        )
        return result
