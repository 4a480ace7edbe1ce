"""Avatars (`/v1/avatars`): a portrait uploaded once, checked once on a node (decoded, normalised, its face found:
`prepare_avatar`) and named by id in later creates (`avatar_id`) instead of an upload.

A session made from an avatar copies the avatar's normalised portrait into its own prefix (so it outlives the
avatar, and a resume or a rebuild on another node reads the same bytes as from an upload of that portrait) and
records the avatar's prefix (`keys.session_avatar`): its node takes the avatar's reference conditioning for the
session's family and output shape from there when a session before encoded it, and leaves it there otherwise
(`activities/session_cache.py`). A live session from an avatar asks no node to check anything.

An avatar's objects live under `keys.avatar_prefix`; its row (`db.AvatarRow`) says it exists, so an avatar whose
making failed half-way is no avatar, and its objects are removed with the failure. Functions that touch the database
or storage are blocking: coroutines call them on the thread pool."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from fastapi import HTTPException

from monologue import contracts as c, keys
from monologue.db import AvatarRow
from monologue.errors import InputError, NotFound
from monologue.repo import avatars as repo_avatars
from monologue.schemas import AvatarPublic
from monologue.storage import ObjectStore

from .deps import Services
from .node_check import check_on_node

AVATAR_ID = re.compile(r"[0-9a-f]{32}")  # what `create` makes (`keys.new_asset_id`); anything else names none


@dataclass(frozen=True)
class UsedAvatar:
    """The avatar a new session is made from: where its objects are, and its portrait's size."""

    id: str
    prefix: str
    width: int
    height: int


class AvatarInUse(Exception):
    """Sessions made from the avatar have not ended (→ 409)."""


def public(row: AvatarRow) -> AvatarPublic:
    return AvatarPublic(
        id=row.id, created_at=row.created_at, width=row.width, height=row.height, portrait_sha256=row.portrait_sha256
    )


async def create(services: Services, *, tenant: str, portrait: bytes) -> AvatarPublic:
    """Stage the portrait, have a node check and normalise it, then record the avatar; on any failure (bad input:
    InputError → 422 naming `portrait`) everything written under its prefix is removed and no row is made."""
    avatar_id = keys.new_asset_id(time.time())
    prefix = keys.avatar_prefix(tenant, avatar_id)
    try:
        await asyncio.to_thread(services.store.put, keys.avatar_upload(tenant, avatar_id), portrait)
        request = c.PrepareAvatarInput(
            tenant=tenant, avatar_id=avatar_id, max_portrait_side=services.settings.limits.max_portrait_side
        )
        prepared = await check_on_node(
            services,
            c.PREPARE_AVATAR_WORKFLOW,
            request,
            workflow_id=c.prepare_avatar_workflow_id(avatar_id),
            result_type=c.PrepareAvatarResult,
            what="the portrait",
        )
        return await asyncio.to_thread(_record, services, tenant, avatar_id, prepared)
    except BaseException:
        # Shielded: a cancelled request still removes what it wrote.
        await asyncio.shield(asyncio.to_thread(services.store.delete_prefix, prefix))
        raise


def _record(services: Services, tenant: str, avatar_id: str, prepared: c.PrepareAvatarResult) -> AvatarPublic:
    with services.sessions() as db:
        row = repo_avatars.create_avatar(
            db,
            avatar_id=avatar_id,
            tenant=tenant,
            width=prepared.width,
            height=prepared.height,
            portrait_sha256=prepared.portrait_sha256,
        )
        return public(row)


def used(services: Services, *, tenant: str, avatar_id: str, where: str) -> UsedAvatar:
    """The tenant's avatar a create names; InputError naming `where` (`avatar_id`, `body.avatar_id`) if it has
    none of that id (another tenant's included: ids of others do not leak)."""
    row = None
    if AVATAR_ID.fullmatch(avatar_id):
        with services.sessions() as db:
            row = repo_avatars.get_avatar(db, tenant=tenant, avatar_id=avatar_id)
    if row is None:
        raise InputError(f"{where}: no avatar {avatar_id!r} for this key's tenant; make one with POST /v1/avatars")
    return UsedAvatar(id=row.id, prefix=keys.avatar_prefix(tenant, row.id), width=row.width, height=row.height)


def copy_to_session(store: ObjectStore, avatar: UsedAvatar, session_id: str) -> None:
    """The session's own copy of the avatar's portrait, and where its node finds the avatar's references."""
    try:
        portrait = store.get(keys.avatar_portrait(avatar.prefix))
    except NotFound:  # deleted since `used` found it
        raise InputError(f"avatar_id: avatar {avatar.id!r} was deleted; make one with POST /v1/avatars") from None
    store.put(keys.portrait(session_id), portrait, content_type="image/png")
    store.put(keys.session_avatar(session_id), avatar.prefix.encode(), content_type="text/plain")


def delete(services: Services, *, tenant: str, avatar_id: str) -> bool:
    """Remove the tenant's avatar (its row, then its objects); False if it has none of that id. AvatarInUse while a
    session made from it has not ended: its node may still read the avatar's references. Sessions that have ended
    keep their own copy of the portrait, so a resume of one still works after the avatar is gone."""
    if not AVATAR_ID.fullmatch(avatar_id):
        return False
    with services.sessions() as db:
        if repo_avatars.get_avatar(db, tenant=tenant, avatar_id=avatar_id) is None:
            return False
        using = repo_avatars.sessions_using(db, avatar_id=avatar_id)
        if using:
            raise AvatarInUse(
                f"avatar {avatar_id!r} is used by {len(using)} session(s) that have not ended ({', '.join(using[:5])});"
                " cancel them or wait for them to end, then delete it"
            )
        repo_avatars.delete_avatar(db, tenant=tenant, avatar_id=avatar_id)
    services.store.delete_prefix(keys.avatar_prefix(tenant, avatar_id))
    return True


def page(services: Services, *, tenant: str, limit: int, offset: int) -> list[AvatarPublic]:
    with services.sessions() as db:
        return [public(row) for row in repo_avatars.list_avatars(db, tenant=tenant, limit=limit, offset=offset)]


def get(services: Services, *, tenant: str, avatar_id: str) -> AvatarPublic:
    """The tenant's avatar; 404 for any other id."""
    row = None
    if AVATAR_ID.fullmatch(avatar_id):
        with services.sessions() as db:
            row = repo_avatars.get_avatar(db, tenant=tenant, avatar_id=avatar_id)
    if row is None:
        raise HTTPException(404, f"avatar {avatar_id!r} not found")
    return public(row)
