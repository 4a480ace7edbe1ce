"""Avatars (`db.AvatarRow`): keyword-only functions over a SQLAlchemy session. Every read is scoped to a tenant, so
another tenant's id finds nothing."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from monologue.contracts import TERMINAL
from monologue.db import AvatarRow, SessionRow, utcnow


def create_avatar(
    db: Session, *, avatar_id: str, tenant: str, width: int, height: int, portrait_sha256: str
) -> AvatarRow:
    row = AvatarRow(
        id=avatar_id, tenant=tenant, width=width, height=height, portrait_sha256=portrait_sha256, created_at=utcnow()
    )
    db.add(row)
    db.commit()
    return row


def get_avatar(db: Session, *, tenant: str, avatar_id: str) -> AvatarRow | None:
    row = db.get(AvatarRow, avatar_id)
    return row if row is not None and row.tenant == tenant else None


def list_avatars(db: Session, *, tenant: str, limit: int, offset: int) -> list[AvatarRow]:
    """A page of the tenant's avatars, newest first."""
    query = select(AvatarRow).where(AvatarRow.tenant == tenant)
    query = query.order_by(AvatarRow.created_at.desc(), AvatarRow.id)
    return list(db.scalars(query.limit(limit).offset(offset)))


def sessions_using(db: Session, *, avatar_id: str) -> list[str]:
    """The ids of the sessions made from the avatar that have not ended (queued, running, cancelling)."""
    query = select(SessionRow.id).where(
        SessionRow.avatar_id == avatar_id,
        SessionRow.status.not_in(list(TERMINAL)),
        SessionRow.deleted_at.is_(None),
    )
    return list(db.scalars(query.order_by(SessionRow.created_at)))


def delete_avatar(db: Session, *, tenant: str, avatar_id: str) -> bool:
    """Remove the tenant's avatar row; False if it has none of that id. Sessions made from it keep theirs."""
    row = get_avatar(db, tenant=tenant, avatar_id=avatar_id)
    if row is None:
        return False
    db.delete(row)
    db.commit()
    return True
