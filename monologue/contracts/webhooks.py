"""Webhook deliveries' workflow and activities (issue 18)."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time (see
# monologue/contracts/__init__.py, which re-exports every name here).
from dataclasses import dataclass

from monologue.contracts.session import SessionStatus

# Webhooks (issue 18): when a session ends, RenderWorkflow asks the shared queue to queue its messages (one per
# endpoint of the tenant that takes the event); each is then delivered by its own WebhookDeliveryWorkflow on the
# webhook queue, retried with exponential back-off until it gets through or gives up.
NOTIFY_ENDED = "notify_session_ended"
WEBHOOK_WORKFLOW = "WebhookDeliveryWorkflow"
DELIVER_WEBHOOK = "deliver_webhook"
WEBHOOK_GIVEN_UP = "webhook_given_up"
WEBHOOK_REFUSED = "WebhookRefused"  # ApplicationError type: the endpoint may no longer be sent to; no retry


def webhook_task_queue(shared_queue: str) -> str:
    """The queue of webhook deliveries (a slow receiver never holds the shared queue's slots)."""
    return f"{shared_queue}-webhooks"


def webhook_workflow_id(delivery_id: str) -> str:
    return f"webhook-{delivery_id}"


@dataclass
class NotifyEndedInput:
    """The session ended with `status` (completed, failed or cancelled), or a node started it (running): queue
    its webhook messages. (The activity's name says "ended" from before `session.started`; histories keep it.)"""

    session_id: str
    tenant: str
    status: SessionStatus


@dataclass
class NotifyEndedResult:
    deliveries: int  # messages queued (one per endpoint that takes the event)


@dataclass
class WebhookInput:
    """Deliver one queued message; the back-off comes from the node's settings when it was queued."""

    delivery_id: str
    initial_backoff_s: float
    max_backoff_s: float
    give_up_after_s: float
    timeout_s: float  # one attempt


@dataclass
class WebhookGivenUpInput:
    delivery_id: str
    error: str
