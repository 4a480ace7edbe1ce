"""`prepare_avatar`, on the shared queue: decode an avatar's staged portrait, check it once for every family this
deployment renders (the warp family's check is its face search) and store its normalised form, which each session
made from the avatar copies instead of an upload of its own (`api/avatars.py`). Like `validate_inputs`, it runs on
a worker because the API process has no media stack; the staged upload is deleted once read (a photo's metadata
goes with it)."""

from __future__ import annotations

import functools
import hashlib

from temporalio import activity

from activities.errors import activity_context
from gpu_worker.models import build_family
from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.pipeline import ModelSet
from monologue import contracts as c, keys
from monologue.errors import NotFound
from monologue.media import decode_png, normalise_portrait
from monologue.storage import ObjectStore


class AvatarActivities:
    def __init__(self, *, store: ObjectStore) -> None:
        self._store = store

    @activity.defn(name=c.PREPARE_AVATAR)
    def prepare_avatar(self, request: c.PrepareAvatarInput) -> c.PrepareAvatarResult:
        """Normalise and check the staged portrait; an InputError (non-retryable) names the problem (no face)."""
        prefix = keys.avatar_prefix(request.tenant, request.avatar_id)
        with activity_context(avatar_id=request.avatar_id) as log:
            try:
                staged = self._store.get(keys.avatar_upload(request.tenant, request.avatar_id))
            except NotFound:  # a retry after the upload was replaced: its normalised form normalises to itself
                staged = self._store.get(keys.avatar_portrait(prefix))
            portrait = normalise_portrait(staged, max_side=request.max_portrait_side)
            pixels = decode_png(portrait.png)
            for models in _families():
                models.reference.check(pixels)  # e.g. no face: NoFaceFound
            self._store.put(keys.avatar_portrait(prefix), portrait.png, content_type="image/png")
            self._store.delete(keys.avatar_upload(request.tenant, request.avatar_id))
            log.info("avatar prepared", width=portrait.width, height=portrait.height)
            return c.PrepareAvatarResult(
                width=portrait.width, height=portrait.height, portrait_sha256=hashlib.sha256(portrait.png).hexdigest()
            )


@functools.cache
def _families() -> tuple[ModelSet, ...]:
    """Every family this node can build (modules, no weights), once per process: an avatar may serve any of them.
    A family without weights here (infinitetalk unconfigured) is skipped: its sessions are refused anyway."""
    built = []
    for family in c.Family:
        try:
            built.append(build_family(family))
        except CheckpointError:
            continue
    return tuple(built)
