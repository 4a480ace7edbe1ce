"""A create's `metadata` and `callback_url` (`schemas.Integration`): read from the multipart form (the metadata as a
JSON string) or the JSON body, checked before anything is written (a 422 naming the field), and recorded with the
session: the metadata on its row, the callback_url as an endpoint of that session alone (`repo.webhooks`), so its
messages take the path of a tenant endpoint's (the same URL rules, signing, delivery workflow, retries and
delivery log). Its secret is the endpoint's own, made with it and shown in the create's answer.

Neither is a render option: the node never sees them, and they change no frame."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Form, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from monologue import outbound, webhooks
from monologue.repo import webhooks as repo_webhooks
from monologue.schemas import CALLBACK_DOC, METADATA_DOC, Integration
from monologue.webhooks import encryption as webhook_secrets

from .deps import Services
from .inputs import parse_json
from .problems import describe_errors


def integration_form(
    metadata: Annotated[str | None, Form(description=f"{METADATA_DOC} As a JSON string.")] = None,
    callback_url: Annotated[str | None, Form(description=CALLBACK_DOC)] = None,
) -> dict[str, Any]:
    """The multipart form's integration fields the client sent (checked by `checked`)."""
    given: dict[str, Any] = {}
    if metadata is not None and metadata.strip():
        try:
            given["metadata"] = parse_json(metadata)
        except ValueError as err:
            raise HTTPException(422, f"metadata: {err}") from None
    if callback_url is not None:
        given["callback_url"] = callback_url
    return given


IntegrationFields = Annotated[dict[str, Any], Depends(integration_form)]


async def checked(services: Services, given: dict[str, Any], *, tenant: str) -> Integration:
    """`given` as an Integration: 422 naming the field for metadata out of its bounds, or a callback_url the
    tenant's webhook endpoints could not have (MONOLOGUE_WEBHOOKS__ALLOWED_URLS, a public address)."""
    try:
        integration = Integration.model_validate(given)
    except ValidationError as err:
        raise HTTPException(422, describe_errors(err.errors())) from None
    url = integration.callback_url
    if url is not None:
        settings = services.settings
        problem = webhooks.url_refusal(url, tenant=tenant, settings=settings, what="callback_url")
        if problem is None:  # a first look at where it resolves; each delivery checks the address it connects to
            problem = await outbound.destination_refusal(url, settings.outbound, what="callback_url")
        if problem is not None:
            raise HTTPException(422, problem)
    return integration


def record_callback(services: Services, *, session_id: str, tenant: str, integration: Integration) -> None:
    """The session's own endpoint, once its row is written (it goes with the row: ON DELETE CASCADE). Blocking."""
    if integration.callback_url is None:
        return
    with services.sessions() as db:
        repo_webhooks.create_session_endpoint(
            db,
            tenant=tenant,
            session_id=session_id,
            url=integration.callback_url,
            keys=webhook_secrets.keyring(services.settings),
        )


async def callback_secret(services: Services, session_id: str) -> str | None:
    """The secret of the session's callbacks, for the create's answer (None: no callback_url)."""

    def read() -> str | None:
        with services.sessions() as db:
            keys = webhook_secrets.keyring(services.settings)
            return repo_webhooks.session_secret(db, session_id=session_id, keys=keys)

    return await run_in_threadpool(read)
