"""Read-only queries behind the operator's UI: sessions filtered and paged with their chunk totals in
two queries (not one per row), and a session's checkpoints. Never writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from monologue.contracts import SessionKind, SessionStatus
from monologue.db import CheckpointRow, ChunkRow, ChunkStatus, SessionRow


@dataclass(frozen=True)
class SessionFilter:
    """Every field left at None matches all sessions."""

    status: SessionStatus | None = None
    tenant: str | None = None
    node: str | None = None
    kind: SessionKind | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        for column, value in (
            (SessionRow.status, self.status),
            (SessionRow.tenant, self.tenant),
            (SessionRow.node_id, self.node),
            (SessionRow.kind, self.kind),
        ):
            if value is not None:
                query = query.where(column == value)
        return query


@dataclass(frozen=True)
class ChunkTotals:
    chunks_done: int
    frames_done: int


def list_sessions(db: Session, *, where: SessionFilter, limit: int, offset: int) -> tuple[list[SessionRow], int]:
    """One page of sessions, newest first, and how many match in all."""
    page = where.apply(select(SessionRow)).order_by(SessionRow.created_at.desc(), SessionRow.id)
    total = db.scalar(where.apply(select(func.count()).select_from(SessionRow)))
    return list(db.scalars(page.limit(limit).offset(offset))), int(total or 0)


def chunk_totals(db: Session, *, session_ids: Iterable[str]) -> dict[str, ChunkTotals]:
    """Per session: chunks done and the frames they hold (sessions without a chunk are left out)."""
    ids = list(session_ids)
    if not ids:
        return {}
    query = (
        select(ChunkRow.session_id, func.count(), func.coalesce(func.sum(ChunkRow.frames), 0))
        .where(ChunkRow.session_id.in_(ids), ChunkRow.status == ChunkStatus.DONE)
        .group_by(ChunkRow.session_id)
    )
    return {sid: ChunkTotals(int(count), int(frames)) for sid, count, frames in db.execute(query)}


def list_checkpoints(db: Session, *, session_id: str) -> list[CheckpointRow]:
    query = select(CheckpointRow).where(CheckpointRow.session_id == session_id).order_by(CheckpointRow.index)
    return list(db.scalars(query))
