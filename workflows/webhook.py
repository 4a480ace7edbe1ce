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
from temporalio.exceptions import ActivityError, FailureError, RetryState

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
            given_up = c.WebhookGivenUpInput(delivery_id=request.delivery_id, error=_why(err, request))
            await workflow.execute_activity(
                c.WEBHOOK_GIVEN_UP,
                given_up,
                start_to_close_timeout=timedelta(seconds=30),
                # Until the database takes the record: a delivery must not stay `pending` for good because the
                # database was down when its period ended.
                schedule_to_close_timeout=timedelta(days=7),
                retry_policy=RetryPolicy(maximum_interval=timedelta(minutes=1), maximum_attempts=0),
            )


def _why(err: ActivityError, request: c.WebhookInput) -> str:
    """The delivery's end as its log shows it: the last attempt's error (under the timeout Temporal reports when
    the period ends with an attempt under way), and, when the period is what ended the tries, that it was given up
    and after how long, so it is not read as one more failed attempt. (Only the activity's input changes: the
    commands, and so replay, are the same.)"""
    last: BaseException = err
    while isinstance(last, FailureError) and last.cause is not None:
        last = last.cause
    reason = str(getattr(last, "message", None) or last)
    if err.retry_state != RetryState.TIMEOUT:
        return reason  # refused: the endpoint may no longer be sent to
    period = f"{request.give_up_after_s:g} s (MONOLOGUE_WEBHOOKS__GIVE_UP_AFTER_S)"
    return f"given up after {period} of retries; the last: {reason}"
