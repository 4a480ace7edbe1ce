"""Create bodies as JSON (`Content-Type: application/json`), beside multipart: each input by URL or by the id of
an asset uploaded earlier (`POST /v1/assets`), the options as the same fields as the form (`schemas.RenderCreate`,
derived from `contracts.RenderOptions`). Read here into what the multipart path hands `api.create`: the option
fields the client sent and the inputs. Nothing is written while a body is read: a bad one is a 422 naming the
field (`body.portrait: give its url or its asset_id, not both`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from monologue.schemas import AssetKind, InputRef, Integration

from . import assets
from .create import AVATAR, Input, avatar_input
from .deps import Services
from .inputs import parse_json

JSON = "application/json"


@dataclass(frozen=True)
class JsonCreate:
    """A JSON create body, read: the option fields sent (as the form gives them), each input's reference, and the
    integration fields sent (`metadata`, `callback_url`: not options)."""

    fields: dict[str, Any]
    refs: dict[str, InputRef]
    integration: dict[str, Any]
    avatar_id: str | None = None  # instead of the portrait (`api.avatars`)

    async def inputs(self, services: Services, *, tenant: str) -> list[Input]:
        """Each input: its URL noted (fetched once the request owns its Idempotency-Key), its asset's bytes, or the
        avatar named instead of the portrait (exactly one of portrait and avatar_id: a 422 otherwise)."""
        avatar = avatar_input(self.avatar_id, uploaded="portrait" in self.refs, where="body.")
        if not avatar and "portrait" not in self.refs:
            raise HTTPException(422, 'body.portrait: give {"url": …} or {"asset_id": …}, or body.avatar_id')
        return [await _input(services, field, ref, tenant) for field, ref in self.refs.items()] + avatar


async def json_create(request: Request, model: type[BaseModel]) -> JsonCreate | None:
    """The request's JSON body as `model` (`RenderCreate`, `LiveSessionCreate`); None for any other content type
    (multipart, read by FastAPI from the route's form fields)."""
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != JSON:
        return None
    try:
        data = parse_json((await request.body()).decode())
    except (UnicodeDecodeError, ValueError) as err:
        raise HTTPException(422, f"body: {err}") from None
    try:
        body = model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors()]) from None
    names = [name for name, field in model.model_fields.items() if field.annotation in (InputRef, InputRef | None)]
    fields = body.model_dump(mode="json", exclude_none=True, exclude={*names, *Integration.model_fields, AVATAR})
    integration = body.model_dump(mode="json", exclude_none=True, include=set(Integration.model_fields))
    refs = {name: getattr(body, name) for name in names if getattr(body, name) is not None}  # inputs left out: none
    return JsonCreate(fields=fields, refs=refs, integration=integration, avatar_id=getattr(body, AVATAR, None))


async def _input(services: Services, field: str, ref: InputRef, tenant: str) -> Input:
    if ref.url is not None:
        return Input(field, url=ref.url.strip())
    where = f"body.{field}.asset_id"
    data = await run_in_threadpool(
        assets.load, services, tenant=tenant, asset_id=ref.asset_id or "", kind=AssetKind(field), where=where
    )
    return Input(field, data=data)
