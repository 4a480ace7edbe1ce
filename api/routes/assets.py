"""`/v1/assets`: files uploaded once (a portrait or speech) and named by id in JSON creates
(`{"portrait": {"asset_id": …}}` in `POST /v1/renders` or `/v1/sessions`). Storage is `api.assets`'s."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, HTTPException, Response, UploadFile, status
from fastapi.concurrency import run_in_threadpool

from monologue.schemas import AssetKind, AssetPublic

from .. import assets
from ..create import read_upload
from ..deps import ServicesDep, TenantDep
from .renders import NOT_FOUND, operation_id

router = APIRouter(prefix="/v1/assets", tags=["assets"], generate_unique_id_function=operation_id)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=AssetPublic, responses={413: {}, 422: {}})
async def create_asset(
    services: ServicesDep,
    principal: TenantDep,
    kind: Annotated[AssetKind, Form(description=AssetKind.__doc__)],
    file: Annotated[UploadFile, File(description="The portrait image or the speech, as for an upload.")],
) -> AssetPublic:
    """Upload a file for later creates; its `id` goes in a JSON create body (`{"asset_id": …}`). It is checked
    when a create uses it, like an upload."""
    data = await read_upload("file", file, limit=services.settings.limits.max_upload_bytes)
    return await run_in_threadpool(assets.store, services, tenant=principal.tenant or "local", kind=kind, data=data)


@router.delete("/{asset_id}", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND)
def delete_asset(asset_id: str, services: ServicesDep, principal: TenantDep) -> Response:
    """Remove the asset; sessions made from it keep their own copies."""
    if not assets.delete(services, tenant=principal.tenant or "local", asset_id=asset_id):
        raise HTTPException(404, f"asset {asset_id!r} not found")
    return Response(status_code=204)
