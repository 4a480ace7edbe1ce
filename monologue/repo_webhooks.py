"""Data access for webhooks: endpoints per tenant, deliveries (one per message and endpoint) and their attempts.
Keyword-only functions over a SQLAlchemy session; a delivery's row is written once (its id is deterministic, so a
retried activity finds it) and every attempt adds one attempt row."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from monologue import webhooks
from monologue.db import WebhookAttemptRow, WebhookDeliveryRow, WebhookEndpointRow, utcnow
from monologue.schemas import DeliveryStatus, WebhookEvent


def create_endpoint(
    db: Session, *, tenant: str, url: str, events: list[WebhookEvent]
) -> tuple[WebhookEndpointRow, str]:
    """A new endpoint and its secret (shown once by the caller; kept only to sign)."""
    secret = webhooks.new_secret()
    row = WebhookEndpointRow(
        id=f"ep_{secrets.token_hex(8)}",
        tenant=tenant,
        url=url,
        secret=secret,
        events=[str(event) for event in dict.fromkeys(events)],
        created_at=utcnow(),
    )
    db.add(row)
    db.commit()
    return row, secret


def list_endpoints(db: Session, *, tenant: str | None) -> list[WebhookEndpointRow]:
    """A tenant's active endpoints (None: every tenant's), oldest first."""
    query = select(WebhookEndpointRow).where(WebhookEndpointRow.disabled_at.is_(None))
    if tenant is not None:
        query = query.where(WebhookEndpointRow.tenant == tenant)
    return list(db.scalars(query.order_by(WebhookEndpointRow.created_at, WebhookEndpointRow.id)))


def get_endpoint(db: Session, *, endpoint_id: str) -> WebhookEndpointRow | None:
    return db.get(WebhookEndpointRow, endpoint_id)


def disable_endpoint(db: Session, *, tenant: str | None, endpoint_id: str) -> bool:
    """Stop sending to an endpoint (its deliveries stay listed); False if the tenant has no such active one."""
    query = update(WebhookEndpointRow).where(
        WebhookEndpointRow.id == endpoint_id, WebhookEndpointRow.disabled_at.is_(None)
    )
    if tenant is not None:
        query = query.where(WebhookEndpointRow.tenant == tenant)
    result = db.execute(query.values(disabled_at=utcnow()))
    db.commit()
    return bool(getattr(result, "rowcount", 0) == 1)


def subscribed(db: Session, *, tenant: str, event: WebhookEvent) -> list[WebhookEndpointRow]:
    return [row for row in list_endpoints(db, tenant=tenant) if str(event) in row.events]


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
) -> None:
    """One attempt; a 2xx (`delivered`) also ends the delivery."""
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
    db.execute(update(WebhookDeliveryRow).where(WebhookDeliveryRow.id == delivery_id).values(**values))
    db.commit()


def give_up(db: Session, *, delivery_id: str, error: str) -> None:
    """No more attempts: the delivery failed (unless one attempt got through after all)."""
    db.execute(
        update(WebhookDeliveryRow)
        .where(WebhookDeliveryRow.id == delivery_id, WebhookDeliveryRow.status == DeliveryStatus.PENDING)
        .values(status=DeliveryStatus.FAILED, finished_at=utcnow(), error=error)
    )
    db.commit()


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
