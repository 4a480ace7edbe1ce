"""Live audio tickets: `tk_<id>_<secret>`, single-use and short-lived, open one live session's audio socket without
an Authorization header (a browser's WebSocket cannot send one). Only a ticket's SHA-256 is stored; redeeming it is
one conditional UPDATE (unused, unexpired), so of two sockets racing with one ticket one gets in, across API
processes too; it then opens the socket only for its own session and while the key that asked for it stands."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session

from monologue.db import ApiKeyRow, AudioTicketRow, utcnow

_TICKET = re.compile(r"tk_([0-9a-f]{12})_[A-Za-z0-9_-]{32}")


def issue(db: Session, *, session_id: str, tenant: str, key_id: str | None, ttl_s: float) -> tuple[str, datetime]:
    """A new ticket for `session_id`: (ticket, when it expires). Shown once; only its hash is kept."""
    ticket_id = secrets.token_hex(6)
    ticket = f"tk_{ticket_id}_{secrets.token_urlsafe(24)}"
    now = utcnow()
    expires = now + timedelta(seconds=ttl_s)
    db.add(
        AudioTicketRow(
            id=ticket_id,
            session_id=session_id,
            tenant=tenant,
            key_id=key_id,
            ticket_hash=_hash(ticket),
            created_at=now,
            expires_at=expires,
        )
    )
    db.commit()
    return ticket, expires


def redeem(db: Session, *, ticket: str, session_id: str) -> AudioTicketRow | None:
    """The ticket's row if it is for `session_id`, unused, unexpired and its key not revoked, now marked used;
    None otherwise. A genuine ticket is used up by any try, also one on another session or after its key was
    revoked: a ticket seen where it should not be (a log, a shared link) opens nothing later."""
    match = _TICKET.fullmatch(ticket)
    row = db.get(AudioTicketRow, match.group(1)) if match else None
    if row is None or not hmac.compare_digest(row.ticket_hash, _hash(ticket)):
        return None
    now = utcnow()
    result = db.execute(
        update(AudioTicketRow)
        .where(AudioTicketRow.id == row.id, AudioTicketRow.used_at.is_(None), AudioTicketRow.expires_at > now)
        .values(used_at=now)
    )
    db.commit()
    if getattr(result, "rowcount", 0) != 1 or row.session_id != session_id:
        return None
    return row if _key_stands(db, row.key_id) else None


def _key_stands(db: Session, key_id: str | None) -> bool:
    """Whether the key that asked for a ticket is still valid (None: the keyless operator on loopback)."""
    if key_id is None:
        return True
    key = db.get(ApiKeyRow, key_id)
    return key is not None and key.revoked_at is None


def _hash(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()
