"""Monologue's Temporal Schedules, created or brought up to date from the settings: `monologue temporal setup` (the
deployment's setup Job) and the embedded stack at start call `ensure_schedules`. One today: retention
(MONOLOGUE_RETENTION__*), which starts RetentionWorkflow on the shared queue every `every_s`.

The policy travels in the schedule's action (the workflow's input), so the setup that writes it is the one place
that reads MONOLOGUE_RETENTION__*: nodes need none of it, and changing it means running setup again."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from monologue.contracts import retention as r
from monologue.settings import Settings


def retention_schedule(settings: Settings) -> Schedule:
    """RetentionWorkflow every `every_s` with the policy as its input. A run still going when the next is due is
    left to finish (the next is skipped), and runs missed while Temporal was down are not made up beyond one period:
    each run clears everything due anyway."""
    retention = settings.retention
    every = timedelta(seconds=retention.every_s)
    policy = r.RetentionInput(
        inputs_days=retention.inputs_days, outputs_days=retention.outputs_days, batch=retention.batch
    )
    return Schedule(
        action=ScheduleActionStartWorkflow(
            r.RETENTION_WORKFLOW, policy, id=r.RETENTION_SCHEDULE, task_queue=settings.temporal.task_queue
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=every),
    )


async def ensure_schedules(client: Client, settings: Settings) -> list[str]:
    """Create each schedule, or replace its action, spec and policy with the settings' (idempotent: a second call
    changes nothing). Returns what it did, e.g. ['monologue-retention: created']."""
    schedule = retention_schedule(settings)
    try:
        await client.create_schedule(r.RETENTION_SCHEDULE, schedule)
        return [f"{r.RETENTION_SCHEDULE}: created"]
    except ScheduleAlreadyRunningError:
        pass

    def replace(current: ScheduleUpdateInput) -> ScheduleUpdate:
        # The state (paused by an operator, and why) is theirs to keep.
        return ScheduleUpdate(
            schedule=Schedule(
                action=schedule.action,
                spec=schedule.spec,
                policy=schedule.policy,
                state=current.description.schedule.state,
            )
        )

    await client.get_schedule_handle(r.RETENTION_SCHEDULE).update(replace)
    return [f"{r.RETENTION_SCHEDULE}: updated"]
