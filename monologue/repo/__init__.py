"""Data access: keyword-only functions over a SQLAlchemy session. Every write is idempotent (keyed
by session id, or by (session, chunk kind, index)) so a retried activity rewrites the same row."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, text, update
from sqlalchemy.orm import Session

from monologue import metrics
from monologue.contracts import RESUMABLE, TERMINAL, ChunkKind, SessionKind, SessionStatus
from monologue.db import CheckpointRow, ChunkRow, ChunkStatus, SessionRow, utcnow
from monologue.repo import fence


def create_session(
    db: Session,
    *,
    session_id: str,
    tenant: str,
    options: dict[str, Any],
    workflow_id: str,
    audio_seconds: float,
    width: int,
    height: int,
    kind: SessionKind = SessionKind.RENDER,
    client_metadata: dict[str, Any] | None = None,
    avatar_id: str | None = None,
) -> SessionRow:
    row = SessionRow(
        id=session_id,
        tenant=tenant,
        kind=kind,
        status=SessionStatus.QUEUED,
        options=options,
        workflow_id=workflow_id,
        audio_seconds=audio_seconds,
        width=width,
        height=height,
        created_at=utcnow(),
        client_metadata=client_metadata,
        avatar_id=avatar_id,
    )
    db.add(row)
    db.commit()
    return row


def create_session_within_limit(db: Session, *, limit: int, **fields: Any) -> SessionRow | None:
    """`create_session(db, **fields)` unless the tenant already has `limit` queued or running sessions (then
    None, and nothing is written). The count and the insert hold a per-tenant write lock: two API processes on
    one database would otherwise both count one place free and both take it."""
    lock_tenant(db, tenant=fields["tenant"])
    if active_sessions(db, tenant=fields["tenant"]) >= limit:
        db.rollback()  # releases the lock
        return None
    return create_session(db, **fields)  # its commit releases the lock


def lock_tenant(db: Session, *, tenant: str) -> None:
    """Until this transaction ends, no other holds the tenant's lock. PostgreSQL: a transaction-level advisory
    lock on the tenant's name (other tenants do not wait). SQLite: the database's write lock, taken before the
    count (pysqlite would take it only at the INSERT, after both counts), waiting up to the busy timeout."""
    dialect = db.get_bind().dialect.name
    if dialect == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": f"tenant:{tenant}"})
    elif dialect == "sqlite":
        db.execute(text("BEGIN IMMEDIATE"))
    else:
        raise ValueError(f"no tenant lock for the {dialect} database; Monologue supports PostgreSQL and SQLite")


def delete_session(db: Session, *, session_id: str) -> None:
    row = db.get(SessionRow, session_id)
    if row is not None:
        db.delete(row)
        db.commit()


def get_session(db: Session, *, session_id: str) -> SessionRow | None:
    return db.get(SessionRow, session_id)


def list_sessions(
    db: Session, *, limit: int, offset: int, status: SessionStatus | None = None, tenant: str | None = None
) -> list[SessionRow]:
    """A page of sessions, newest first; deleted ones (tombstones) are not listed."""
    query = select(SessionRow).where(SessionRow.deleted_at.is_(None))
    query = query.order_by(SessionRow.created_at.desc(), SessionRow.id)
    if status is not None:
        query = query.where(SessionRow.status == status)
    if tenant is not None:
        query = query.where(SessionRow.tenant == tenant)
    return list(db.scalars(query.limit(limit).offset(offset)))


def active_sessions(db: Session, *, tenant: str) -> int:
    """Queued or running sessions of a tenant (the per-tenant concurrency limit)."""
    active = (SessionStatus.QUEUED, SessionStatus.RUNNING)
    query = select(func.count()).where(SessionRow.tenant == tenant, SessionRow.status.in_(active))
    return int(db.scalar(query) or 0)


def mark_running(db: Session, *, session_id: str, frames: int, chunks_total: int) -> None:
    row = _require(db, session_id)
    row.frames = frames
    row.chunks_total = chunks_total
    row.started_at = row.started_at or utcnow()
    db.commit()
    _start(db, session_id, _GOING)  # a late retry of prepare does not revive an ended session


def set_node(db: Session, *, session_id: str, node_id: str, lease: int = fence.UNFENCED) -> str | None:
    """The node that holds the session now, under `lease` (LeaseFenced if a newer lease holds it); a queued (or
    resumed) session is running from here on. Returns the node that held it before (None for a new session)."""
    fence.claim(db, session_id=session_id, lease=lease)
    row = _require(db, session_id)
    previous, row.node_id = row.node_id, node_id
    db.commit()
    # a live session's clock starts with its first audio (record_live_audio)
    started = {} if row.kind == SessionKind.LIVE else {"started_at": func.coalesce(SessionRow.started_at, utcnow())}
    _start(db, session_id, {SessionStatus.QUEUED}, **started)
    return previous


def _start(db: Session, session_id: str, allowed: Iterable[SessionStatus], **values: Any) -> None:
    """The session is running, if it is still in one of `allowed` (compare-and-set: a cancel that ended it
    between our read and this write stands)."""
    query = update(SessionRow).where(SessionRow.id == session_id, SessionRow.status.in_(allowed))
    db.execute(query.values(status=SessionStatus.RUNNING, **values))
    db.commit()


def record_chunk(
    db: Session,
    *,
    session_id: str,
    kind: ChunkKind,
    index: int,
    first_frame: int,
    frames: int,
    node_id: str,
    attempt: int,
    stage_ms: dict[str, float],
    segment_key: str,
    frames_sha256: str,
    audio_ready_ms: float | None = None,
    lease: int = fence.UNFENCED,
) -> float | None:
    """Upsert the chunk row (LeaseFenced if `lease` no longer holds the session); for a render, the first chunk
    done also sets the time to first frame (a live session's is set when its first segment is published: see
    `mark_published`). Returns the TTFF in ms when this chunk set it."""
    fence.hold(db, session_id=session_id, lease=lease)
    db.merge(
        ChunkRow(
            session_id=session_id,
            kind=kind,
            index=index,
            first_frame=first_frame,
            frames=frames,
            status=ChunkStatus.DONE,
            attempt=attempt,
            node_id=node_id,
            stage_ms=stage_ms,
            segment_key=segment_key,
            frames_sha256=frames_sha256,
            audio_ready_at=None if audio_ready_ms is None else datetime.fromtimestamp(audio_ready_ms / 1000, UTC),
            updated_at=utcnow(),
        )
    )
    row = _require(db, session_id)
    ttff_ms = None
    if row.ttff_ms is None and row.kind != SessionKind.LIVE:
        row.ttff_ms = ttff_ms = (utcnow() - _aware(row.created_at)).total_seconds() * 1000
    db.commit()
    return ttff_ms


def chunks_done(db: Session, *, session_id: str) -> int:
    query = (
        select(func.count())
        .select_from(ChunkRow)
        .where(ChunkRow.session_id == session_id, ChunkRow.status == ChunkStatus.DONE)
    )
    return int(db.scalar(query) or 0)


def chunk_retries(db: Session, *, session_id: str) -> int:
    query = select(func.coalesce(func.sum(ChunkRow.attempt - 1), 0)).where(ChunkRow.session_id == session_id)
    return int(db.scalar(query) or 0)


def mark_resumed(db: Session, *, session_id: str) -> None:
    row = _require(db, session_id)
    row.status = SessionStatus.QUEUED
    row.error = None
    row.finished_at = None
    db.commit()


def list_chunks(db: Session, *, session_id: str) -> list[ChunkRow]:
    query = select(ChunkRow).where(ChunkRow.session_id == session_id).order_by(ChunkRow.first_frame)
    return list(db.scalars(query))


# Only a session still going may end: a terminal status is never overwritten, whichever write comes last.
_GOING = frozenset(SessionStatus) - TERMINAL


def mark_completed(
    db: Session, *, session_id: str, video_key: str, frames: int, chunks: int, lease: int = fence.UNFENCED
) -> bool:
    """The final video is stored (a live session learns its length here). False if the session had already
    ended otherwise (its workflow decided first); a retried finalize finds it completed and gets True.
    LeaseFenced if `lease` no longer holds the session."""
    fence.hold(db, session_id=session_id, lease=lease)
    ended = _end(
        db,
        session_id,
        SessionStatus.COMPLETED,
        frames=frames,
        chunks_total=chunks,
        video_key=video_key,
        error=None,
    )
    return ended or _status(db, session_id) == SessionStatus.COMPLETED


def mark_ended(db: Session, *, session_id: str, status: SessionStatus, error: str | None) -> bool:
    """The session ended without a video: `failed` (with the error) or `cancelled`. False (and nothing
    written) if it had already ended: a completed video is never shown as cancelled."""
    if status not in RESUMABLE:
        raise ValueError(f"status {status!r}: a session ends without a video only as one of {sorted(RESUMABLE)}")
    return _end(db, session_id, status, error=error)


def _end(db: Session, session_id: str, status: SessionStatus, **values: Any) -> bool:
    """Compare-and-set in one statement, so two writers racing (finalize and a cancel) cannot both win. The one
    place a session's status becomes terminal: it is counted here, once (a retry, or the loser of a race, sets
    nothing and counts nothing)."""
    kind = _require(db, session_id).kind
    query = update(SessionRow).where(SessionRow.id == session_id, SessionRow.status.in_(_GOING))
    result = db.execute(query.values(status=status, finished_at=utcnow(), **values))
    db.commit()
    ended = bool(result.rowcount == 1)  # type: ignore[attr-defined]
    if ended:
        metrics.SESSIONS_FINISHED.labels(kind=kind.value, status=status.value).inc()
    return ended


def _status(db: Session, session_id: str) -> str | None:
    return db.scalar(select(SessionRow.status).where(SessionRow.id == session_id))


def record_checkpoint(
    db: Session, *, session_id: str, index: int, key: str, sha256: str, keep: int = 2, lease: int = fence.UNFENCED
) -> list[str]:
    """Upsert checkpoint `index` (LeaseFenced if `lease` no longer holds the session); drop the rows older than the
    last `keep`. Returns the dropped keys."""
    fence.hold(db, session_id=session_id, lease=lease)
    db.merge(CheckpointRow(session_id=session_id, index=index, key=key, sha256=sha256, created_at=utcnow()))
    stale = list(
        db.scalars(
            select(CheckpointRow).where(CheckpointRow.session_id == session_id, CheckpointRow.index <= index - keep)
        )
    )
    for row in stale:
        db.delete(row)
    db.commit()
    return [row.key for row in stale]


def get_checkpoint(db: Session, *, session_id: str, index: int) -> CheckpointRow | None:
    return db.get(CheckpointRow, (session_id, index))


def generated_chunks(db: Session, *, session_id: str) -> set[tuple[str, int]]:
    """(kind, index) of every chunk done: where a resumed session picks up."""
    query = select(ChunkRow.kind, ChunkRow.index).where(
        ChunkRow.session_id == session_id, ChunkRow.status == ChunkStatus.DONE
    )
    return {(kind, index) for kind, index in db.execute(query)}


def _require(db: Session, session_id: str) -> SessionRow:
    row = db.get(SessionRow, session_id)
    if row is None:
        raise LookupError(f"session {session_id} has no row; was it deleted?")
    return row


def _aware(moment: Any) -> Any:
    # SQLite returns naive datetimes even for timezone-aware columns; they were written in UTC.
    from datetime import UTC

    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def claim_audio_socket(db: Session, *, session_id: str, holder: str, takeover_s: float) -> bool:
    """Make `holder` the live session's one audio socket; False while another holds it and brought audio within
    `takeover_s`. A socket silent that long is taken over: its client has reconnected (a dropped connection the
    server has not noticed yet), or its API process died."""
    now = utcnow()
    free = or_(SessionRow.audio_socket.is_(None), SessionRow.audio_socket_at < now - timedelta(seconds=takeover_s))
    result = db.execute(
        update(SessionRow)
        .where(SessionRow.id == session_id, free)
        .values(audio_socket=holder, audio_socket_at=now, audio_samples=func.coalesce(SessionRow.audio_samples, 0))
    )
    db.commit()
    return bool(getattr(result, "rowcount", 0) == 1)


def refresh_audio_socket(db: Session, *, session_id: str, holder: str) -> bool:
    """The socket brought audio just now; False if another socket has taken over meanwhile."""
    result = db.execute(
        update(SessionRow)
        .where(SessionRow.id == session_id, SessionRow.audio_socket == holder)
        .values(audio_socket_at=utcnow())
    )
    db.commit()
    return bool(getattr(result, "rowcount", 0) == 1)


def audio_socket_holder(db: Session, *, session_id: str) -> str | None:
    return db.scalar(select(SessionRow.audio_socket).where(SessionRow.id == session_id))


def release_audio_socket(db: Session, *, session_id: str, holder: str) -> None:
    """The socket closed: a reconnect may take its place at once."""
    db.execute(
        update(SessionRow)
        .where(SessionRow.id == session_id, SessionRow.audio_socket == holder)
        .values(audio_socket=None, audio_socket_at=None)
    )
    db.commit()


def record_live_audio(db: Session, *, session_id: str, samples: int, rate: int) -> None:
    """Audio stored for a live session so far; the first call (on its first audio) starts the session's
    clock, for TTFF."""
    row = _require(db, session_id)
    row.audio_samples = samples
    row.audio_seconds = samples / rate
    row.started_at = row.started_at or utcnow()
    db.commit()


@dataclass
class Published:
    """What one `mark_published` changed: the session's latency figures, its TTFF if set now, and each live
    chunk stamped now's wait (audio stored → published)."""

    latency: dict[str, Any] | None = None
    ttff_ms: float | None = None
    new_waits_ms: list[float] = field(default_factory=list)


def mark_published(db: Session, *, session_id: str, published_frames: int) -> Published:
    """Stamp the chunks whose segments just entered the playlist, and refresh the session's live latency
    figures (audio stored → segment published, p50/p95 ms) and, for a live session, its TTFF (first audio
    stored → first segment published)."""
    now = utcnow()
    unpublished = (
        ChunkRow.session_id == session_id,
        ChunkRow.published_at.is_(None),
        ChunkRow.first_frame < published_frames,
    )
    ready = db.scalars(select(ChunkRow.audio_ready_at).where(*unpublished, ChunkRow.audio_ready_at.is_not(None)))
    published = Published(new_waits_ms=[(now - _aware(at)).total_seconds() * 1000 for at in ready])
    db.execute(update(ChunkRow).where(*unpublished).values(published_at=now))
    row = _require(db, session_id)
    if row.kind == SessionKind.LIVE and row.ttff_ms is None and row.started_at is not None and published_frames > 0:
        row.ttff_ms = published.ttff_ms = (now - _aware(row.started_at)).total_seconds() * 1000
    if row.kind == SessionKind.LIVE:  # only live chunks know when their audio arrived
        pairs = db.execute(
            select(ChunkRow.audio_ready_at, ChunkRow.published_at).where(
                ChunkRow.session_id == session_id,
                ChunkRow.audio_ready_at.is_not(None),
                ChunkRow.published_at.is_not(None),
            )
        ).all()
        if pairs:
            waits = sorted((_aware(at) - _aware(ready)).total_seconds() * 1000 for ready, at in pairs)
            row.latency = {
                "chunks": len(waits),
                "p50_ms": round(_percentile(waits, 50), 1),
                "p95_ms": round(_percentile(waits, 95), 1),
                "max_ms": round(waits[-1], 1),
            }
    db.commit()
    published.latency = row.latency
    return published


def _percentile(ordered: list[float], percent: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted list."""
    position = (len(ordered) - 1) * percent / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
