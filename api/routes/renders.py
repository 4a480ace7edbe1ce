"""`/v1/renders`: start a render, follow it, download the video. Routes stay thin: checks and
side effects live in `api.submit` and `monologue.repo`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import quote

from botocore.exceptions import ClientError
from fastapi import APIRouter, File, HTTPException, Query, Request, UploadFile, status
from fastapi.responses import FileResponse, Response, StreamingResponse
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from monologue import contracts as c
from monologue import keys, repo, sink_policy
from monologue import options as options_
from monologue.db import SessionRow
from monologue.errors import InputError, NotFound
from monologue.s3_presign import presigned_playlist, s3_client
from monologue.storage import LocalStore

from .. import streams
from ..deps import DbDep, Principal, ServicesDep, TenantDep
from ..inputs import OptionFields, enum_filter, validated_options
from ..origin import public_base, public_ws_base
from ..schemas import (
    Latency,
    Problem,
    Progress,
    RenderLinks,
    RenderList,
    RenderPublic,
    SinkStatus,
)
from ..submit import TERMINAL, Uploads, cancel_workflow, resume_workflow, start_render

router = APIRouter(prefix="/v1/renders", tags=["renders"])
PRESIGN_EXPIRES_S = 3600  # presigned sink playback links last an hour (players refetch the playlist)
MAX_OFFSET = 2**63 - 1  # SQL's BIGINT: a larger OFFSET fails in the database driver (a 500, not a 422)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RenderPublic, responses={422: {"model": Problem}})
async def create_render(
    request: Request,
    services: ServicesDep,
    db: DbDep,
    principal: TenantDep,
    portrait: Annotated[UploadFile, File(description="Portrait image: PNG, JPEG, WebP…")],
    audio: Annotated[UploadFile, File(description="Speech: WAV, MP3, FLAC, OGG or M4A")],
    fields: OptionFields,
) -> RenderPublic:
    """Start rendering a talking-avatar video; returns at once with the session id and its URLs.

    Options left out take the server's defaults (`MONOLOGUE_RENDER__*`)."""
    options = validated_options(services, fields, tenant=principal.tenant or "local")
    limit = services.settings.limits.max_upload_bytes
    portrait_bytes = await _read_limited(portrait, "portrait", limit)
    audio_bytes = await _read_limited(audio, "audio", limit)
    uploads = Uploads(portrait=portrait_bytes, audio=audio_bytes)
    try:
        session_id = await start_render(services, uploads=uploads, options=options, tenant=principal.tenant or "local")
    except InputError as err:
        raise HTTPException(422, str(err)) from err
    row = repo.get_session(db, session_id=session_id)
    if row is None:  # pragma: no cover - just written
        raise HTTPException(500, "session row vanished right after creation")
    return _public(request, services, db, row)


@router.get("", response_model=RenderList, responses={422: {"model": Problem}})
def list_renders(
    request: Request,
    services: ServicesDep,
    db: DbDep,
    principal: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    status_: Annotated[str | None, Query(alias="status", description=c.SessionStatus.__doc__)] = None,
) -> RenderList:
    wanted = enum_filter(c.SessionStatus, status_, "status")
    rows = repo.list_sessions(db, limit=limit, offset=offset, status=wanted, tenant=principal.tenant)
    return RenderList(items=[_public(request, services, db, row) for row in rows], limit=limit, offset=offset)


@router.get("/{session_id}", response_model=RenderPublic)
def get_render(
    session_id: str, request: Request, services: ServicesDep, db: DbDep, principal: TenantDep
) -> RenderPublic:
    return _public(request, services, db, _find(db, session_id, principal))


@router.post(
    "/{session_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RenderPublic,
    responses={404: {}, 409: {}},
)
async def cancel_render(
    session_id: str, request: Request, services: ServicesDep, db: DbDep, principal: TenantDep
) -> RenderPublic:
    """Stop the render within one chunk; what was published stays playable (the playlist is closed)."""
    row = _find(db, session_id, principal)
    await cancel(services, row)
    return _public(request, services, db, row)


@router.post(
    "/{session_id}/resume",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RenderPublic,
    responses={404: {}, 409: {}},
)
async def resume_render(
    session_id: str, request: Request, services: ServicesDep, db: DbDep, principal: TenantDep
) -> RenderPublic:
    """Start a failed or cancelled render again from its last checkpoint; chunks already made are kept."""
    row = _find(db, session_id, principal)
    await resume(services, db, row)
    return _public(request, services, db, row)


@router.get(
    "/{session_id}/events", response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}}}
)
async def render_events(
    session_id: str, request: Request, services: ServicesDep, db: DbDep, principal: TenantDep
) -> StreamingResponse:
    """Server-sent events: a `progress` event whenever the render's progress changes, until it ends."""
    _find(db, session_id, principal)
    return progress_events(request, services, session_id, principal)


# cancel, resume, progress_events, video_file and stream_file (below) are these routes' bodies, shared with
# /ops (api/routes/ops.py), whose routes find the session for any tenant and then do exactly the same.


async def cancel(services: ServicesDep, row: SessionRow) -> None:
    """Ask the session's workflow to stop; 409 if it has already ended."""
    if row.status in TERMINAL:
        raise HTTPException(409, f"render {row.id} is already {row.status}; there is nothing to cancel")
    try:
        await cancel_workflow(services, row)
    except RPCError as err:  # it ended between the check and the request
        raise HTTPException(409, f"render {row.id} could not be cancelled: {err.message}") from err


async def resume(services: ServicesDep, db: DbDep, row: SessionRow) -> None:
    """Start a failed or cancelled session again (`row` is refreshed); 409 otherwise, or if a sink of the
    session is no longer allowed."""
    if row.status not in c.RESUMABLE:
        raise HTTPException(409, f"render {row.id} is {row.status}; only failed or cancelled renders resume")
    try:
        await resume_workflow(services, row)
    except sink_policy.SinkRefused as err:
        raise HTTPException(
            409, f"render {row.id} cannot resume: {err}; its sinks are fixed, so start a new session instead"
        ) from err
    except WorkflowAlreadyStartedError as err:
        raise HTTPException(409, f"render {row.id} is already running again") from err
    db.refresh(row)


def progress_events(
    request: Request, services: ServicesDep, session_id: str, principal: Principal
) -> StreamingResponse:
    """The `progress` event stream of a session the caller may see, until the session ends or the caller's key
    is revoked (an `error` event says so); 429 when the key holds its limit of open streams already."""
    try:
        slot = streams.stream_slots(request.app.state).take(
            principal.key_id, services.settings.limits.max_streams_per_key
        )
    except streams.TooManyStreams as err:
        raise HTTPException(429, str(err)) from None
    key = streams.KeyWatch(services, principal.key_id)

    async def events() -> AsyncIterator[str]:
        last = None
        while not await request.is_disconnected():
            if await key.revoked():
                yield f"event: error\ndata: {json.dumps({'detail': streams.REVOKED})}\n\n"
                return
            with services.sessions() as fresh:
                row = repo.get_session(fresh, session_id=session_id)
                if row is None:
                    return
                public = _public(request, services, fresh, row).model_dump(mode="json")
            if public != last:
                yield f"event: progress\ndata: {json.dumps(public)}\n\n"
                last = public
            if public["status"] in TERMINAL:
                return
            await asyncio.sleep(services.settings.api.events_poll_s)

    return streams.HeldStream(events(), slot, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get(
    "/{session_id}/video.mp4",
    response_class=Response,
    responses={200: {"content": {"video/mp4": {}}}, 404: {}, 409: {}},
)
def get_video(session_id: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> Response:
    """The finished MP4 (H.264 + AAC). 409 while the render is still going."""
    return video_file(services, db, _find(db, session_id, principal))


def video_file(services: ServicesDep, db: DbDep, row: SessionRow) -> Response:
    """The finished MP4 of a session the caller may see; 409 until it is completed."""
    session_id = row.id
    if row.status != "completed" or row.video_key is None:
        done = repo.chunks_done(db, session_id=session_id)
        raise HTTPException(
            409,
            f"render {session_id} is {row.status} ({done}/{row.chunks_total or '?'} chunks);"
            " the video is available once status is 'completed'",
        )
    store = services.store
    headers = {"Content-Disposition": f'inline; filename="{session_id}.mp4"'}
    if isinstance(store, LocalStore):
        return FileResponse(store.path(row.video_key), media_type="video/mp4", headers=headers)
    headers["Content-Length"] = str(store.size(row.video_key))
    return StreamingResponse(store.stream(row.video_key), media_type="video/mp4", headers=headers)


_MEDIA_TYPES = {".m3u8": "application/vnd.apple.mpegurl", ".mp4": "video/mp4", ".m4s": "video/iso.segment"}


@router.get(
    "/{session_id}/{name}",
    response_class=Response,
    responses={200: {"content": {"application/vnd.apple.mpegurl": {}, "video/iso.segment": {}}}, 404: {}},
)
def get_stream_file(session_id: str, name: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> Response:
    """The live HLS stream: `stream.m3u8` (grows while the render runs), `init.mp4` and its `seg-*.m4s`."""
    _find(db, session_id, principal)
    return stream_file(services, session_id, name)


def stream_file(services: ServicesDep, session_id: str, name: str) -> Response:
    """One file of the HLS stream of a session the caller may see; 404 for any other name."""
    if not keys.PUBLIC_OUTPUT.fullmatch(name):
        raise HTTPException(404, f"no file {name!r}: the stream has stream.m3u8, init.mp4 and seg-<chunk>.m4s")
    key = keys.output(session_id, name)
    media_type = _MEDIA_TYPES[name[name.rindex(".") :]]
    # The playlist changes while the render runs; segments never change once written.
    cache = "no-cache" if name.endswith(".m3u8") else "public, max-age=31536000, immutable"
    try:
        data = services.store.get(key)
    except NotFound:
        raise HTTPException(404, f"{name} is not published yet for render {session_id}") from None
    return Response(data, media_type=media_type, headers={"Cache-Control": cache})


@router.get(
    "/{session_id}/sinks/{sink}/stream.m3u8",
    response_class=Response,
    responses={200: {"content": {"application/vnd.apple.mpegurl": {}}}, 404: {}},
)
def get_sink_playlist(session_id: str, sink: str, services: ServicesDep, db: DbDep, principal: TenantDep) -> Response:
    """An S3 sink's HLS playlist with every segment link presigned, so it plays from a private bucket."""
    row = _find(db, session_id, principal)
    spec = next((s for s in row.options.get("sinks") or [] if (s.get("name") or s["type"]) == sink), None)
    if spec is None or spec["type"] != "s3":
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


def _find(db: DbDep, session_id: str, principal: Principal) -> SessionRow:
    """The session if the caller's tenant owns it; 404 otherwise (not 403: ids of others do not leak)."""
    row = repo.get_session(db, session_id=session_id)
    if row is None or (principal.tenant is not None and row.tenant != principal.tenant):
        raise HTTPException(404, f"render {session_id!r} not found")
    return row


def _public(request: Request, services: ServicesDep, db: DbDep, row: SessionRow) -> RenderPublic:
    base, ws_base = public_base(services.settings.api), public_ws_base(services.settings.api)  # never from Host
    ui = services.settings.temporal.ui_url
    namespace = services.settings.temporal.namespace
    return RenderPublic(
        id=row.id,
        kind=row.kind,
        status=row.status,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        options=options_.request_model().model_validate(options_.stored(c.render_options(row.options))),
        width=row.width,
        height=row.height,
        audio_seconds=row.audio_seconds,
        node_id=row.node_id,
        ttff_ms=row.ttff_ms,
        latency=Latency.model_validate(row.latency) if row.latency else None,
        sinks=[
            SinkStatus(
                name=sink.name,
                type=sink.kind,
                status=sink.status,
                acknowledged=sink.acknowledged,
                error=sink.error,
                playback=f"{base}/v1/renders/{row.id}/sinks/{sink.name}/stream.m3u8" if sink.kind == "s3" else None,
            )
            for sink in repo.list_sinks(db, session_id=row.id)
        ],
        error=row.error,
        progress=Progress(
            chunks_done=repo.chunks_done(db, session_id=row.id),
            chunks_total=row.chunks_total,
            frames_total=row.frames,
            retries=repo.chunk_retries(db, session_id=row.id),
        ),
        links=RenderLinks(
            stream=f"{base}/v1/renders/{row.id}/stream.m3u8",
            self=f"{base}/v1/renders/{row.id}",
            video=f"{base}/v1/renders/{row.id}/video.mp4",
            workflow=f"{ui}/namespaces/{namespace}/workflows/{quote(row.workflow_id or '')}",
            audio=f"{ws_base}/v1/sessions/{row.id}/audio" if row.kind == "live" else None,
        ),
    )


async def _read_limited(upload: UploadFile, field: str, limit: int) -> bytes:
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
