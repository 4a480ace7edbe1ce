"""WebhookDeliveryWorkflow: one webhook message, tried until the receiver takes it or the retry period ends.

Temporal keeps the attempt schedule (exponential back-off from `initial_backoff_s`, doubling, capped at
`max_backoff_s`, for `give_up_after_s` in all: 27 hours by default), so a receiver that is down for a day still
gets the message once it is back, and a node restart in between loses nothing. Each attempt records itself
(`deliver_webhook`); when the period ends the delivery is marked failed (`webhook_given_up`). Started by
`notify_session_ended` with an id derived from the message, so it runs once per message.

Pure orchestration, like every workflow: the standard library, temporalio and the contracts only."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c


@workflow.defn(name=c.WEBHOOK_WORKFLOW)
class WebhookDeliveryWorkflow:
    @workflow.run
    async def run(self, request: c.WebhookInput) -> None:
        retry = RetryPolicy(
            initial_interval=timedelta(seconds=request.initial_backoff_s),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=request.max_backoff_s),
            maximum_attempts=0,  # unlimited: the schedule-to-close timeout ends the tries
            non_retryable_error_types=[c.WEBHOOK_REFUSED],
        )
        try:
            await workflow.execute_activity(
                c.DELIVER_WEBHOOK,
                request,
                start_to_close_timeout=timedelta(seconds=request.timeout_s + 5),
                schedule_to_close_timeout=timedelta(seconds=request.give_up_after_s),
                retry_policy=retry,
            )
        except ActivityError as err:
            cause = err.cause
            reason = str(getattr(cause, "message", None) or cause or err)
            given_up = c.WebhookGivenUpInput(delivery_id=request.delivery_id, error=reason)
            await workflow.execute_activity(
                c.WEBHOOK_GIVEN_UP,
                given_up,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=10),
            )
