"""Creating a session from a request: inputs uploaded, given by URL or by an uploaded asset's id (a JSON body:
`api/create_json.py`), and the request's `Idempotency-Key`.

Order: the options (and the metadata and callback_url: `api.integration`) are validated; the inputs are read
(uploads) or only noted (URLs); the request's fingerprint (SHA-256 over its kind, options, inputs: the uploads'
bytes, the URLs as given, and its metadata and callback_url) claims the idempotency key; only a request that owns
its key fetches its URL inputs and goes on to `submit` (stage, check on a node, record, start). A retry with the
same key and request gets the first session (waiting for it while the first request is still checking its inputs);
with another request, a 422 saying so. A request that fails frees its key, so a retry of it starts afresh."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, UploadFile
from fastapi.concurrency import run_in_threadpool

from monologue import contracts as c, repo
from monologue.errors import InputError, InputTooLarge
from monologue.repo import idempotency as repo_idempotency
from monologue.repo.idempotency import Claimed
from monologue.schemas import Integration

from . import avatars
from .deps import Services
from .errors import IdempotencyConflict
from .submit import Uploads, start_session
from .url_inputs import fetch_input

IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces
_REPLAY_POLL_S = 0.2
_OR = {"audio": ", or the text to speak (text)", "portrait": ", or an avatar's id (avatar_id)"}  # what else may do
AVATAR = "avatar_id"  # the field naming an avatar (`api.avatars`) instead of the portrait


@dataclass(frozen=True)
class Input:
    """One input of a request: the bytes uploaded (or of the asset named), the URL to fetch them from, or the
    avatar whose portrait it takes."""

    field: str
    data: bytes | None = None
    url: str | None = None
    avatar: str | None = None

    def fingerprint(self) -> str:
        if self.avatar is not None:
            return f"avatar:{self.avatar}"
        return f"url:{self.url}" if self.url is not None else f"sha256:{hashlib.sha256(self.data or b'').hexdigest()}"


def avatar_input(avatar_id: str | None, *, uploaded: bool, where: str = "") -> list[Input]:
    """The avatar a create names instead of a portrait (none: []); 422 naming both fields if it sends both.
    `where`: the fields' prefix in the request (`body.` for JSON)."""
    if avatar_id is None:
        return []
    if uploaded:
        raise HTTPException(422, f"{where}portrait, {where}{AVATAR}: send a portrait or an avatar's id, not both")
    return [Input(AVATAR, avatar=avatar_id.strip())]


@dataclass(frozen=True)
class Created:
    session_id: str
    replayed: bool  # the Idempotency-Key named a session made by an earlier request


async def read_inputs(given: dict[str, tuple[UploadFile | None, str | None]], *, limit: int) -> list[Input]:
    """Each input from its two form fields (`portrait` and `portrait_url`): exactly one of them; a 422 names every
    input that has neither."""
    missing = [field for field, (upload, url) in given.items() if upload is None and not url]
    if missing:
        raise HTTPException(
            422,
            "; ".join(
                f"{field}: send the file ({field}) or its URL ({field}_url){_OR.get(field, '')}" for field in missing
            ),
        )
    return [await _read_input(field, upload, url, limit=limit) for field, (upload, url) in given.items()]


def spoken_from_text(options: c.RenderOptions, given: dict[str, Any], *, audio: bool) -> bool:
    """Whether a render's speech is its `text` (synthesised on a node) rather than an audio input: one or the other,
    and a voice only with text (422 naming the fields)."""
    text = bool(options.text.strip())
    if text and audio:
        raise HTTPException(422, "text, audio: send the speech as audio or as text to synthesise, not both")
    if not text and "voice" in given:
        raise HTTPException(422, "voice: the voice is what text is spoken in; send it with text, or leave it out")
    return text


async def _read_input(field: str, upload: UploadFile | None, url: str | None, *, limit: int) -> Input:
    if upload is not None and url:
        raise HTTPException(422, f"{field}: send the file or {field}_url, not both")
    if upload is None:
        return Input(field, url=(url or "").strip())
    return Input(field, data=await read_upload(field, upload, limit=limit))


async def read_upload(field: str, upload: UploadFile, *, limit: int) -> bytes:
    """The uploaded file's bytes: 413 past `limit`, 422 if empty."""
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise HTTPException(
            413,
            f"{field}: the upload is larger than the limit of {limit} bytes"
            " (setting MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES)",
        )
    if not data:
        raise HTTPException(422, f"{field}: the uploaded file is empty")
    return data


async def create(
    services: Services,
    *,
    kind: c.SessionKind,
    tenant: str,
    options: c.RenderOptions,
    given: dict[str, Any],
    inputs: list[Input],
    idempotency_key: str | None,
    integration: Integration | None = None,
) -> Created:
    """Make the session (or find the one the key names); HTTPException for what the caller must fix.
    `integration`: its metadata and callback_url, checked already (`api.integration.checked`)."""
    session_id = uuid.uuid4().hex
    integration = integration or Integration()
    if idempotency_key is None:
        await _make(services, session_id, kind, tenant, options, inputs, integration)
        return Created(session_id, replayed=False)
    if not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
        raise HTTPException(422, "Idempotency-Key: 1 to 255 printable ASCII characters without spaces, e.g. a UUID")
    fingerprint = _fingerprint(kind, given, inputs, integration)
    deadline = time.monotonic() + services.settings.api.validate_timeout_s + 30
    while True:
        claim = await run_in_threadpool(_claim, services, tenant, idempotency_key, fingerprint, session_id)
        if claim.outcome == Claimed.MISMATCH:
            raise IdempotencyConflict(
                f"Idempotency-Key {idempotency_key!r} was used with a different request (other inputs, options,"
                " metadata or callback_url)"
                f" for session {claim.session_id}; send a new key for a new request"
            )
        if claim.outcome == Claimed.REPLAY:
            if await _made(services, tenant, idempotency_key, claim.session_id, deadline):
                return Created(claim.session_id, replayed=True)
            continue  # the first request failed and freed the key: this one makes the session
        try:
            await _make(services, session_id, kind, tenant, options, inputs, integration)
        except BaseException:
            await run_in_threadpool(_release, services, tenant, idempotency_key, session_id)
            raise
        return Created(session_id, replayed=False)


async def _make(
    services: Services,
    session_id: str,
    kind: c.SessionKind,
    tenant: str,
    options: c.RenderOptions,
    inputs: list[Input],
    integration: Integration,
) -> None:
    try:
        files = {
            item.field: item.data or await fetch_input(services, item.url or "", item.field, tenant)
            for item in inputs
            if item.avatar is None
        }
        named = next((item.avatar for item in inputs if item.avatar is not None), None)
        avatar = None
        if named is not None:
            avatar = await run_in_threadpool(avatars.used, services, tenant=tenant, avatar_id=named, where=AVATAR)
        uploads = Uploads(portrait=files.get("portrait"), audio=files.get("audio"), avatar=avatar)
        await start_session(
            services,
            session_id=session_id,
            uploads=uploads,
            options=options,
            tenant=tenant,
            kind=kind,
            integration=integration,
        )
    except InputTooLarge as err:
        raise HTTPException(413, str(err)) from err
    except InputError as err:
        raise HTTPException(422, str(err)) from err


async def _made(services: Services, tenant: str, key: str, session_id: str, deadline: float) -> bool:
    """Wait for the key's first request: True once its session row exists, False if it failed (the key is free)."""
    while time.monotonic() < deadline:
        exists, holder = await run_in_threadpool(_look, services, tenant, key, session_id)
        if exists:
            return True
        if holder != session_id:
            return False
        await asyncio.sleep(_REPLAY_POLL_S)
    raise HTTPException(
        409, f"the first request with Idempotency-Key {key!r} is still being checked; retry it in a few seconds"
    )


def _fingerprint(kind: c.SessionKind, given: dict[str, Any], inputs: list[Input], integration: Integration) -> str:
    request = {
        "kind": kind.value,
        "options": given,
        "inputs": {item.field: item.fingerprint() for item in inputs},
    }
    sent = integration.model_dump(mode="json", exclude_none=True)
    if sent:  # only then: a request without them keeps the fingerprint it had before they existed
        request["integration"] = sent
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def _claim(services: Services, tenant: str, key: str, fingerprint: str, session_id: str) -> repo_idempotency.Claim:
    with services.sessions() as db:
        return repo_idempotency.claim(
            db,
            tenant=tenant,
            key=key,
            request_sha256=fingerprint,
            session_id=session_id,
            ttl_s=services.settings.api.idempotency_ttl_s,
        )


def _look(services: Services, tenant: str, key: str, session_id: str) -> tuple[bool, str | None]:
    with services.sessions() as db:
        return repo.get_session(db, session_id=session_id) is not None, repo_idempotency.holder(
            db, tenant=tenant, key=key
        )


def _release(services: Services, tenant: str, key: str, session_id: str) -> None:
    with services.sessions() as db:
        repo_idempotency.release(db, tenant=tenant, key=key, session_id=session_id)
