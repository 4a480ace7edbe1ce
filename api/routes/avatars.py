"""`/v1/avatars`: portraits checked once (decoded, normalised, the face found, on a node) and named by `avatar_id`
in later creates instead of a portrait. The work is `api.avatars`'s."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, HTTPException, Query, Request, Response, UploadFile, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict

from monologue.errors import InputError, InputTooLarge
from monologue.schemas import AvatarList, AvatarPublic, InputRef

from .. import avatars
from ..create import read_upload
from ..create_json import json_create
from ..deps import ServicesDep, TenantDep
from ..openapi import json_body
from ..url_inputs import fetch_input
from .renders import MAX_OFFSET, Responses, answers, operation_id

router = APIRouter(prefix="/v1/avatars", tags=["avatars"], generate_unique_id_function=operation_id)
AVATAR_NOT_FOUND: Responses = {404: {"description": "No such avatar for this key's tenant."}}
IN_USE: Responses = {409: {"description": "Sessions made from the avatar have not ended (the message names them)."}}


class AvatarCreate(BaseModel):
    """An avatar from a portrait by URL or an uploaded asset (`POST /v1/assets`)."""

    model_config = ConfigDict(extra="forbid")

    portrait: InputRef


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=AvatarPublic,
    responses={413: {}, 422: {}, 503: {"description": "No node checked the portrait in time."}},
    openapi_extra=json_body(AvatarCreate),
)
async def create_avatar(
    request: Request,
    services: ServicesDep,
    principal: TenantDep,
    portrait: Annotated[UploadFile | None, File(description="Portrait image: PNG, JPEG, WebP…")] = None,
) -> AvatarPublic:
    """Check a portrait once (its face found, on a node) and keep it: its `id` goes in creates as `avatar_id`
    instead of a portrait. Multipart: the `portrait` file. JSON: `{"portrait": {"url": …}}` or
    `{"portrait": {"asset_id": …}}`. A portrait with no usable face is a 422 and nothing is kept."""
    tenant = principal.tenant or "local"
    body = await json_create(request, AvatarCreate)
    try:
        if body is not None:
            (given,) = await body.inputs(services, tenant=tenant)  # its bytes, or its URL to fetch
            data = given.data or await fetch_input(services, given.url or "", "portrait", tenant)
        elif portrait is not None:
            data = await read_upload("portrait", portrait, limit=services.settings.limits.max_upload_bytes)
        else:
            raise HTTPException(422, "portrait: send the portrait image as the `portrait` file, or JSON")
        return await avatars.create(services, tenant=tenant, portrait=data)
    except InputTooLarge as err:
        raise HTTPException(413, str(err)) from err
    except InputError as err:
        raise HTTPException(422, str(err)) from err


@router.get("", response_model=AvatarList, responses={422: {}})
def list_avatars(
    services: ServicesDep,
    principal: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> AvatarList:
    """The key's tenant's avatars, newest first."""
    items = avatars.page(services, tenant=principal.tenant or "local", limit=limit, offset=offset)
    return AvatarList(items=items, limit=limit, offset=offset)


@router.get("/{avatar_id}", response_model=AvatarPublic, responses=AVATAR_NOT_FOUND)
def get_avatar(avatar_id: str, services: ServicesDep, principal: TenantDep) -> AvatarPublic:
    """The avatar."""
    return avatars.get(services, tenant=principal.tenant or "local", avatar_id=avatar_id)


@router.delete("/{avatar_id}", status_code=status.HTTP_204_NO_CONTENT, responses=answers(AVATAR_NOT_FOUND, IN_USE))
async def delete_avatar(avatar_id: str, services: ServicesDep, principal: TenantDep) -> Response:
    """Remove the avatar and its objects. Refused (409) while a session made from it has not ended; sessions keep
    their own copy of the portrait, so ended ones (and their resumes) are unaffected."""
    try:
        found = await run_in_threadpool(
            avatars.delete, services, tenant=principal.tenant or "local", avatar_id=avatar_id
        )
    except avatars.AvatarInUse as err:
        raise HTTPException(409, str(err)) from err
    if not found:
        raise HTTPException(404, f"avatar {avatar_id!r} not found")
    return Response(status_code=204)
