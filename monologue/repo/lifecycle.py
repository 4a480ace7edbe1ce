"""Data access for a session's data lifecycle: the tombstone a DELETE leaves, and which sessions retention is due to
clear. The objects themselves are removed by `monologue.lifecycle`; these functions only read and mark rows.
Keyword-only functions over a SQLAlchemy session."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from monologue.contracts import TERMINAL
from monologue.contracts.retention import DataPart
from monologue.db import AudioTicketRow, CheckpointRow, ChunkRow, SessionRow, SinkRow, WebhookEndpointRow, utcnow

_REMOVED_AT = {DataPart.INPUTS: SessionRow.inputs_removed_at, DataPart.OUTPUTS: SessionRow.outputs_removed_at}


def mark_deleted(db: Session, *, session_id: str) -> None:
    """The session is being deleted: the API answers 410 for it from now on, and its lease number moves past every
    node lease's, so a chunk still finishing on a node is refused before its next write to storage or to the
    database (`repo.fence`): nothing lands after its objects are removed."""
    query = update(SessionRow).where(SessionRow.id == session_id)
    db.execute(query.values(deleted_at=func.coalesce(SessionRow.deleted_at, utcnow()), lease=SessionRow.lease + 1))
    db.commit()


def purged(row: SessionRow) -> bool:
    """Every object of a deleted session is gone (a DELETE that failed half-way is not: the next one goes on)."""
    return row.deleted_at is not None and row.inputs_removed_at is not None and row.outputs_removed_at is not None


def keep_tombstone(db: Session, *, session_id: str) -> None:
    """A deleted session's objects are gone: keep only its tombstone. The row keeps its id, tenant, kind, status,
    times and sizes (what billing and the ops view count); what its options, metadata and error said (a prompt, a
    transcript) is cleared, its chunks, checkpoints, sinks and audio tickets are removed, and its callback endpoint
    is deleted as a tenant's is (no more sends, its secret dropped; its deliveries stay listed)."""
    now = utcnow()
    for table in (ChunkRow, CheckpointRow, SinkRow, AudioTicketRow):
        db.execute(delete(table).where(table.session_id == session_id))
    cleared: dict[str, Any] = {
        "options": {},
        "client_metadata": None,
        "error": None,
        "video_key": None,
        "audio_socket": None,
        "audio_socket_at": None,
    }
    removed = {
        "inputs_removed_at": func.coalesce(SessionRow.inputs_removed_at, now),
        "outputs_removed_at": func.coalesce(SessionRow.outputs_removed_at, now),
    }
    db.execute(update(SessionRow).where(SessionRow.id == session_id).values(**cleared, **removed))
    callback = update(WebhookEndpointRow).where(WebhookEndpointRow.session_id == session_id)
    db.execute(callback.values(disabled_at=func.coalesce(WebhookEndpointRow.disabled_at, now), secret=None))
    db.commit()


def due(db: Session, *, part: DataPart, ended_before: datetime, limit: int) -> list[SessionRow]:
    """Sessions that ended before `ended_before` and still hold `part`, oldest first. A session still going is never
    due, whatever its age: only the workflow's end decides when its data stops being used; nor is one being deleted
    (a DELETE that failed half-way is the next DELETE's to finish: it also removes the sinks' copies)."""
    removed_at = _REMOVED_AT[part]
    ended = func.coalesce(SessionRow.finished_at, SessionRow.created_at)
    query = (
        select(SessionRow)
        .where(removed_at.is_(None), SessionRow.deleted_at.is_(None), SessionRow.status.in_(TERMINAL))
        .where(ended < ended_before)
        .order_by(ended, SessionRow.id)
        .limit(limit)
    )
    return list(db.scalars(query))


def mark_removed(db: Session, *, session_id: str, part: DataPart) -> None:
    """`part` of the session is gone from storage. Inputs take the checkpoints' rows with them (their files were
    among the inputs)."""
    if part is DataPart.INPUTS:
        db.execute(delete(CheckpointRow).where(CheckpointRow.session_id == session_id))
    db.execute(update(SessionRow).where(SessionRow.id == session_id).values({_REMOVED_AT[part]: utcnow()}))
    db.commit()
