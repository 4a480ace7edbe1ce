"""`/v1/webhooks`: a tenant's webhook endpoints (the secret is shown once, in the answer that creates one) and the
deliveries made to them, each with every attempt. What is sent and how is `monologue/webhooks/`'s; delivery runs
on the nodes.

Only the create is async, for its name look-up; it takes no request-scoped session, and its database work is one
short transaction on the thread pool: a create waiting for a connection must not stall the event loop, nor hold
one across the look-up."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status
from sqlalchemy.orm import Session

from monologue import outbound, webhooks
from monologue.db import WebhookAttemptRow, WebhookDeliveryRow, WebhookEndpointRow
from monologue.repo import webhooks as repo_webhooks
from monologue.repo.webhooks import DeliveryFilter
from monologue.schemas import (
    WebhookAttempt,
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookEndpointCreate,
    WebhookEndpointCreated,
    WebhookEndpointList,
    WebhookEndpointPublic,
    WebhookEvent,
)
from monologue.settings import Settings
from monologue.webhooks import encryption as webhook_secrets

from ..deps import DbDep, ServicesDep, TenantDep, with_db
from .renders import operation_id

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], generate_unique_id_function=operation_id)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WebhookEndpointCreated, responses={422: {}})
async def create_webhook(
    endpoint: WebhookEndpointCreate, services: ServicesDep, principal: TenantDep
) -> WebhookEndpointCreated:
    """Send this tenant's session events to `url`, signed per Standard Webhooks with the secret in this answer
    (shown only here: keep it)."""
    tenant = principal.tenant or "local"
    problem = webhooks.url_refusal(endpoint.url, tenant=tenant, settings=services.settings)
    if problem is None:  # a first look at where it resolves; each delivery checks the address it connects to
        problem = await outbound.destination_refusal(endpoint.url, services.settings.outbound)
    if problem is not None:
        raise HTTPException(422, problem)
    try:
        row, secret = await with_db(services, _create, tenant=tenant, endpoint=endpoint, settings=services.settings)
    except repo_webhooks.EndpointLimitReached as err:
        raise HTTPException(422, str(err)) from None
    return WebhookEndpointCreated(**_endpoint(row).model_dump(), secret=secret)


def _create(
    db: Session, *, tenant: str, endpoint: WebhookEndpointCreate, settings: Settings
) -> tuple[WebhookEndpointRow, str]:
    return repo_webhooks.create_endpoint_within_limit(
        db,
        tenant=tenant,
        url=endpoint.url,
        events=endpoint.events,
        limit=settings.webhooks.max_endpoints,
        keys=webhook_secrets.keyring(settings),  # the first call may make the key file: not on the event loop
    )


@router.get("", response_model=WebhookEndpointList)
def list_webhooks(db: DbDep, principal: TenantDep) -> WebhookEndpointList:
    """The tenant's endpoints (never their secrets)."""
    return WebhookEndpointList(
        items=[_endpoint(row) for row in repo_webhooks.list_endpoints(db, tenant=principal.tenant)]
    )


@router.delete("/{endpoint_id}", status_code=status.HTTP_204_NO_CONTENT, responses={404: {}})
def delete_webhook(endpoint_id: str, db: DbDep, principal: TenantDep) -> Response:
    """Stop sending to the endpoint and forget its secret; its deliveries stay listed, those still being tried
    stop."""
    if not repo_webhooks.disable_endpoint(db, tenant=principal.tenant, endpoint_id=endpoint_id):
        raise HTTPException(404, f"webhook endpoint {endpoint_id!r} not found")
    return Response(status_code=204)


@router.get("/deliveries", response_model=WebhookDeliveryList, responses={422: {}})
def list_webhook_deliveries(
    db: DbDep,
    principal: TenantDep,
    session_id: Annotated[str | None, Query(max_length=64, description="Only this session's.")] = None,
    endpoint_id: Annotated[str | None, Query(max_length=32, description="Only this endpoint's.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> WebhookDeliveryList:
    """The tenant's deliveries, newest first, each with every attempt (when, how long, what came back)."""
    where = DeliveryFilter(tenant=principal.tenant, session_id=session_id, endpoint_id=endpoint_id)
    return delivery_list(repo_webhooks.list_deliveries(db, where=where, limit=limit))


def delivery_list(found: list[tuple[WebhookDeliveryRow, list[WebhookAttemptRow]]]) -> WebhookDeliveryList:
    """Deliveries as the API shows them (also to operators, in /ops)."""
    return WebhookDeliveryList(
        items=[
            WebhookDelivery(
                id=row.id,
                endpoint_id=row.endpoint_id,
                session_id=row.session_id,
                event=row.event,
                status=row.status,
                created_at=row.created_at,
                finished_at=row.finished_at,
                error=row.error,
                attempts=[
                    WebhookAttempt(
                        attempt=attempt.attempt,
                        started_at=attempt.started_at,
                        duration_ms=attempt.duration_ms,
                        status_code=attempt.status_code,
                        error=attempt.error,
                    )
                    for attempt in attempts
                ],
            )
            for row, attempts in found
        ]
    )


def _endpoint(row: WebhookEndpointRow) -> WebhookEndpointPublic:
    events = [WebhookEvent(event) for event in row.events]
    return WebhookEndpointPublic(id=row.id, url=row.url, events=events, created_at=row.created_at)
