"""API keys: `mk_<id>_<secret>`, sent as `Authorization: Bearer <key>`. Only the SHA-256 of a key is stored;
`id` (public, 8 hex digits) finds the row, and the hash is compared in constant time.

Each key belongs to one tenant and sees only that tenant's sessions. Scopes (`Scope`) grant more: `ops` opens
the operator's UI (`/ops`), which sees every tenant; `priority` lets the key start renders with `priority=high`
(docs/scheduling.md), which an `ops` key may too (`HIGH_PRIORITY_SCOPES`). The embedded stack creates a local key
(tenant `local`, scope `ops`) at first start and keeps it in `<home>/api-key`, where the CLI finds it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from enum import StrEnum
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from monologue.db import ApiKeyRow, utcnow


class Scope(StrEnum):
    """What a key may do beyond its tenant's sessions: `ops` opens the operator's UI; `priority` starts renders with
    priority=high."""

    OPS = "ops"
    PRIORITY = "priority"


SCOPES = tuple(scope.value for scope in Scope)
# Who may ask for priority=high: keys given `priority`, and the operator's own keys (an `ops` key can already cancel
# any tenant's session and make keys, so refusing it high priority would protect nothing).
HIGH_PRIORITY_SCOPES = frozenset({Scope.PRIORITY.value, Scope.OPS.value})
# Checked with `fullmatch`: `match` with `$` also accepts a trailing newline.
TENANT = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_KEY = re.compile(r"mk_([0-9a-f]{8})_[A-Za-z0-9_-]{20,64}")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check_tenant(tenant: str) -> str:
    if not TENANT.fullmatch(tenant):
        raise ValueError(f"tenant {tenant!r}: use 1-64 lowercase letters, digits and dashes")
    return tenant


def create_key(db: Session, *, tenant: str, scopes: tuple[str, ...] = ()) -> tuple[str, str]:
    """A new key for `tenant`: (id, key). The key is shown once; only its hash is kept."""
    check_tenant(tenant)
    unknown = set(scopes) - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes {sorted(unknown)}; known: {', '.join(SCOPES)}")
    key_id = secrets.token_hex(4)
    key = f"mk_{key_id}_{secrets.token_urlsafe(24)}"
    db.add(ApiKeyRow(id=key_id, tenant=tenant, key_hash=hash_key(key), scopes=list(scopes), created_at=utcnow()))
    db.commit()
    return key_id, key


def authenticate(db: Session, key: str) -> ApiKeyRow | None:
    """The key's row if the key is valid and not revoked."""
    match = _KEY.fullmatch(key)
    if match is None:
        return None
    row = db.get(ApiKeyRow, match.group(1))
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, hash_key(key)):
        return None
    return row


def list_keys(db: Session) -> list[ApiKeyRow]:
    return list(db.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at)))


def revoke_key(db: Session, key_id: str) -> bool:
    row = db.get(ApiKeyRow, key_id)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    db.commit()
    return True


def local_key_path(home: Path) -> Path:
    return home / "api-key"


def ensure_local_key(db: Session, home: Path) -> tuple[str, bool]:
    """The embedded stack's key (tenant `local`, scope `ops`), created on first start: (key, created)."""
    path = local_key_path(home)
    if path.exists():
        key = path.read_text().strip()
        if authenticate(db, key) is not None:
            return key, False
    _, key = create_key(db, tenant="local", scopes=("ops",))
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(key + "\n")
    return key, True


def read_local_key(home: Path) -> str | None:
    """The key the CLI uses: MONOLOGUE_API_KEY, else the embedded stack's key file."""
    if os.environ.get("MONOLOGUE_API_KEY"):
        return os.environ["MONOLOGUE_API_KEY"]
    path = local_key_path(home)
    return path.read_text().strip() if path.exists() else None
