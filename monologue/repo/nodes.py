"""Data access for the node registry (the `nodes` table): each node process writes its own row every
few seconds; the ops UI reads them. Keyword-only functions over a SQLAlchemy session.

A row is a node's own report, never a verdict about it: a node killed outright leaves `status` at
`up`, and only the age of its last heartbeat (computed by the reader) says it has gone quiet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from monologue.db import NodeRow, NodeStatus, utcnow


def report_node(
    db: Session,
    *,
    node_id: str,
    capacity: int,
    status: NodeStatus,
    sessions: list[str],
    chunks_done: int,
    memory_mb: float | None,
    started_at: datetime,
    media_url: str | None = None,
) -> None:
    """Upsert the node's row with a fresh heartbeat (a node restarted under the same id overwrites it)."""
    if status not in set(NodeStatus):
        raise ValueError(f"node status must be one of {', '.join(NodeStatus)}, got {status!r}")
    db.merge(
        NodeRow(
            id=node_id,
            capacity=capacity,
            status=status,
            sessions=sessions,
            chunks_done=chunks_done,
            memory_mb=memory_mb,
            started_at=started_at,
            heartbeat_at=utcnow(),
            media_url=media_url,
        )
    )
    db.commit()


def list_nodes(db: Session) -> list[NodeRow]:
    return list(db.scalars(select(NodeRow).order_by(NodeRow.id)))


def get_node(db: Session, *, node_id: str) -> NodeRow | None:
    return db.get(NodeRow, node_id)


# A node reports every 2 s (node/registry.py); one silent this long is no place to run, and holds nothing it listed
# (the ops UI marks it silent after the same time).
FRESH_HEARTBEAT_S = 10.0


def live_nodes(db: Session, *, now: datetime, fresh_s: float = FRESH_HEARTBEAT_S) -> list[NodeRow]:
    """Nodes that are up and reported within `fresh_s`: the slots there are and the sessions held now."""
    fresh = now - timedelta(seconds=fresh_s)
    nodes = db.scalars(select(NodeRow).where(NodeRow.status == NodeStatus.UP))
    return [node for node in nodes if aware(node.heartbeat_at) >= fresh]


def heartbeat_age_s(node: NodeRow, *, now: datetime) -> float:
    """Seconds since the node last wrote its row."""
    return (now - aware(node.heartbeat_at)).total_seconds()


def chunks_per_minute(node: NodeRow, *, now: datetime) -> float:
    """Chunks done per minute since the node started (up to its last heartbeat once it has stopped)."""
    end = aware(node.heartbeat_at) if node.status == NodeStatus.STOPPED else now
    minutes = (end - aware(node.started_at)).total_seconds() / 60
    return node.chunks_done / minutes if minutes > 0 else 0.0


def aware(moment: datetime) -> datetime:
    """SQLite returns naive datetimes even for timezone-aware columns; they were written in UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
