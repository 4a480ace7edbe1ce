"""`/ops`: the operator's web UI (sessions and the lease queue, one session's timeline and live stream, nodes) and
what it calls (`/ops/api/…`): JSON, a session's events, stream and video, cancel and resume. Operators see every
tenant.

Every `/ops/api` route depends on `OpsAccess`, the one place where access is decided, and the pages call
nothing else (no `/v1`: that needs a tenant's key). The pages and their scripts hold no data and are served
to anyone: a browser cannot send an API key when it navigates, so the page itself asks for one."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session

from monologue import repo
from monologue.contracts import (
    RESUMABLE,
    TERMINAL,
    CaptionMode,
    ChunkKind,
    Delivery,
    QueueClass,
    SessionKind,
    SessionStatus,
    render_options,
)
from monologue.db import ChunkRow, ChunkStatus, SessionRow, utcnow
from monologue.plan import chunk_sizes, plan_chunks, plan_timeline
from monologue.repo import nodes as repo_nodes, ops as repo_ops, webhooks as repo_webhooks
from monologue.repo.nodes import aware
from monologue.repo.webhooks import DeliveryFilter
from monologue.schemas import VideoLayout, WebhookDeliveryList

from .. import openapi, queue, streams
from ..deps import DbDep, OpsAccess, Services, ServicesDep, with_db
from ..events import progress_events
from ..files import stream_file, video_file
from ..inputs import enum_filter
from ..links import playback_links
from ..ops.schemas import (
    OpsCheckpoint,
    OpsChunk,
    OpsLinks,
    OpsNode,
    OpsNodeList,
    OpsProgress,
    OpsQueue,
    OpsSession,
    OpsSessionDetail,
    OpsSessionPage,
)
from ..origin import public_base
from . import renders
from .webhooks import delivery_list


def operation_id(route: APIRoute) -> str:
    """`ops_` and the route function's name: operators' operations in their own schema (`/ops/api/openapi.json`)."""
    return f"ops_{route.name}"


router = APIRouter(prefix="/ops", tags=["ops"], generate_unique_id_function=operation_id)


def _enum(enum: type[StrEnum]) -> dict[str, Any]:
    return {"enum": ["", *(member.value for member in enum)]}


STATIC = Path(__file__).resolve().parent.parent / "ops" / "static"
# The pages change with each release; revalidate them (FileResponse sends an ETag) rather than cache them.
_REVALIDATE = {"Cache-Control": "no-cache"}


# The pages and static files: no OpsAccess (see the module docstring); all they show comes from /ops/api.


@router.get("", include_in_schema=False)
def sessions_page() -> FileResponse:
    return FileResponse(STATIC / "sessions.html", headers=_REVALIDATE)


@router.get("/sessions/{session_id}", include_in_schema=False)
def session_page(session_id: str) -> FileResponse:
    return FileResponse(STATIC / "session.html", headers=_REVALIDATE)


@router.get("/nodes", include_in_schema=False)
def nodes_page() -> FileResponse:
    return FileResponse(STATIC / "nodes.html", headers=_REVALIDATE)


@router.get("/static/enums.js", include_in_schema=False)
def enums_module() -> Response:
    """The enums the pages need, as an ES module generated from `contracts` (the one definition): statuses for
    the filters, which are terminal or resumable, the session and chunk kinds."""
    values = {
        "STATUSES": [status.value for status in SessionStatus],
        "TERMINAL": sorted(status.value for status in TERMINAL),
        "RESUMABLE": sorted(status.value for status in RESUMABLE),
        "KINDS": [kind.value for kind in SessionKind],
        "CHUNK_KINDS": [kind.value for kind in ChunkKind],
        "QUEUE_CLASSES": [queue_class.value for queue_class in QueueClass],  # most urgent first
    }
    body = "// Generated from monologue/contracts/session.py by the API: do not edit.\n" + "".join(
        f"export const {name} = {json.dumps(value)};\n" for name, value in values.items()
    )
    return Response(body, media_type="text/javascript", headers=_REVALIDATE)


@router.get("/static/{path:path}", include_in_schema=False)
def static_file(path: str) -> FileResponse:
    try:
        file = (STATIC / path).resolve()
        found = file.is_relative_to(STATIC) and file.is_file()
    except (OSError, ValueError):  # a NUL byte or a name too long for the file system: not an asset either
        found = False
    if not found:
        raise HTTPException(404, f"no ops asset {path!r}")
    return FileResponse(file, headers=_REVALIDATE)


@router.get("/api/openapi.json", include_in_schema=False)
def ops_schema(request: Request, access: OpsAccess) -> dict[str, Any]:
    """The schema of `/ops/api` (the public one, `/openapi.json`, leaves the operator's routes out)."""
    return openapi.schema_for(request.app, openapi.ops_routes(request.app), title="Monologue ops")


@router.get("/api/sessions", response_model=OpsSessionPage, responses={422: {}})
def list_sessions(
    db: DbDep,
    access: OpsAccess,
    # Strings, not enums: the pages' filters send an empty value for "any" (checked by enum_filter).
    status: Annotated[
        str | None, Query(description=SessionStatus.__doc__, json_schema_extra=_enum(SessionStatus))
    ] = None,
    tenant: str | None = None,
    node: Annotated[str | None, Query(description="The node holding (or last holding) the session.")] = None,
    kind: Annotated[str | None, Query(description=SessionKind.__doc__, json_schema_extra=_enum(SessionKind))] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=renders.MAX_OFFSET)] = 0,
) -> OpsSessionPage:
    """Sessions, newest first, with progress, realtime ratio and time to first frame."""
    where = repo_ops.SessionFilter(
        status=enum_filter(SessionStatus, status, "status"),
        tenant=tenant or None,
        node=node or None,
        kind=enum_filter(SessionKind, kind, "kind"),
    )
    rows, total = repo_ops.list_sessions(db, where=where, limit=limit, offset=offset)
    totals = repo_ops.chunk_totals(db, session_ids=[row.id for row in rows])
    now = utcnow()
    items = [_session(row, totals.get(row.id, repo_ops.ChunkTotals(0, 0)), now) for row in rows]
    return OpsSessionPage(items=items, total=total, limit=limit, offset=offset)


@router.get("/api/sessions/{session_id}", response_model=OpsSessionDetail, responses={404: {}})
def get_session(session_id: str, services: ServicesDep, db: DbDep, access: OpsAccess) -> OpsSessionDetail:
    """One session: its chunks in timeline order (made or not), its checkpoints and links."""
    row = _find(db, session_id)
    made = repo.list_chunks(db, session_id=session_id)
    totals = repo_ops.ChunkTotals(
        sum(chunk.status == ChunkStatus.DONE for chunk in made),
        sum(chunk.frames for chunk in made if chunk.status == ChunkStatus.DONE),
    )
    own = f"{public_base(services.settings.api)}/ops/api/sessions/{row.id}"  # never from the Host header
    temporal = services.settings.temporal
    workflow = quote(row.workflow_id or "", safe="")
    return OpsSessionDetail(
        session=_session(row, totals, utcnow()),
        options=row.options,
        workflow_id=row.workflow_id,
        width=row.width,
        height=row.height,
        chunks=_timeline(row, made),
        checkpoints=[
            OpsCheckpoint(index=ckpt.index, key=ckpt.key, sha256=ckpt.sha256, created_at=ckpt.created_at)
            for ckpt in repo_ops.list_checkpoints(db, session_id=session_id)
        ],
        links=OpsLinks(
            temporal=f"{temporal.ui_url}/namespaces/{quote(temporal.namespace)}/workflows/{workflow}",
            stream=f"{own}/stream/stream.m3u8",
            captioned_stream=f"{own}/stream/main.m3u8"
            if render_options(row.options).captions is not CaptionMode.NONE
            else None,
            events=f"{own}/events",
            video=f"{own}/video.mp4",
            cancel=f"{own}/cancel",
            resume=f"{own}/resume",
            webhooks=f"{own}/webhooks",
            player=_player(services, row),
        ),
    )


# Cancel, resume, events, video and stream do what their /v1/renders twins do (the same code), for any tenant.


@router.post(
    "/api/sessions/{session_id}/cancel",
    status_code=202,
    response_model=OpsSession,
    responses={404: {}, 409: {}},
)
async def cancel_session(session_id: str, services: ServicesDep, access: OpsAccess) -> OpsSession:
    """Stop the session within one chunk; what was published stays playable. 409 if it has ended."""
    await renders.cancel(services, await with_db(services, _find, session_id))
    return await with_db(services, _summary_of, session_id)


@router.post(
    "/api/sessions/{session_id}/resume",
    status_code=202,
    response_model=OpsSession,
    responses={404: {}, 409: {}},
)
async def resume_session(session_id: str, services: ServicesDep, access: OpsAccess) -> OpsSession:
    """Start a failed or cancelled session again from its last checkpoint. 409 for any other status."""
    await renders.resume(services, await with_db(services, _find, session_id))
    return await with_db(services, _summary_of, session_id)


@router.get(
    "/api/sessions/{session_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, 404: {}},
)
async def session_events(session_id: str, request: Request, services: ServicesDep, access: OpsAccess) -> Response:
    """Server-sent `progress` events (the session as `GET /v1/renders/{id}` shows it, and its `node_id`) until it
    ends."""
    await with_db(services, _find, session_id)  # the stream itself polls in short sessions of its own
    slot = renders.key_slot(request, services, access)
    watch = streams.KeyWatch(services, access.key_id)

    async def stop() -> str | None:
        return streams.REVOKED if await watch.revoked() else None

    return await progress_events(request, services, session_id, slot, stop, for_operator=True)


@router.get(
    "/api/sessions/{session_id}/video.mp4",
    response_class=Response,
    responses={200: {"content": {"video/mp4": {}}}, 404: {}, 409: {}},
)
def session_video(
    session_id: str, services: ServicesDep, db: DbDep, access: OpsAccess, layout: VideoLayout = VideoLayout.FRAGMENTED
) -> Response:
    """The finished MP4 (`?layout=progressive`: its index first). 409 until the session is completed."""
    return video_file(services, db, _find(db, session_id), layout)


@router.get(
    "/api/sessions/{session_id}/stream/{name}",
    response_class=Response,
    responses={200: {"content": {"application/vnd.apple.mpegurl": {}, "video/iso.segment": {}}}, 404: {}},
)
def session_stream_file(session_id: str, name: str, services: ServicesDep, db: DbDep, access: OpsAccess) -> Response:
    """The live HLS stream: `stream.m3u8`, `init.mp4` and `seg-*.m4s` (with captions: `main.m3u8`, `subs.m3u8`)."""
    _find(db, session_id)
    return stream_file(services, session_id, name)


@router.get("/api/sessions/{session_id}/webhooks", response_model=WebhookDeliveryList, responses={404: {}})
def session_webhooks(session_id: str, db: DbDep, access: OpsAccess) -> WebhookDeliveryList:
    """The session's webhook deliveries, each with every attempt."""
    _find(db, session_id)
    return delivery_list(repo_webhooks.list_deliveries(db, where=DeliveryFilter(session_id=session_id)))


@router.get("/api/queue", response_model=OpsQueue)
def queue_counts(services: ServicesDep, db: DbDep, access: OpsAccess) -> OpsQueue:
    """Sessions waiting for a node by class and tenant, those holding one by class, and the nodes' slots."""
    return queue.ops_queue(services, db)


@router.get("/api/nodes", response_model=OpsNodeList)
def list_nodes(db: DbDep, access: OpsAccess) -> OpsNodeList:
    """Every node that ever reported, with the age of its last heartbeat (a silent node may be lost)."""
    now = utcnow()
    return OpsNodeList(
        items=[
            OpsNode(
                id=node.id,
                capacity=node.capacity,
                status=node.status,
                sessions=node.sessions,
                chunks_done=node.chunks_done,
                chunks_per_minute=repo_nodes.chunks_per_minute(node, now=now),
                memory_mb=node.memory_mb,
                started_at=aware(node.started_at),
                heartbeat_at=aware(node.heartbeat_at),
                heartbeat_age_s=repo_nodes.heartbeat_age_s(node, now=now),
            )
            for node in repo_nodes.list_nodes(db)
        ]
    )


def _find(db: Session, session_id: str) -> SessionRow:
    row = repo.get_session(db, session_id=session_id)
    if row is None:
        raise HTTPException(404, f"session {session_id!r} not found")
    return row


def _summary(db: Session, row: SessionRow) -> OpsSession:
    totals = repo_ops.chunk_totals(db, session_ids=[row.id]).get(row.id, repo_ops.ChunkTotals(0, 0))
    return _session(row, totals, utcnow())


def _summary_of(db: Session, session_id: str) -> OpsSession:
    return _summary(db, _find(db, session_id))


def _session(row: SessionRow, totals: repo_ops.ChunkTotals, now: datetime) -> OpsSession:
    return OpsSession(
        id=row.id,
        status=row.status,
        kind=row.kind,
        tenant=row.tenant,
        node_id=row.node_id,
        created_at=aware(row.created_at),
        started_at=aware(row.started_at) if row.started_at else None,
        finished_at=aware(row.finished_at) if row.finished_at else None,
        age_s=(now - aware(row.created_at)).total_seconds(),
        progress=OpsProgress(
            chunks_done=totals.chunks_done,
            chunks_total=row.chunks_total,
            frames_done=totals.frames_done,
            frames_total=row.frames,
            preemptions=row.preemptions,
        ),
        realtime_ratio=_realtime_ratio(row, totals.frames_done, now),
        ttff_ms=row.ttff_ms,
        audio_seconds=row.audio_seconds,
        error=row.error,
    )


def _realtime_ratio(row: SessionRow, frames_done: int, now: datetime) -> float | None:
    fps = row.options.get("fps")
    if row.started_at is None or not fps or frames_done == 0:
        return None
    end = aware(row.finished_at) if row.finished_at else now
    wall_s = (end - aware(row.started_at)).total_seconds()
    return frames_done / fps / wall_s if wall_s > 0 else None


def _timeline(row: SessionRow, made: list[ChunkRow]) -> list[OpsChunk]:
    """Every chunk in timeline order: the plan's (when the frame count is known) merged with the rows."""
    by_name: dict[tuple[str, int], ChunkRow] = {(chunk.kind.value, chunk.index): chunk for chunk in made}
    options = row.options
    planned: list[tuple[str, int, int, int]] = []
    running: tuple[str, int] | None = None
    if row.frames and "chunk_frames" in options and "i_frames" in options:
        sizes = chunk_sizes(options)
        planned = [(s.kind, s.index, s.first_frame, s.n_frames) for s in plan_timeline(row.frames, **sizes)]
        if row.status == SessionStatus.RUNNING:
            running = next(
                ((s.kind, s.index) for s in plan_chunks(row.frames, **sizes) if (s.kind, s.index) not in by_name), None
            )
    known = {(kind, index) for kind, index, _, _ in planned}
    planned += [(c.kind, c.index, c.first_frame, c.frames) for c in made if (c.kind, c.index) not in known]
    planned.sort(key=lambda spec: (spec[2], spec[0] != ChunkKind.I))  # an empty I chunk still precedes the N after it
    moved = _moved(made)
    chunks: list[OpsChunk] = []
    for kind, index, first_frame, frames in planned:
        chunk = by_name.get((kind, index))
        status = chunk.status if chunk else (ChunkStatus.RUNNING if running == (kind, index) else ChunkStatus.PENDING)
        chunks.append(
            OpsChunk(
                kind=ChunkKind(kind),
                index=index,
                first_frame=first_frame,
                frames=frames,
                status=status,
                attempt=chunk.attempt if chunk else 0,
                node_id=chunk.node_id if chunk else None,
                moved=(kind, index) in moved,
                stage_ms=chunk.stage_ms if chunk else {},
                updated_at=aware(chunk.updated_at) if chunk else None,
            )
        )
    return chunks


def _moved(made: list[ChunkRow]) -> set[tuple[str, int]]:
    """Chunks made on another node than the chunk made just before them."""
    moved: set[tuple[str, int]] = set()
    previous: str | None = None
    for chunk in sorted(made, key=lambda chunk: aware(chunk.updated_at)):
        if previous is not None and chunk.node_id != previous:
            moved.add((chunk.kind, chunk.index))
        previous = chunk.node_id
    return moved


def _player(services: Services, row: SessionRow) -> str | None:
    """A running live WebRTC session's player page, under this origin (a signed link: the page sends no key)."""
    if row.kind != SessionKind.LIVE or row.options.get("delivery") != Delivery.WEBRTC or row.status in TERMINAL:
        return None
    return playback_links(services.settings, row.id, webrtc=True).player
