"""A session's files as the API serves them: the HLS stream (playlist, init segment, segments) and the final MP4,
fragmented as stored or progressive (its index first: remuxed at the first request, then kept in storage).
Shared by `/v1/renders`, the signed playback links and `/ops`, which find the session their own way first."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fastapi import HTTPException
from fastapi.responses import FileResponse, Response, StreamingResponse
from sqlalchemy.orm import Session

from monologue import captions, keys, repo
from monologue.contracts import SessionStatus
from monologue.db import SessionRow
from monologue.errors import NotFound
from monologue.mp4.progressive import remux
from monologue.schemas import VideoLayout
from monologue.storage import LocalStore

from .deps import Services

MEDIA_TYPES = {
    ".m3u8": "application/vnd.apple.mpegurl",
    ".mp4": "video/mp4",
    ".m4s": "video/iso.segment",
    **{f".{fmt.value}": media_type for fmt, media_type in captions.MEDIA_TYPES.items()},
}


def stream_file(services: Services, session_id: str, name: str) -> Response:
    """One file of the HLS stream of a session the caller may see; 404 for any other name."""
    if not keys.PUBLIC_OUTPUT.fullmatch(name):
        raise HTTPException(
            404, f"no file {name!r}: the stream has stream.m3u8, init.mp4 and seg-<chunk>.m4s (and captions.vtt/.srt)"
        )
    key = keys.output(session_id, name)
    media_type = MEDIA_TYPES[name[name.rindex(".") :]]
    # The playlist changes while the render runs; segments never change once written.
    cache = "no-cache" if name.endswith(".m3u8") else "public, max-age=31536000, immutable"
    try:
        data = services.store.get(key)
    except NotFound:
        raise HTTPException(404, f"{name} is not published yet for render {session_id}") from None
    return Response(data, media_type=media_type, headers={"Cache-Control": cache})


def video_file(
    services: Services, db: Session, row: SessionRow, layout: VideoLayout = VideoLayout.FRAGMENTED
) -> Response:
    """The finished MP4 of a session the caller may see; 409 until it is completed. Blocking (a first progressive
    request remuxes the video): call it from a sync route, which runs on the thread pool."""
    session_id = row.id
    if row.outputs_removed_at is not None:
        raise HTTPException(
            410, f"render {session_id}'s video was removed at {row.outputs_removed_at.isoformat()} (retention)"
        )
    if row.status != SessionStatus.COMPLETED or row.video_key is None:
        done = repo.chunks_done(db, session_id=session_id)
        raise HTTPException(
            409,
            f"render {session_id} is {row.status} ({done}/{row.chunks_total or '?'} chunks);"
            " the video is available once status is 'completed'",
        )
    key = row.video_key if layout == VideoLayout.FRAGMENTED else _progressive(services, row.video_key, session_id)
    store = services.store
    headers = {"Content-Disposition": f'inline; filename="{session_id}.mp4"'}
    if isinstance(store, LocalStore):
        return FileResponse(store.path(key), media_type="video/mp4", headers=headers)
    headers["Content-Length"] = str(store.size(key))
    return StreamingResponse(store.stream(key), media_type="video/mp4", headers=headers)


def _progressive(services: Services, video_key: str, session_id: str) -> str:
    """The progressive MP4's key, made from the fragmented one if it is not stored yet. Two first requests at once
    both make it; the bytes are the same and each put is atomic, so either may win."""
    store, key = services.store, keys.progressive_video(session_id)
    if store.exists(key):
        return key
    with tempfile.TemporaryDirectory(prefix="monologue-progressive-") as folder:
        path = Path(folder) / "progressive.mp4"
        with path.open("wb") as out:
            remux(lambda start, end: store.get_range(video_key, start, end), store.size(video_key), out)
        store.put_file(key, path, content_type="video/mp4")
    return key
