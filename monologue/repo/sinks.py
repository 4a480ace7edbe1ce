"""Data access for the `sinks` table: how far each publisher of a session (S3, Kinesis Video) got. One row per
session and sink, written only by that sink's pump (`activities/sinks.py`); the API shows them with the session.
Keyword-only functions over a SQLAlchemy session."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from monologue.contracts import SinkType
from monologue.db import SinkRow, utcnow
from monologue.schemas import SinkState


def record_sink(
    db: Session,
    *,
    session_id: str,
    name: str,
    kind: SinkType,
    status: SinkState,
    acknowledged: int,
    error: str | None = None,
) -> None:
    """Upsert a sink's progress (one row per session and sink: pumps never write each other's rows)."""
    db.merge(
        SinkRow(
            session_id=session_id,
            name=name,
            kind=kind,
            status=status,
            acknowledged=acknowledged,
            error=error,
            updated_at=utcnow(),
        )
    )
    db.commit()


def get_sink(db: Session, *, session_id: str, name: str) -> SinkRow | None:
    return db.get(SinkRow, (session_id, name))


def list_sinks(db: Session, *, session_id: str) -> list[SinkRow]:
    return list(db.scalars(select(SinkRow).where(SinkRow.session_id == session_id).order_by(SinkRow.name)))
