"""RetentionWorkflow: one scheduled pass of the data-retention policy (MONOLOGUE_RETENTION__*).

A Temporal Schedule starts it (`RETENTION_SCHEDULE`, overlapping runs skipped); it asks the shared queue to remove the
inputs of sessions that ended longer ago than the policy's days, then the uploaded assets on the same clock from their
upload, then the outputs, one bounded batch per activity call, until a call finds fewer than a batch or the run has
made `MAX_CALLS` calls (the next run goes on, so a backlog never grows one history without bound). The cutoff comes
from the workflow's clock, so a replay computes the same.

Pure orchestration, like every workflow: the standard library, temporalio and the contracts only."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from monologue.contracts import retention as r

Result = TypeVar("Result")
MAX_CALLS = 50  # activity calls per part and run
DAY_S = 86_400.0
# One call deletes a batch of sessions' objects; it heartbeats after each session, so a stalled store shows in a minute.
CALL_TIMEOUT = timedelta(minutes=30)
HEARTBEAT_TIMEOUT = timedelta(seconds=60)
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=5)


@workflow.defn(name=r.RETENTION_WORKFLOW)
class RetentionWorkflow:
    @workflow.run
    async def run(self, policy: r.RetentionInput) -> r.RetentionResult:
        """The inputs, then the outputs, of every session due (a part whose days are None is kept)."""
        now_s = workflow.now().timestamp()
        inputs, inputs_due = await self._clear(r.DataPart.INPUTS, policy.inputs_days, now_s, policy.batch)
        assets, assets_due = await self._expire_assets(policy.inputs_days, now_s, policy.batch)
        outputs, outputs_due = await self._clear(r.DataPart.OUTPUTS, policy.outputs_days, now_s, policy.batch)
        more = inputs_due or assets_due or outputs_due
        return r.RetentionResult(inputs=inputs, outputs=outputs, assets=assets, more=more)

    async def _expire_assets(self, days: float | None, now_s: float, batch: int) -> tuple[int, bool]:
        """Uploaded assets (personal data like the inputs, on their clock) removed, and whether some are still due."""
        if days is None:
            return 0, False
        request = r.ExpireAssetsInput(uploaded_before_s=now_s - days * DAY_S, batch=batch)
        return await _in_batches(r.EXPIRE_ASSETS, request, r.ExpireAssetsResult, lambda done: done.assets, batch)

    async def _clear(self, part: r.DataPart, days: float | None, now_s: float, batch: int) -> tuple[int, bool]:
        """Sessions whose `part` was removed, and whether some are still due after MAX_CALLS calls."""
        if days is None:
            return 0, False
        request = r.ApplyRetentionInput(part=part, ended_before_s=now_s - days * DAY_S, batch=batch)
        return await _in_batches(r.APPLY_RETENTION, request, r.ApplyRetentionResult, lambda done: done.sessions, batch)


async def _in_batches(
    activity: str, request: Any, result_type: type[Result], cleared: Callable[[Result], int], batch: int
) -> tuple[int, bool]:
    """Call `activity` until a call clears fewer than a batch, or MAX_CALLS times: (cleared in all, more due)."""
    removed = 0
    for _ in range(MAX_CALLS):
        done = await workflow.execute_activity(
            activity,
            request,
            result_type=result_type,
            start_to_close_timeout=CALL_TIMEOUT,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RETRY,
        )
        removed += cleared(done)
        if cleared(done) < batch:
            return removed, False
    return removed, True
