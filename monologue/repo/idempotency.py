"""Idempotency keys: which session a tenant's `Idempotency-Key` made, and with which request.

A key is claimed by inserting its row; the primary key (tenant, key) decides between requests racing with one
key, in the database (SQLite and PostgreSQL alike), so there is no check-then-insert window: one insert wins and
every other request finds its row. A key names its session until it expires; a request that failed releases its
key, so the client's retry starts afresh."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from monologue.db import IdempotencyKeyRow, utcnow
from monologue.repo.nodes import aware


class Claimed(StrEnum):
    NEW = "new"  # this request owns the key: make the session
    REPLAY = "replay"  # the key's first request made (or is making) `session_id`, from the same request
    MISMATCH = "mismatch"  # the key was used with another request


@dataclass(frozen=True)
class Claim:
    outcome: Claimed
    session_id: str


def claim(db: Session, *, tenant: str, key: str, request_sha256: str, session_id: str, ttl_s: float) -> Claim:
    """Claim `key` for a new session `session_id`, or learn which session it already names."""
    for _ in range(5):  # each pass ends in an answer unless the row vanished or expired meanwhile
        now = utcnow()
        # The expired keys go first, in the same transaction: they name nothing any more.
        row = IdempotencyKeyRow(
            tenant=tenant,
            key=key,
            request_sha256=request_sha256,
            session_id=session_id,
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_s),
        )
        db.execute(delete(IdempotencyKeyRow).where(IdempotencyKeyRow.expires_at <= now))
        db.add(row)
        try:
            db.commit()
            return Claim(Claimed.NEW, session_id)
        except IntegrityError:
            db.rollback()
        held = db.get(IdempotencyKeyRow, (tenant, key))
        if held is None:  # released by a request that failed: try again
            continue
        if aware(held.expires_at) <= now:
            db.execute(
                delete(IdempotencyKeyRow).where(
                    IdempotencyKeyRow.tenant == tenant,
                    IdempotencyKeyRow.key == key,
                    IdempotencyKeyRow.expires_at <= now,
                )
            )
            db.commit()
            continue
        outcome = Claimed.REPLAY if held.request_sha256 == request_sha256 else Claimed.MISMATCH
        return Claim(outcome, held.session_id)
    raise RuntimeError(f"idempotency key {key!r} of tenant {tenant}: the claim did not settle")


def holder(db: Session, *, tenant: str, key: str) -> str | None:
    """The session the key names now (None: released)."""
    db.expire_all()  # what the database holds now, not what this session read before
    held = db.get(IdempotencyKeyRow, (tenant, key))
    return None if held is None else held.session_id


def release(db: Session, *, tenant: str, key: str, session_id: str) -> None:
    """Free the key of a request that failed (only if it still names that request's session)."""
    db.execute(
        delete(IdempotencyKeyRow).where(
            IdempotencyKeyRow.tenant == tenant, IdempotencyKeyRow.key == key, IdempotencyKeyRow.session_id == session_id
        )
    )
    db.commit()
