"""`/play/{token}/…`: a session's stream, segments, video and events behind a signed playback link (`api/links.py`),
for viewers who hold no API key: a plain <video>, hls.js, Safari's or a TV's own HLS player, EventSource. Read-only
(GET only), one session (the token names it), until the link expires; 403 otherwise. Pages at
MONOLOGUE_LINKS__CORS_ORIGINS may read them from scripts (CORS)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from monologue import repo
from monologue.db import SessionRow
from monologue.schemas import VideoLayout

from .. import links, streams
from ..deps import DbDep, Services, ServicesDep, with_db
from ..errors import TooManyStreams
from ..events import progress_events
from ..files import stream_file, video_file
from .renders import NOT_FOUND, STREAM_FILE_TYPES, TOO_MANY_STREAMS, Responses, answers, operation_id

router = APIRouter(prefix=links.PLAY_PREFIX, tags=["playback links"], generate_unique_id_function=operation_id)
REFUSED: Responses = {403: {"description": "Not a valid playback link, or it has expired."}}


def _grant(services: Services, token: str) -> links.Grant:
    try:
        return links.grant(services.settings, token)
    except links.LinkRefused as err:
        raise HTTPException(403, str(err)) from None


def _session(db: Session, services: Services, token: str) -> SessionRow:
    row = repo.get_session(db, session_id=_grant(services, token).session_id)
    if row is None:
        raise HTTPException(404, "the session of this playback link no longer exists")
    return row


@router.get(
    "/{token}/events",
    response_class=StreamingResponse,
    responses=answers(
        {200: {"content": {"text/event-stream": {}}}, 204: {"description": "Ended, nothing new."}},
        REFUSED,
        NOT_FOUND,
        TOO_MANY_STREAMS,
    ),
)
async def playback_events(
    token: str,
    request: Request,
    services: ServicesDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
) -> Response:
    """Server-sent progress events of the link's session (as `GET /v1/renders/{id}/events`), until it ends or the
    link expires (an `error` event says so)."""
    row = await with_db(services, _session, services, token)  # the stream polls in short sessions of its own
    try:
        slot = streams.stream_slots(request.app.state).take(
            f"link:{row.id}", services.settings.links.max_streams_per_session
        )
    except TooManyStreams:
        raise TooManyStreams(
            f"session {row.id} has its limit of open event streams (MONOLOGUE_LINKS__MAX_STREAMS_PER_SESSION)"
        ) from None

    async def stop() -> str | None:
        try:
            links.grant(services.settings, token)
        except links.LinkRefused as err:
            return str(err)
        return None

    return await progress_events(request, services, row.id, slot, stop)


@router.get(
    "/{token}/video.mp4",
    response_class=Response,
    responses=answers(
        {200: {"content": {"video/mp4": {}}}, 409: {"description": "Not completed yet."}}, REFUSED, NOT_FOUND
    ),
)
def playback_video(
    token: str,
    services: ServicesDep,
    db: DbDep,
    layout: Annotated[VideoLayout, Query(description=VideoLayout.__doc__)] = VideoLayout.FRAGMENTED,
) -> Response:
    """The finished MP4 of the link's session; `?layout=progressive` with its index first."""
    return video_file(services, db, _session(db, services, token), layout)


@router.get(
    "/{token}/{name}",
    response_class=Response,
    responses=answers({200: {"content": STREAM_FILE_TYPES}}, REFUSED, NOT_FOUND),
)
def playback_stream_file(token: str, name: str, services: ServicesDep, db: DbDep) -> Response:
    """The link's HLS stream: `stream.m3u8` (its segment links are relative, so they resolve under this link),
    `init.mp4` and `seg-*.m4s`; with captions also `main.m3u8` (the stream with its subtitle rendition), `subs.m3u8`
    and the caption files."""
    row = _session(db, services, token)
    return stream_file(services, row.id, name)
