"""Webhook activities: queueing a session's messages when it ends (shared queue) and delivering each one (webhook
queue), recording every attempt.

`notify_session_ended` writes one delivery row per endpoint that takes the event, the tenant's and the session's own
(its create's `callback_url`), each id derived from the session, event, endpoint and workflow run (so a retry finds
the same rows), and starts one WebhookDeliveryWorkflow per row (the same id: started once). `deliver_webhook`
sends one attempt, signed for that attempt, through `monologue.outbound` (public addresses only, on the address
connected to), records it (and counts it: `monologue_webhook_deliveries_total`,
`monologue_webhook_delivery_seconds`), and raises for anything but a 2xx so Temporal retries it with back-off; an
endpoint the operator no longer allows is a non-retryable refusal. The endpoint's secret is decrypted only here, to
sign (`monologue.webhooks.encryption`), and of the receiver's answer only its status and first bytes are read. Async
activities: their work is network waits; database calls run on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import httpx
import structlog
from sqlalchemy.orm import sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from activities.errors import activity_context
from monologue import contracts as c, metrics, outbound, repo, webhooks
from monologue.db import utcnow
from monologue.errors import AddressRefused
from monologue.repo import webhooks as repo_webhooks
from monologue.schemas import DeliveryStatus, WebhookEvent
from monologue.settings import Settings
from monologue.webhooks import encryption as webhook_secrets

# Of a receiver's answer, kept with an attempt and all that is read of it: an error page may be hundreds of
# megabytes, and a node delivering to many receivers at once must not hold them.
_ERROR_BYTES = 500


@dataclass(frozen=True)
class _Message:
    url: str
    secret: str  # decrypted: only in memory, only to sign
    tenant: str
    body: bytes
    event: WebhookEvent


class WebhookActivities:
    def __init__(self, *, sessions: sessionmaker[Any], settings: Settings) -> None:
        self._sessions = sessions
        self._settings = settings
        self._keys = webhook_secrets.keyring(settings)  # at the node's start: a malformed key stops it here

    @activity.defn(name=c.NOTIFY_ENDED)
    async def notify_session_ended(self, request: c.NotifyEndedInput) -> c.NotifyEndedResult:
        """Queue the session's messages for its tenant's endpoints and start their deliveries."""
        with activity_context(session_id=request.session_id) as log:
            run_id = activity.info().workflow_run_id or ""
            queued = await asyncio.to_thread(self._queue, request, run_id)
            client = activity.client()
            settings = self._settings.webhooks
            for delivery_id in queued:
                deliver = c.WebhookInput(
                    delivery_id=delivery_id,
                    initial_backoff_s=settings.initial_backoff_s,
                    max_backoff_s=settings.max_backoff_s,
                    give_up_after_s=settings.give_up_after_s,
                    timeout_s=settings.timeout_s,
                )
                with contextlib.suppress(WorkflowAlreadyStartedError):  # a retry of this activity: started already
                    await client.start_workflow(
                        c.WEBHOOK_WORKFLOW,
                        deliver,
                        id=c.webhook_workflow_id(delivery_id),
                        task_queue=c.webhook_task_queue(self._settings.temporal.task_queue),
                    )
            log.info("webhooks queued", status=request.status, deliveries=len(queued))
            return c.NotifyEndedResult(deliveries=len(queued))

    def _queue(self, request: c.NotifyEndedInput, run_id: str) -> list[str]:
        event = webhooks.EVENT_OF.get(request.status)
        if event is None:
            return []
        with self._sessions() as db:
            row = repo.get_session(db, session_id=request.session_id)
            if row is None:
                return []
            message = webhooks.payload(row, event, self._settings)
            queued = []
            for endpoint in repo_webhooks.subscribed(db, tenant=request.tenant, session_id=row.id, event=event):
                delivery_id = webhooks.delivery_id(
                    session_id=row.id, event=event, endpoint_id=endpoint.id, run_id=run_id
                )
                repo_webhooks.create_delivery(
                    db,
                    delivery_id=delivery_id,
                    endpoint_id=endpoint.id,
                    tenant=request.tenant,
                    session_id=row.id,
                    event=event,
                    payload=message | {"id": delivery_id},
                )
                queued.append(delivery_id)
            return queued

    @activity.defn(name=c.DELIVER_WEBHOOK)
    async def deliver_webhook(self, request: c.WebhookInput) -> None:
        """One attempt: sign, send, record; raise unless the receiver answered 2xx."""
        attempt = activity.info().attempt
        try:
            message = await asyncio.to_thread(self._message, request.delivery_id)
        except webhook_secrets.SecretUnreadable as err:  # the operator's keys: retried, so fixing them is enough
            await asyncio.to_thread(self._record, request.delivery_id, attempt, time.monotonic(), None, str(err))
            raise ApplicationError(str(err)) from None
        if message is None:
            return  # delivered already (an earlier attempt's answer arrived late) or gone with its endpoint
        url = message.url
        refusal = webhooks.url_refusal(url, tenant=message.tenant, settings=self._settings)
        if refusal is not None:
            await asyncio.to_thread(self._record, request.delivery_id, attempt, time.monotonic(), None, refusal)
            raise ApplicationError(refusal, type=c.WEBHOOK_REFUSED, non_retryable=True)
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            async with outbound.guarded_client(self._settings.outbound, timeout_s=request.timeout_s) as client:
                headers = webhooks.headers(message.secret, request.delivery_id, int(time.time()), message.body)
                async with client.stream("POST", url, content=message.body, headers=headers) as response:
                    status = response.status_code
                    if not response.is_success:
                        error = f"{status} {response.reason_phrase}: {await _answer_start(response)}"
        except AddressRefused as err:
            await asyncio.to_thread(self._record, request.delivery_id, attempt, started, None, str(err))
            raise ApplicationError(str(err), type=c.WEBHOOK_REFUSED, non_retryable=True) from None
        except httpx.HTTPError as err:
            error = _failure(err)
        metrics.WEBHOOK_DELIVERY.labels(event=message.event.value).observe(time.monotonic() - started)
        await asyncio.to_thread(self._record, request.delivery_id, attempt, started, status, error)
        if error is not None:
            raise ApplicationError(f"attempt {attempt} to {url}: {error}")
        structlog.get_logger("activity").info("webhook delivered", delivery_id=request.delivery_id, attempt=attempt)

    def _message(self, delivery_id: str) -> _Message | None:
        with self._sessions() as db:
            delivery = repo_webhooks.get_delivery(db, delivery_id=delivery_id)
            if delivery is None or delivery.status != DeliveryStatus.PENDING:
                return None
            endpoint = repo_webhooks.get_endpoint(db, endpoint_id=delivery.endpoint_id)
            if endpoint is None or endpoint.disabled_at is not None or endpoint.secret is None:
                _count_given_up(repo_webhooks.give_up(db, delivery_id=delivery_id, error="the endpoint was deleted"))
                return None
            secret = webhook_secrets.unseal(self._keys, endpoint.secret)
            body = webhooks.body(delivery.payload)
            return _Message(endpoint.url, secret, delivery.tenant, body, delivery.event)

    def _record(self, delivery_id: str, attempt: int, started: float, status: int | None, error: str | None) -> None:
        took = timedelta(seconds=time.monotonic() - started)
        with self._sessions() as db:
            event = repo_webhooks.record_attempt(
                db,
                delivery_id=delivery_id,
                attempt=attempt,
                started_at=utcnow() - took,
                duration_ms=round(took.total_seconds() * 1000, 1),
                status_code=status,
                error=error,
                delivered=error is None,
            )
        if event is not None:
            outcome = metrics.WebhookOutcome.DELIVERED if error is None else metrics.WebhookOutcome.FAILED
            metrics.WEBHOOK_DELIVERIES.labels(event=event.value, outcome=outcome.value).inc()

    @activity.defn(name=c.WEBHOOK_GIVEN_UP)
    async def webhook_given_up(self, request: c.WebhookGivenUpInput) -> None:
        """The retry period is over (or the endpoint was refused): the delivery failed."""
        await asyncio.to_thread(self._give_up, request)

    def _give_up(self, request: c.WebhookGivenUpInput) -> None:
        with self._sessions() as db:
            _count_given_up(repo_webhooks.give_up(db, delivery_id=request.delivery_id, error=request.error))


def _count_given_up(event: WebhookEvent | None) -> None:
    """A delivery this call gave up on counts once (None: it had ended already, and was counted then)."""
    if event is not None:
        metrics.WEBHOOK_DELIVERIES.labels(event=event.value, outcome=metrics.WebhookOutcome.GAVE_UP.value).inc()


def _failure(err: httpx.HTTPError) -> str:
    """An attempt's error with its root cause: httpx says "All connection attempts failed" whether the receiver
    refused the connection, was unreachable or reset it, and the delivery log is where an operator looks for which."""
    text = _named(err)
    root: BaseException = err
    for _ in range(10):  # a chain, not a cycle: __context__ may point back
        inner = root.__cause__ or root.__context__
        if inner is None or inner is err:
            break
        root = inner
    return text if root is err or str(root) == str(err) else f"{text} ({_named(root)})"


def _named(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


async def _answer_start(response: httpx.Response) -> str:
    """The first `_ERROR_BYTES` of a receiver's answer, as text; the rest is never read (closing the response
    drops the connection)."""
    start = b""
    raw = cast(AsyncGenerator[bytes, None], response.aiter_raw())  # raw: a compressed answer is not inflated
    async with contextlib.aclosing(raw) as chunks:
        async for chunk in chunks:
            start += chunk
            if len(start) >= _ERROR_BYTES:
                break
    return start[:_ERROR_BYTES].decode("utf-8", errors="replace")
