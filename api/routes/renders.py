"""`/v1/renders`: start a render, follow it, download the video. Routes stay thin: checks and side effects live in
`api.create`, `api.submit`, `api.files`, `api.events` and `monologue.repo`."""

from __future__ import annotations

from typing import Annotated, Any

from botocore.exceptions import ClientError
from fastapi import APIRouter, File, Form, Header, HTTPException, Query, Request, Response, UploadFile, status
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from monologue import captions, contracts as c, repo, sink_policy
from monologue.db import SessionRow
from monologue.repo import queue as repo_queue
from monologue.s3_presign import presigned_playlist, s3_client
from monologue.schemas import RenderCreate, RenderList, RenderPublic, VideoLayout

from .. import queue, streams
from ..create import Created, avatar_input, create, read_inputs, spoken_from_text
from ..create_json import json_create
from ..deps import DbDep, Principal, ServicesDep, TenantDep, with_db
from ..events import progress_events
from ..files import stream_file, video_file
from ..inputs import OptionFields, validated_options
from ..integration import IntegrationFields, callback_secret, checked
from ..openapi import json_body
from ..submit import TERMINAL, cancel_workflow, resume_workflow
from ..views import find, public, shown


def operation_id(route: APIRoute) -> str:
    """Stable, readable operationIds: the route function's name (`create_render`, `get_render`, …)."""
    return route.name


router = APIRouter(prefix="/v1/renders", tags=["renders"], generate_unique_id_function=operation_id)
PRESIGN_EXPIRES_S = 3600  # presigned sink playback links last an hour (players refetch the playlist)
MAX_OFFSET = 2**63 - 1  # SQL's BIGINT: a larger OFFSET fails in the database driver (a 500, not a 422)
Responses = dict[int | str, dict[str, Any]]  # a route's documented answers besides its success


def answers(*groups: Responses) -> Responses:
    """Documented answers: the groups merged."""
    merged: Responses = {}
    for group in groups:
        merged |= group
    return merged


NOT_FOUND: Responses = {404: {"description": "No such session for this key's tenant."}}
# What a session's stream files route answers: the playlists, the segments and the captions files.
STREAM_FILE_TYPES: dict[str, dict[str, Any]] = {
    "application/vnd.apple.mpegurl": {},
    "video/iso.segment": {},
    **{captions.MEDIA_TYPES[fmt].partition(";")[0]: {} for fmt in captions.PUBLISHED_CAPTIONS},
}
CREATE_REFUSALS: Responses = {
    403: {"description": "priority=high asked by a key without the `priority` scope."},
    413: {},
    422: {},
    429: {"description": "The tenant has its limit of sessions queued or running; Retry-After: when one likely ends."},
    503: {"description": "No node checked the inputs (or took the live session) in time, or a service is down."},
}
TOO_MANY_STREAMS: Responses = {429: {"description": "The key holds its limit of open streams; close one."}}
CONFLICT: Responses = {409: {"description": "Not possible in the session's status (the message says why)."}}
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Any unique string (a UUID): a retry with the same key and request gets the first session.",
    ),
]
PortraitUrl = Annotated[
    str | None, Form(description="The portrait by URL instead of a file: https://… or s3://bucket/key.")
]
AudioUrl = Annotated[str | None, Form(description="The speech by URL instead of a file: https://… or s3://bucket/key.")]
AvatarId = Annotated[
    str | None, Form(description="An avatar's id (`POST /v1/avatars`) instead of the portrait, checked once, reused.")
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RenderPublic,
    responses=CREATE_REFUSALS,
    openapi_extra=json_body(RenderCreate),
)
async def create_render(
    request: Request,
    response: Response,
    services: ServicesDep,
    principal: TenantDep,
    fields: OptionFields,
    integration: IntegrationFields,
    idempotency_key: IdempotencyKey = None,
    portrait: Annotated[UploadFile | None, File(description="Portrait image: PNG, JPEG, WebP…")] = None,
    audio: Annotated[UploadFile | None, File(description="Speech: WAV, MP3, FLAC, OGG or M4A (or `text`)")] = None,
    portrait_url: PortraitUrl = None,
    audio_url: AudioUrl = None,
    avatar_id: AvatarId = None,
) -> RenderPublic:
    """Start rendering a talking-avatar video; returns at once with the session id and its URLs.

    Multipart: each input is a file or a URL (`portrait_url`, `audio_url`); instead of audio, `text` to speak (in
    `voice`), synthesised on a node. JSON: each input is `{"url": …}` or
    `{"asset_id": …}` (from `POST /v1/assets`), beside the same option fields. Either way, `avatar_id` (from
    `POST /v1/avatars`) may stand for the portrait. Options left out take the server's
    defaults (`MONOLOGUE_RENDER__*`). With an `Idempotency-Key`, a retried request returns the session the first one
    made. `metadata` comes back in the session, its events and webhooks; a `callback_url` gets the session's endings,
    signed with the `callback_secret` of this answer."""
    tenant = principal.tenant or "local"
    body = await json_create(request, RenderCreate)
    fields = body.fields if body is not None else fields
    # A render is delivered as HLS whatever the server's default delivery for live sessions; asking for more is refused.
    given = {"delivery": c.Delivery.HLS, **fields}
    options = validated_options(services, given, tenant=tenant, scopes=principal.scopes)
    try:
        c.check_delivery(c.SessionKind.RENDER, options)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None
    attached = await checked(services, body.integration if body is not None else integration, tenant=tenant)
    if body is not None:
        spoken = spoken_from_text(options, fields, audio="audio" in body.refs)
        if not spoken and "audio" not in body.refs:
            raise HTTPException(422, 'body.audio: give {"url": …} or {"asset_id": …}, or the text to speak (text)')
        inputs = await body.inputs(services, tenant=tenant)
    else:
        spoken = spoken_from_text(options, fields, audio=audio is not None or bool(audio_url))
        avatar = avatar_input(avatar_id, uploaded=portrait is not None or bool(portrait_url))
        given = {} if avatar else {"portrait": (portrait, portrait_url)}
        given |= {} if spoken else {"audio": (audio, audio_url)}
        inputs = avatar + await read_inputs(given, limit=services.settings.limits.max_upload_bytes)
    created = await create(
        services,
        kind=c.SessionKind.RENDER,
        tenant=tenant,
        options=options,
        given=fields,
        inputs=inputs,
        idempotency_key=idempotency_key,
        integration=attached,
    )
    return await created_answer(response, services, created, principal)


async def created_answer(
    response: Response, services: ServicesDep, created: Created, principal: Principal
) -> RenderPublic:
    """The session just made (or the one its Idempotency-Key names: `Idempotent-Replayed: true`), with the secret of
    its callbacks."""
    if created.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    answer = await with_db(services, shown, services, created.session_id, principal)
    answer.callback_secret = await callback_secret(services, created.session_id)
    return answer


@router.get("", response_model=RenderList, responses={422: {}})
def list_renders(
    services: ServicesDep,
    db: DbDep,
    principal: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    status_: Annotated[c.SessionStatus | None, Query(alias="status", description=c.SessionStatus.__doc__)] = None,
) -> RenderList:
    """The key's sessions (renders and live ones), newest first."""
    rows = repo.list_sessions(db, limit=limit, offset=offset, status=status_, tenant=principal.tenant)
    estimate = queue.current(services, db) if any(repo_queue.waits(row) for row in rows) else None
    items = [public(services, db, row, estimate=estimate) for row in rows]
    return RenderList(items=items, limit=limit, offset=offset)


@router.get("/{session_id}", response_model=RenderPublic, responses=NOT_FOUND)
def get_render(session_id: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> RenderPublic:
    """The session: status, progress, options and links (the signed playback links renew with every answer)."""
    return shown(db, services, session_id, principal)


@router.post(
    "/{session_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RenderPublic,
    responses=answers(NOT_FOUND, CONFLICT),
)
async def cancel_render(session_id: str, services: ServicesDep, principal: TenantDep) -> RenderPublic:
    """Stop the render within one chunk; what was published stays playable (the playlist is closed)."""
    await cancel(services, await with_db(services, find, session_id, principal))
    return await with_db(services, shown, services, session_id, principal)


@router.post(
    "/{session_id}/resume",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RenderPublic,
    responses=answers(NOT_FOUND, CONFLICT),
)
async def resume_render(session_id: str, services: ServicesDep, principal: TenantDep) -> RenderPublic:
    """Start a failed or cancelled render again from its last checkpoint; chunks already made are kept."""
    await resume(services, await with_db(services, find, session_id, principal))
    return await with_db(services, shown, services, session_id, principal)


@router.get(
    "/{session_id}/events",
    response_class=StreamingResponse,
    responses=answers(
        {200: {"content": {"text/event-stream": {}}}, 204: {"description": "Ended, nothing new."}},
        NOT_FOUND,
        TOO_MANY_STREAMS,
    ),
)
async def render_events(
    session_id: str,
    request: Request,
    services: ServicesDep,
    principal: TenantDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
) -> Response:
    """Server-sent events: a `progress` event (with an `id:`) whenever the render's progress changes, keep-alive
    comments between them, until it ends. A reconnect with `Last-Event-ID` resumes after that event."""
    await with_db(services, find, session_id, principal)  # the stream itself polls in short sessions of its own
    slot = key_slot(request, services, principal)
    watch = streams.KeyWatch(services, principal.key_id)

    async def stop() -> str | None:
        return streams.REVOKED if await watch.revoked() else None

    return await progress_events(request, services, session_id, slot, stop)


def key_slot(request: Request, services: ServicesDep, principal: Principal) -> streams.StreamSlot:
    """A place among the key's open streams; TooManyStreams (429) when it holds its limit already."""
    return streams.stream_slots(request.app.state).take(principal.key_id, services.settings.limits.max_streams_per_key)


# cancel and resume (below) are these routes' bodies, shared with /ops (api/routes/ops.py), whose routes find the
# session for any tenant and then do exactly the same (as with api.files and api.events).


async def cancel(services: ServicesDep, row: SessionRow) -> None:
    """Ask the session's workflow to stop; 409 if it has already ended."""
    if row.status in TERMINAL:
        raise HTTPException(409, f"render {row.id} is already {row.status}; there is nothing to cancel")
    try:
        await cancel_workflow(services, row)
    except RPCError as err:  # it ended between the check and the request
        raise HTTPException(409, f"render {row.id} could not be cancelled: {err.message}") from err


async def resume(services: ServicesDep, row: SessionRow) -> None:
    """Start a failed or cancelled session again; 409 otherwise, or if a sink of the session is no longer
    allowed."""
    if row.status not in c.RESUMABLE:
        raise HTTPException(409, f"render {row.id} is {row.status}; only failed or cancelled renders resume")
    if row.inputs_removed_at is not None:
        raise HTTPException(409, f"render {row.id} cannot resume: its inputs were removed (retention)")
    try:
        await resume_workflow(services, row)
    except sink_policy.SinkRefused as err:
        raise HTTPException(
            409, f"render {row.id} cannot resume: {err}; its sinks are fixed, so start a new session instead"
        ) from err
    except WorkflowAlreadyStartedError as err:
        raise HTTPException(409, f"render {row.id} is already running again") from err


VIDEO = answers({200: {"content": {"video/mp4": {}}}}, NOT_FOUND, CONFLICT)
LayoutQuery = Annotated[VideoLayout, Query(description=VideoLayout.__doc__)]


@router.get("/{session_id}/video.mp4", response_class=Response, responses=VIDEO)
def get_video(
    session_id: str,
    services: ServicesDep,
    db: DbDep,
    principal: TenantDep,
    layout: LayoutQuery = VideoLayout.FRAGMENTED,
) -> Response:
    """The finished MP4 (H.264 + AAC), stream-copied; `?layout=progressive` puts its index first (made at the first
    request, then kept). 409 while the render is still going."""
    return video_file(services, db, find(db, session_id, principal), layout)


@router.get(
    "/{session_id}/{name}",
    response_class=Response,
    responses=answers({200: {"content": STREAM_FILE_TYPES}}, NOT_FOUND),
)
def get_stream_file(session_id: str, name: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> Response:
    """The live HLS stream: `stream.m3u8` (grows while the render runs), `init.mp4` and its `seg-*.m4s`; with captions
    also `main.m3u8` (the multivariant playlist) and its subtitle rendition `subs.m3u8` over `captions.vtt`, and
    `captions.srt`."""
    find(db, session_id, principal)
    return stream_file(services, session_id, name)


@router.get(
    "/{session_id}/sinks/{sink}/stream.m3u8",
    response_class=Response,
    responses=answers({200: {"content": {"application/vnd.apple.mpegurl": {}}}}, NOT_FOUND),
)
def get_sink_playlist(session_id: str, sink: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> Response:
    """An S3 sink's HLS playlist with every segment link presigned, so it plays from a private bucket."""
    row = find(db, session_id, principal)
    spec = next((s for s in row.options.get("sinks") or [] if (s.get("name") or s["type"]) == sink), None)
    if spec is None or spec["type"] != c.SinkType.S3:
        raise HTTPException(404, f"render {session_id} has no s3 sink named {sink!r}")
    client = s3_client(endpoint_url=spec.get("endpoint_url"), region=spec.get("region"))
    base_key = f"{spec['prefix'].strip('/')}/{session_id}/" if spec.get("prefix", "").strip("/") else f"{session_id}/"
    try:
        text = client.get_object(Bucket=spec["bucket"], Key=base_key + "stream.m3u8")["Body"].read().decode()
    except ClientError as err:
        raise HTTPException(404, f"the {sink} sink has no playlist yet ({err.response['Error'].get('Code')})") from None
    signed = presigned_playlist(
        client, bucket=spec["bucket"], base_key=base_key, playlist_text=text, expires_s=PRESIGN_EXPIRES_S
    )
    return Response(signed, media_type="application/vnd.apple.mpegurl", headers={"Cache-Control": "no-cache"})
