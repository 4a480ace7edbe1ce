"""Webhooks as Standard Webhooks has them: each message carries `webhook-id` (the same on every attempt, so a
receiver deduplicates), `webhook-timestamp` (Unix seconds of the attempt) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 over "<id>.<timestamp>.<body>">`, keyed with the endpoint's `whsec_` secret).

Endpoints belong to a tenant (or to one session: a create's `callback_url`) and may point only where the operator
allows that tenant (MONOLOGUE_WEBHOOKS__ALLOWED_URLS, `{tenant}` filled in, a trailing `*` any rest) and, when
delivered, only to public addresses or ranges the operator allows (`monologue.outbound`, checked on the address
connected to). This module is the one definition of both; the API applies it when an endpoint (or a session with a
callback_url) is made, each delivery before it sends.
Data access is in `monologue/repo/webhooks.py`; delivery runs on the nodes (`activities/webhooks.py`)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook

from monologue.apikeys import TENANT
from monologue.contracts import SessionStatus
from monologue.db import SessionRow, utcnow
from monologue.outbound import scheme_refusal
from monologue.schemas import WebhookEvent, WebhookLinks, WebhookMessage, WebhookSession
from monologue.settings import Settings

SECRET_PREFIX = "whsec_"
EVENT_OF = {
    SessionStatus.RUNNING: WebhookEvent.STARTED,
    SessionStatus.COMPLETED: WebhookEvent.COMPLETED,
    SessionStatus.FAILED: WebhookEvent.FAILED,
    SessionStatus.CANCELLED: WebhookEvent.CANCELLED,
}
STATUS_OF = {event: status for status, event in EVENT_OF.items()}  # what a message's `data.status` says
# The headers every message carries besides content-type (`headers`), as the API's OpenAPI `webhooks` documents them.
SIGNED_HEADERS = {
    "webhook-id": "The message's id: the same on every attempt, so a receiver deduplicates.",
    "webhook-timestamp": "Unix seconds of this attempt; refuse messages far from your clock (replays).",
    "webhook-signature": 'v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>"> keyed with the endpoint\'s secret.',
}


def new_secret() -> str:
    """A signing secret: `whsec_` and 32 random bytes in base64 (the form Standard Webhooks libraries read)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for one attempt (the spec's reference library signs)."""
    return Webhook(secret).sign(message_id, datetime.fromtimestamp(timestamp, UTC), body.decode())


def headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "accept-encoding": "identity",  # of the answer only its first bytes are read, as they come: not compressed
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def url_refusal(url: str, *, tenant: str, settings: Settings, what: str = "url") -> str | None:
    """Why a tenant's endpoint (`what`: the field that gave the URL) may not point at `url` (naming the setting), or
    None. The address it resolves to is checked again at every delivery, on the address actually connected to."""
    problem = scheme_refusal(url, settings.outbound, what)
    if problem is not None:
        return problem
    if not TENANT.fullmatch(tenant):
        return f"{what}: tenant {tenant!r} is not a valid tenant name, so it may have no webhook"
    patterns = [pattern.replace("{tenant}", tenant) for pattern in settings.webhooks.allowed_urls]
    if not any(url == pattern or (pattern.endswith("*") and url.startswith(pattern[:-1])) for pattern in patterns):
        return (
            f"{what}: {url} is not where tenant {tenant!r} may send webhooks (MONOLOGUE_WEBHOOKS__ALLOWED_URLS lists"
            " where endpoints may point)"
        )
    return None


def delivery_id(*, session_id: str, event: WebhookEvent, endpoint_id: str, run_id: str) -> str:
    """A message's id: the same for every attempt (and every retry of the activity that queued it), another for
    each endpoint, event and workflow run (a resumed session that fails again is a new message)."""
    digest = hashlib.sha256(f"{session_id}\n{event}\n{endpoint_id}\n{run_id}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def payload(row: SessionRow, event: WebhookEvent, settings: Settings, *, at: datetime | None = None) -> dict[str, Any]:
    """The message body: Standard Webhooks' envelope (`type`, `timestamp`, `data`) around the session's summary (the
    model the API's OpenAPI `webhooks` section documents)."""
    base = str(settings.api.public_url).rstrip("/")
    message = WebhookMessage(
        type=event,
        timestamp=at or utcnow(),
        data=WebhookSession(
            id=row.id,
            kind=row.kind,
            status=STATUS_OF[event],  # as of the event (a started message may go out once the session ended)
            error=row.error,
            created_at=row.created_at,
            finished_at=row.finished_at,
            frames=row.frames,
            audio_seconds=row.audio_seconds,
            metadata=row.client_metadata,
            links=WebhookLinks(self=f"{base}/v1/renders/{row.id}", video=f"{base}/v1/renders/{row.id}/video.mp4"),
        ),
    )
    return message.model_dump(mode="json")


def body(message: dict[str, Any]) -> bytes:
    """The bytes that are signed and sent (one encoding, so every attempt sends the same body)."""
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode()
