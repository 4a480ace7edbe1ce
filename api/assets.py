"""Uploaded assets (`POST /v1/assets`): a portrait or speech stored once and named by id in later JSON creates
(`{"asset_id": …}`), so a client can send JSON and reuse a file across sessions.

An asset is stored as uploaded under its tenant (`monologue.keys.asset`); the key's last part is its kind, so no
database row is needed and another tenant's id finds nothing. It is not checked here: a create that uses it hands
its bytes to the same node check as an upload (`api/submit.py`), with the same limits. Every function here touches
storage: coroutines call them on the thread pool."""

from __future__ import annotations

import hashlib
import re
import time

from fastapi import HTTPException

from monologue import keys
from monologue.schemas import AssetKind, AssetPublic

from .deps import Services

ASSET_ID = re.compile(r"[0-9a-f]{32}")  # what `store` makes; anything else names no asset (and no odd object key)


def store(services: Services, *, tenant: str, kind: AssetKind, data: bytes) -> AssetPublic:
    """Keep `data` as a new asset of `tenant`."""
    asset_id = keys.new_asset_id(time.time())
    services.store.put(keys.asset(tenant, asset_id, kind.value), data)
    return AssetPublic(id=asset_id, kind=kind, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def load(services: Services, *, tenant: str, asset_id: str, kind: AssetKind, where: str) -> bytes:
    """The bytes of the tenant's asset of `kind`; 422 naming `where` the id was given (`body.portrait.asset_id`) if
    the tenant has no such asset or it is of another kind."""
    if ASSET_ID.fullmatch(asset_id):
        if services.store.exists(keys.asset(tenant, asset_id, kind.value)):
            return services.store.get(keys.asset(tenant, asset_id, kind.value))
        other = next((k for k in AssetKind if services.store.exists(keys.asset(tenant, asset_id, k.value))), None)
        if other is not None:
            raise HTTPException(
                422,
                f"{where}: asset {asset_id!r} was uploaded with kind={other.value}; this input needs one of"
                f" kind={kind.value}",
            )
    raise HTTPException(
        422, f"{where}: no asset {asset_id!r} for this key's tenant; upload the file with POST /v1/assets"
    )


def delete(services: Services, *, tenant: str, asset_id: str) -> bool:
    """Remove the tenant's asset; False if it has none of that id. Sessions made from it keep their own copies."""
    if not ASSET_ID.fullmatch(asset_id):
        return False
    return services.store.delete_prefix(keys.asset_prefix(tenant, asset_id)) > 0
