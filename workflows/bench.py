"""A workflow that only runs no-op activities: `monologue bench orchestration` times Temporal's round
trip per activity with it. Standard library and temporalio only, like every workflow."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

NOOP = "noop"


@activity.defn(name=NOOP)
async def noop() -> None:
    """Does nothing: what is left is the cost of scheduling, dispatching and completing an activity."""


@workflow.defn(name="RoundTripWorkflow")
class RoundTripWorkflow:
    @workflow.run
    async def run(self, count: int) -> None:
        for _ in range(count):
            await workflow.execute_activity(NOOP, start_to_close_timeout=timedelta(seconds=30))
