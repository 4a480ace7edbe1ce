"""A session as the API shows it (`RenderPublic`), and finding one the caller may see: shared by the renders, live
sessions, playback, events and webhook routes. Links are built from public_url, never from the request's Host."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import HTTPException
from sqlalchemy.orm import Session

from monologue import contracts as c, options as options_, queueing, repo
from monologue.db import SessionRow
from monologue.repo import sinks as repo_sinks, webhooks as repo_webhooks
from monologue.schemas import AudioTicket, Latency, Progress, RenderLinks, RenderPublic, SinkStatus

from . import queue
from .deps import Principal, Services
from .links import caption_links, playback_links
from .origin import public_base, public_ws_base


def find(db: Session, session_id: str, principal: Principal) -> SessionRow:
    """The session if the caller's tenant owns it; 404 otherwise (not 403: ids of others do not leak), 410 if it was
    deleted."""
    row = owned(db, session_id, principal)
    if row.deleted_at is not None:
        raise HTTPException(
            410, f"render {session_id!r} was deleted at {row.deleted_at.isoformat()}: its files and options are gone"
        )
    return row


def owned(db: Session, session_id: str, principal: Principal) -> SessionRow:
    """The session if the caller's tenant owns it, deleted or not; 404 otherwise."""
    row = repo.get_session(db, session_id=session_id)
    if row is None or (principal.tenant is not None and row.tenant != principal.tenant):
        raise HTTPException(404, f"render {session_id!r} not found")
    return row


def shown(db: Session, services: Services, session_id: str, principal: Principal) -> RenderPublic:
    """The session as the caller's tenant sees it (`public`); 404 for another tenant's or no session."""
    return public(services, db, find(db, session_id, principal))


def public(
    services: Services,
    db: Session,
    row: SessionRow,
    *,
    ticket: AudioTicket | None = None,
    estimate: queueing.Estimate | None = None,
) -> RenderPublic:
    """The session as `GET /v1/renders/{id}` shows it; `ticket`: the audio ticket of a live session just made;
    `estimate`: the queue's, when the caller shows several sessions (read here when one is needed and not given)."""
    settings = services.settings
    base, ws_base = public_base(settings.api), public_ws_base(settings.api)
    ui, namespace = settings.temporal.ui_url, settings.temporal.namespace
    callback = repo_webhooks.session_endpoint(db, session_id=row.id)
    options = c.render_options(row.options)
    captioned = options.captions is not c.CaptionMode.NONE  # the multivariant playlist with the subtitle rendition
    return RenderPublic(
        id=row.id,
        kind=row.kind,
        status=row.status,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        options=options_.request_model().model_validate(options_.stored(options)),
        width=row.width,
        height=row.height,
        audio_seconds=row.audio_seconds,
        ttff_ms=row.ttff_ms,
        latency=Latency.model_validate(row.latency) if row.latency else None,
        sinks=[
            SinkStatus(
                name=sink.name,
                type=sink.kind,
                status=sink.status,
                acknowledged=sink.acknowledged,
                error=sink.error,
                playback=f"{base}/v1/renders/{row.id}/sinks/{sink.name}/stream.m3u8"
                if sink.kind == c.SinkType.S3
                else None,
            )
            for sink in repo_sinks.list_sinks(db, session_id=row.id)
        ],
        error=row.error,
        progress=Progress(
            chunks_done=repo.chunks_done(db, session_id=row.id),
            chunks_total=row.chunks_total,
            frames_total=row.frames,
            retries=repo.chunk_retries(db, session_id=row.id),
            preemptions=row.preemptions,
        ),
        queue=queue.place(services, db, row, estimate),
        links=RenderLinks(
            stream=f"{base}/v1/renders/{row.id}/stream.m3u8",
            captioned_stream=f"{base}/v1/renders/{row.id}/main.m3u8" if captioned else None,
            captions=caption_links(f"{base}/v1/renders/{row.id}") if captioned else None,
            self=f"{base}/v1/renders/{row.id}",
            video=f"{base}/v1/renders/{row.id}/video.mp4",
            workflow=f"{ui}/namespaces/{namespace}/workflows/{quote(row.workflow_id or '')}",
            audio=f"{ws_base}/v1/sessions/{row.id}/audio" if row.kind == c.SessionKind.LIVE else None,
            playback=playback_links(settings, row.id, captioned=captioned, webrtc=_webrtc(row)),
        ),
        audio_ticket=ticket,
        avatar_id=row.avatar_id,
        metadata=row.client_metadata,
        callback_url=None if callback is None else callback.url,
    )


def _webrtc(row: SessionRow) -> bool:
    """A live session delivered over WebRTC (its links then include the player and WHEP endpoint)."""
    return row.kind == c.SessionKind.LIVE and row.options.get("delivery") == c.Delivery.WEBRTC
