"""Data access for webhooks: endpoints per tenant, deliveries (one per message and endpoint) and their attempts.
Keyword-only functions over a SQLAlchemy session; a delivery's row is written once (its id is deterministic, so a
retried activity finds it) and every attempt adds one attempt row. Endpoints' secrets are stored encrypted
(`monologue.webhooks.encryption`) and dropped when the endpoint is deleted. A session's own endpoint (its create's
`callback_url`) is a row like a tenant's with `session_id` set: only that session's events go to it, and the
tenant's list, count and delete leave it out."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.fernet import MultiFernet
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from monologue import webhooks
from monologue.db import WebhookAttemptRow, WebhookDeliveryRow, WebhookEndpointRow, utcnow
from monologue.errors import InputError
from monologue.repo import lock_tenant  # the one per-tenant lock: the session limit and this one
from monologue.schemas import SESSION_ENDINGS, DeliveryStatus, WebhookEvent
from monologue.webhooks import encryption as webhook_secrets


class EndpointLimitReached(InputError):
    """The tenant has MONOLOGUE_WEBHOOKS__MAX_ENDPOINTS endpoints already (→ 422; the message says so)."""


def create_endpoint_within_limit(
    db: Session, *, tenant: str, url: str, events: list[WebhookEvent], limit: int, keys: MultiFernet
) -> tuple[WebhookEndpointRow, str]:
    """A new endpoint and its secret (in clear, for the caller to show once; stored encrypted under `keys`), unless
    the tenant has `limit` endpoints already (EndpointLimitReached, nothing written). The count and the insert
    hold the tenant's lock: two requests (or two API processes) would otherwise both count a place free and both
    take it."""
    lock_tenant(db, tenant=tenant)
    if _endpoints(db, tenant=tenant) >= limit:
        db.rollback()  # releases the lock
        raise EndpointLimitReached(
            f"tenant {tenant} has {limit} webhook endpoints, the limit (MONOLOGUE_WEBHOOKS__MAX_ENDPOINTS)"
        )
    secret = webhooks.new_secret()
    row = WebhookEndpointRow(
        id=f"ep_{secrets.token_hex(8)}",
        tenant=tenant,
        url=url,
        secret=webhook_secrets.seal(keys, secret),
        events=[str(event) for event in dict.fromkeys(events)],
        created_at=utcnow(),
    )
    db.add(row)
    db.commit()  # releases the lock
    return row, secret


def create_session_endpoint(
    db: Session, *, tenant: str, session_id: str, url: str, keys: MultiFernet
) -> WebhookEndpointRow:
    """The endpoint of a session's `callback_url`: the session's endings, signed with a secret of its own (stored
    encrypted under `keys`; `session_secret` reads it back for the create's answer). Outside the tenant's limit of
    endpoints: it lives and goes with its session (ON DELETE CASCADE)."""
    row = WebhookEndpointRow(
        id=f"ep_{secrets.token_hex(8)}",
        tenant=tenant,
        url=url,
        secret=webhook_secrets.seal(keys, webhooks.new_secret()),
        events=[str(event) for event in SESSION_ENDINGS],
        created_at=utcnow(),
        session_id=session_id,
    )
    db.add(row)
    db.commit()
    return row


def session_endpoint(db: Session, *, session_id: str) -> WebhookEndpointRow | None:
    """The endpoint of the session's `callback_url`, if it has one."""
    return db.scalar(select(WebhookEndpointRow).where(WebhookEndpointRow.session_id == session_id))


def session_secret(db: Session, *, session_id: str, keys: MultiFernet) -> str | None:
    """The secret signing the session's callbacks, in clear (None: it has no callback_url, or its secret was
    dropped). SecretUnreadable when none of `keys` opens it."""
    row = session_endpoint(db, session_id=session_id)
    return None if row is None or row.secret is None else webhook_secrets.unseal(keys, row.secret)


# A tenant's endpoint that has not been deleted (a session's own endpoint is not the tenant's).
_tenants_active = WebhookEndpointRow.disabled_at.is_(None) & WebhookEndpointRow.session_id.is_(None)


def _endpoints(db: Session, *, tenant: str) -> int:
    query = select(func.count()).where(WebhookEndpointRow.tenant == tenant, _tenants_active)
    return int(db.scalar(query) or 0)


def list_endpoints(db: Session, *, tenant: str | None) -> list[WebhookEndpointRow]:
    """A tenant's active endpoints (None: every tenant's), oldest first."""
    query = select(WebhookEndpointRow).where(_tenants_active)
    if tenant is not None:
        query = query.where(WebhookEndpointRow.tenant == tenant)
    return list(db.scalars(query.order_by(WebhookEndpointRow.created_at, WebhookEndpointRow.id)))


def get_endpoint(db: Session, *, endpoint_id: str) -> WebhookEndpointRow | None:
    return db.get(WebhookEndpointRow, endpoint_id)


def disable_endpoint(db: Session, *, tenant: str | None, endpoint_id: str) -> bool:
    """Stop sending to an endpoint and drop its secret (the row and its deliveries stay listed); False if the
    tenant has no such active one."""
    query = update(WebhookEndpointRow).where(WebhookEndpointRow.id == endpoint_id, _tenants_active)
    if tenant is not None:
        query = query.where(WebhookEndpointRow.tenant == tenant)
    result = db.execute(query.values(disabled_at=utcnow(), secret=None))
    db.commit()
    return bool(getattr(result, "rowcount", 0) == 1)


def subscribed(db: Session, *, tenant: str, session_id: str, event: WebhookEvent) -> list[WebhookEndpointRow]:
    """Where the session's `event` goes: the tenant's endpoints that list it, and the session's own endpoint."""
    endpoints = list_endpoints(db, tenant=tenant)
    own = session_endpoint(db, session_id=session_id)
    if own is not None and own.disabled_at is None:
        endpoints.append(own)
    return [row for row in endpoints if str(event) in row.events]


@dataclass(frozen=True)
class Rotation:
    """What `rotate_secrets` did, in rows."""

    rotated: int  # encrypted secrets, now under the first key
    encrypted: int  # secrets kept in clear (from before migration 0005), now encrypted
    cleared: int  # secrets that deleted endpoints still held (deleted before 0005), now dropped


def rotate_secrets(db: Session, *, keys: MultiFernet) -> Rotation:
    """Every stored secret encrypted under the first of `keys` (which must include the keys they were encrypted
    with: SecretUnreadable otherwise, naming the setting), and none kept for deleted endpoints. Each row is
    rewritten only if it still holds what was read, so an endpoint deleted meanwhile keeps no secret."""
    found = db.execute(
        select(WebhookEndpointRow.id, WebhookEndpointRow.secret, WebhookEndpointRow.disabled_at).where(
            WebhookEndpointRow.secret.is_not(None)
        )
    ).all()
    counts = {"rotated": 0, "encrypted": 0, "cleared": 0}
    for endpoint_id, stored, disabled_at in found:
        if disabled_at is not None or not stored:
            new, done = None, "cleared"
        else:
            try:
                new = webhook_secrets.reseal(keys, stored)
            except webhook_secrets.SecretUnreadable as err:
                db.rollback()  # all or nothing: run again once the keys are right (or the endpoint is deleted)
                raise webhook_secrets.SecretUnreadable(f"endpoint {endpoint_id}: {err}") from None
            done = "encrypted" if stored.startswith(webhooks.SECRET_PREFIX) else "rotated"
        unchanged = (WebhookEndpointRow.id == endpoint_id, WebhookEndpointRow.secret == stored)
        result = db.execute(update(WebhookEndpointRow).where(*unchanged).values(secret=new))
        counts[done] += int(getattr(result, "rowcount", 0))
    db.commit()
    return Rotation(**counts)


def create_delivery(
    db: Session,
    *,
    delivery_id: str,
    endpoint_id: str,
    tenant: str,
    session_id: str,
    event: WebhookEvent,
    payload: dict[str, Any],
) -> WebhookDeliveryRow:
    """The delivery's row, written once: a retried activity finds the first one (and its payload) unchanged."""
    row = db.get(WebhookDeliveryRow, delivery_id)
    if row is None:
        row = WebhookDeliveryRow(
            id=delivery_id,
            endpoint_id=endpoint_id,
            tenant=tenant,
            session_id=session_id,
            event=event,
            payload=payload,
            status=DeliveryStatus.PENDING,
            attempts=0,
            created_at=utcnow(),
        )
        db.add(row)
        db.commit()
    return row


def get_delivery(db: Session, *, delivery_id: str) -> WebhookDeliveryRow | None:
    return db.get(WebhookDeliveryRow, delivery_id)


def record_attempt(
    db: Session,
    *,
    delivery_id: str,
    attempt: int,
    started_at: datetime,
    duration_ms: float,
    status_code: int | None,
    error: str | None,
    delivered: bool,
) -> WebhookEvent | None:
    """One attempt; a 2xx (`delivered`) also ends the delivery. Returns the delivery's event (None: it is gone)."""
    db.merge(
        WebhookAttemptRow(
            delivery_id=delivery_id,
            attempt=attempt,
            started_at=started_at,
            duration_ms=duration_ms,
            status_code=status_code,
            error=error,
        )
    )
    values: dict[str, Any] = {"attempts": attempt, "error": error}
    if delivered:
        values |= {"status": DeliveryStatus.DELIVERED, "finished_at": utcnow()}
    query = update(WebhookDeliveryRow).where(WebhookDeliveryRow.id == delivery_id).values(**values)
    event = db.scalar(query.returning(WebhookDeliveryRow.event))
    db.commit()
    return event


def give_up(db: Session, *, delivery_id: str, error: str) -> WebhookEvent | None:
    """No more attempts: the delivery failed (unless one attempt got through after all). Returns its event if this
    call ended it (None if it had ended already: a retried give-up, or a late delivery)."""
    event = db.scalar(
        update(WebhookDeliveryRow)
        .where(WebhookDeliveryRow.id == delivery_id, WebhookDeliveryRow.status == DeliveryStatus.PENDING)
        .values(status=DeliveryStatus.FAILED, finished_at=utcnow(), error=error)
        .returning(WebhookDeliveryRow.event)
    )
    db.commit()
    return event


@dataclass(frozen=True)
class DeliveryFilter:
    tenant: str | None = None  # None: every tenant's (operators)
    session_id: str | None = None
    endpoint_id: str | None = None


def list_deliveries(
    db: Session, *, where: DeliveryFilter, limit: int = 100
) -> list[tuple[WebhookDeliveryRow, list[WebhookAttemptRow]]]:
    """Deliveries, newest first, each with its attempts in order (two queries, not one per delivery)."""
    query = select(WebhookDeliveryRow)
    for column, value in (
        (WebhookDeliveryRow.tenant, where.tenant),
        (WebhookDeliveryRow.session_id, where.session_id),
        (WebhookDeliveryRow.endpoint_id, where.endpoint_id),
    ):
        if value is not None:
            query = query.where(column == value)
    rows = list(db.scalars(query.order_by(WebhookDeliveryRow.created_at.desc(), WebhookDeliveryRow.id).limit(limit)))
    attempts: dict[str, list[WebhookAttemptRow]] = {row.id: [] for row in rows}
    if rows:
        found = select(WebhookAttemptRow).where(WebhookAttemptRow.delivery_id.in_(list(attempts)))
        for attempt in db.scalars(found.order_by(WebhookAttemptRow.attempt)):
            attempts[attempt.delivery_id].append(attempt)
    return [(row, attempts[row.id]) for row in rows]
