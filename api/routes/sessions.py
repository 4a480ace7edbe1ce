"""`/v1/sessions`: live sessions. The client streams speech in over a WebSocket while viewers watch the HLS stream a
few seconds behind.

The audio socket `WS /v1/sessions/{id}/audio` takes the key's `Authorization` header, or, from a browser (whose
WebSocket cannot send headers), `?ticket=` with a single-use ticket: `audio_ticket` in the answer that creates
the session, or a fresh one from `POST /v1/sessions/{id}/ticket`. Framing:
- the server first sends `{"type": "ready", "samples": n, "seconds": s}`: the audio stored so far (0 on the first
  socket; on a reconnect, where to continue: send the audio from sample n on);
- optional first text message `{"type": "start", "sample_rate": 16000, "channels": 1, "format": "s16le", "realtime":
  false}` (other rates and stereo are resampled to 16 kHz mono; without it the stream must be 16 kHz mono; with
  `realtime` true, for conversations, the server stores silence while the client sends nothing, keeping the audio
  within 0.5 s of the wall clock, so the avatar idles, blinking and swaying, instead of stalling; it counts as audio
  for the session's length, not for its idle timeout);
- binary messages: raw PCM, signed 16-bit little-endian, channels interleaved, whole samples only;
- text `{"type": "interrupt"}` (barge-in): the audio not yet spoken is dropped: what the workflow has not been told
  of yet (so not planned) and what the server holds unstored; answered `{"type": "interrupted", "samples": n, "at":
  a, "dropped": d}` (the interrupt point a; the d stored samples after it read as silence: the mouth is at rest
  within 100 ms of media time after a, the dropped audio is never heard; later audio follows them);
- text `{"type": "end"}`: no more audio; the session finishes its last chunks and completes.
The server answers `{"type": "ack", "samples": n, "seconds": s}` once audio up to n samples (16 kHz) is stored (it
stores 0.1 s pieces, so up to 0.1 s may wait for the next message), and `{"type": "ended", "samples": n,
"seconds": s}` (with a `message` saying why when the client did not send `end`) before closing with 1000 once the
session's audio is over. The session then completes with the audio it has. Besides `end`, that happens after no
audio (non-empty binary messages; `start` and empty ones do not count) for MONOLOGUE_RENDER__LIVE_IDLE_TIMEOUT_S,
and once the session has lived, or its audio lasts, MONOLOGUE_LIMITS__MAX_LIVE_SECONDS (its workflow enforces the
lifetime too). A socket that closes without `end` does not end the session: a client may reconnect within the idle
timeout and continue after the last acknowledged sample (the new socket's `ready` says which); otherwise the
workflow's idle timeout ends it with the audio stored. Refusals send `{"type": "error", "message": ...}` and close
with 4400 (bad input), 4401 (no valid key or ticket, or the key was revoked while the socket was open), 4404 (no
such live session), 4409 (another socket is open, or the session or its audio has ended) or 4429 (the key holds
MONOLOGUE_LIMITS__MAX_STREAMS_PER_KEY streams already). The open socket re-checks its key and its session every
MONOLOGUE_API__KEY_RECHECK_S.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, File, HTTPException, Request, Response, UploadFile, WebSocket, status
from fastapi.concurrency import run_in_threadpool

from monologue import audio_tickets, contracts as c
from monologue.schemas import AudioTicket, LiveSessionCreate, RenderPublic

from ..create import avatar_input, create, read_inputs
from ..create_json import json_create
from ..deps import DbDep, Principal, Services, ServicesDep, TenantDep, principal_from_headers
from ..inputs import OptionFields, validated_options
from ..integration import IntegrationFields, checked
from ..live_socket import CLOSE_UNAUTHORIZED, AudioRefused, serve
from ..openapi import json_body
from ..origin import public_ws_base
from ..submit import TERMINAL
from ..views import find, shown
from .renders import (
    CONFLICT,
    CREATE_REFUSALS,
    NOT_FOUND,
    AvatarId,
    IdempotencyKey,
    PortraitUrl,
    answers,
    created_answer,
    operation_id,
)

router = APIRouter(prefix="/v1/sessions", tags=["live sessions"], generate_unique_id_function=operation_id)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RenderPublic,
    responses=CREATE_REFUSALS,
    openapi_extra=json_body(LiveSessionCreate),
)
async def create_session(
    request: Request,
    response: Response,
    services: ServicesDep,
    principal: TenantDep,
    fields: OptionFields,
    integration: IntegrationFields,
    idempotency_key: IdempotencyKey = None,
    portrait: Annotated[UploadFile | None, File(description="Portrait image: PNG, JPEG, WebP…")] = None,
    portrait_url: PortraitUrl = None,
    avatar_id: AvatarId = None,
) -> RenderPublic:
    """Start a live session; stream its audio to `links.audio` (or `audio_ticket.url` from a browser) and watch
    `links.stream` (or hand `links.playback.stream` to viewers).

    Everything else about the session (progress, events, cancel, resume, the final video) is under
    `/v1/renders/{id}`, as for a render. The portrait comes as for a render: a file, `portrait_url`, JSON, or
    `avatar_id`; from an avatar, nothing is left to check and the session starts sooner."""
    tenant = principal.tenant or "local"
    body = await json_create(request, LiveSessionCreate)
    fields = body.fields if body is not None else fields
    fields = _live_defaults(services, fields, tenant=tenant, scopes=principal.scopes)
    options = validated_options(services, fields, tenant=tenant, scopes=principal.scopes)
    if options.captions is not c.CaptionMode.NONE:  # captions are made from the whole speech, before the first chunk
        raise HTTPException(422, "captions: live sessions have no captions (their speech is not known in advance)")
    if options.transcript.strip():  # alignment needs the whole speech, which a live session does not have yet
        raise HTTPException(422, "transcript: live sessions recognise phones as the speech arrives; leave it out")
    if options.text.strip() or "voice" in fields:  # a live session's speech is the audio streamed into it
        raise HTTPException(422, "text, voice: a live session speaks the audio sent over its socket; leave them out")
    attached = await checked(services, body.integration if body is not None else integration, tenant=tenant)
    if body is not None:
        inputs = await body.inputs(services, tenant=tenant)
    else:
        limit = services.settings.limits.max_upload_bytes
        inputs = avatar_input(avatar_id, uploaded=portrait is not None or bool(portrait_url))
        inputs += await read_inputs({} if inputs else {"portrait": (portrait, portrait_url)}, limit=limit)
    created = await create(
        services,
        kind=c.SessionKind.LIVE,
        tenant=tenant,
        options=options,
        given=fields,
        inputs=inputs,
        idempotency_key=idempotency_key,
        integration=attached,
    )
    answer = await created_answer(response, services, created, principal)
    answer.audio_ticket = await run_in_threadpool(_ticket, services, created.session_id, principal)
    return answer


# With delivery=webrtc a live session makes small chunks, so each goes out as soon as its audio is stored (a frame waits
# for at most 6 frames' audio: glass-to-glass p95 456 ms in Chromium against 550 with 8; 4-frame chunks fell behind
# real time on a loaded 2-core node: each chunk costs its workflow and activity round trips). Warp's N chunks carry
# all the motion across a seam (their anchors), so warp needs no I chunks there: an I chunk is generated after the N
# chunk that follows it (it needs that chunk's first frame), so its frames would wait for that chunk's audio too. The
# other families keep I chunks of a latent's frames. Lips follow loudness: visemes read fixed 1 s phone windows
# (`monologue.phone_windows`), 0.3-1.3 s of audio past a frame, far beyond a conversation's latency. Measured in
# docs/benchmarks.md ("Small live chunks", "6-frame live chunks").
WEBRTC_CHUNKS = {"chunk_frames": 6, "i_frames": 0, "first_chunk_frames": 6}
WEBRTC_LIP_SYNC = c.LipSync.LOUDNESS


def _live_defaults(
    services: Services, fields: dict[str, Any], *, tenant: str, scopes: tuple[str, ...]
) -> dict[str, Any]:
    """A live session's options as given, with what the client left out of them for a live session: the first
    chunk short (a setting) on the grid of the session's family (16 frames become 17 for infinitetalk's Wan VAE);
    with webrtc, small chunks (`WEBRTC_CHUNKS`, on the family's grid) and `WEBRTC_LIP_SYNC` too."""
    if {"first_chunk_frames", "chunk_frames", "i_frames", "lip_sync"} <= fields.keys():
        return fields
    derived = {**fields, "first_chunk_frames": fields.get("first_chunk_frames", 0)}  # 0 ("derived"): any family
    base = validated_options(services, derived, tenant=tenant, scopes=scopes)
    family, stride = base.family, base.family.temporal_stride
    defaults: dict[str, Any] = {
        "first_chunk_frames": family.first_chunk_on_grid(services.settings.render.live_first_chunk_frames)
    }
    if base.delivery is c.Delivery.WEBRTC:
        defaults = {name: -(-size // stride) * stride for name, size in WEBRTC_CHUNKS.items()}
        defaults["first_chunk_frames"] = family.first_chunk_on_grid(WEBRTC_CHUNKS["first_chunk_frames"])
        defaults["lip_sync"] = WEBRTC_LIP_SYNC
        if family is not c.Family.WARP:  # their N chunks do not carry all the motion across a seam
            defaults["i_frames"] = max(defaults["i_frames"], stride)
    return {**defaults, **fields}


@router.get("/{session_id}", response_model=RenderPublic, responses=NOT_FOUND)
def get_session(session_id: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> RenderPublic:
    """The live session (the same as `/v1/renders/{id}`), with its latency figures."""
    return shown(db, services, session_id, principal)


@router.post(
    "/{session_id}/ticket",
    status_code=status.HTTP_201_CREATED,
    response_model=AudioTicket,
    responses=answers(NOT_FOUND, CONFLICT),
)
def create_audio_ticket(session_id: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> AudioTicket:
    """A fresh single-use ticket for the session's audio socket (to reconnect from a browser, say)."""
    row = find(db, session_id, principal)
    if row.kind != c.SessionKind.LIVE or row.status in TERMINAL:
        raise HTTPException(409, f"session {session_id} is a {row.kind} that is {row.status}: it takes no audio")
    return _ticket(services, session_id, principal)


def _ticket(services: Services, session_id: str, principal: Principal) -> AudioTicket:
    with services.sessions() as db:
        ticket, expires = audio_tickets.issue(
            db,
            session_id=session_id,
            tenant=principal.tenant or "local",
            key_id=principal.key_id,
            ttl_s=services.settings.links.ticket_ttl_s,
        )
    url = f"{public_ws_base(services.settings.api)}/v1/sessions/{session_id}/audio?ticket={quote(ticket)}"
    return AudioTicket(ticket=ticket, url=url, expires_at=expires)


@router.websocket("/{session_id}/audio")
async def session_audio(websocket: WebSocket, session_id: str) -> None:
    """Stream a live session's speech in (framing in this module's docstring)."""
    services: Services = websocket.app.state.services
    await websocket.accept()
    try:
        principal = await run_in_threadpool(_caller, services, websocket, session_id)
    except AudioRefused as refused:
        await websocket.send_json(refused.message())
        await websocket.close(refused.code)
        return
    await serve(websocket, services, session_id, principal)


def _caller(services: Services, websocket: WebSocket, session_id: str) -> Principal:
    """Who opens the socket: the key in its Authorization header, or the tenant of a valid ticket (used up now)."""
    ticket = websocket.query_params.get("ticket")
    if ticket is not None and websocket.headers.get("authorization") is None:
        with services.sessions() as db:
            row = audio_tickets.redeem(db, ticket=ticket, session_id=session_id)
        if row is None:
            raise AudioRefused(
                "the ticket is not valid for this session (expired, used already, or another session's); ask"
                f" POST /v1/sessions/{session_id}/ticket for a new one",
                CLOSE_UNAUTHORIZED,
                ends_session=False,
            )
        return Principal(tenant=row.tenant, scopes=(), key_id=row.key_id)
    try:
        return principal_from_headers(services, websocket.headers.get("authorization"))
    except HTTPException as err:
        raise AudioRefused(str(err.detail), CLOSE_UNAUTHORIZED, ends_session=False) from None
