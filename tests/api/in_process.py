"""The API app in this process without its lifespan (so no Temporal), on a real database and local storage: for
tests of routes that read the database and storage only."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from sqlalchemy.orm import sessionmaker

from api.app import create_app
from api.deps import Services
from monologue import apikeys
from monologue.db import SessionRow
from monologue.settings import ApiSettings, Settings
from monologue.storage import LocalStore

OPTIONS = {"fps": 25, "chunk_frames": 40, "i_frames": 4, "seed": 0, "resolution": "source", "family": "warp"}


def make_app(tmp_path: Path, sessions: sessionmaker[Any], **changes: Any) -> FastAPI:
    """The app on `sessions`, storage under `tmp_path/objects`, `changes` to the settings (whole groups)."""
    settings = Settings(home=tmp_path, api=ApiSettings(allowed_hosts=["testserver"]), **changes)
    app = create_app(settings)
    store = LocalStore(tmp_path / "objects")
    app.state.services = Services(settings=settings, store=store, sessions=sessions, temporal=None)  # type: ignore[arg-type]
    return app


def key(sessions: sessionmaker[Any], tenant: str, *scopes: str) -> tuple[str, dict[str, str]]:
    """A new API key of `tenant`: its id and the Authorization header."""
    with sessions() as db:
        key_id, secret = apikeys.create_key(db, tenant=tenant, scopes=scopes)
    return key_id, {"Authorization": f"Bearer {secret}"}


def stored(sessions: sessionmaker[Any], session_id: str, *, tenant: str = "acme", node: str | None = None) -> None:
    """A running render's row (no files)."""
    row = SessionRow(
        id=session_id,
        tenant=tenant,
        kind="render",
        status="running",
        options=OPTIONS,
        workflow_id=f"render-{session_id}",
        node_id=node,
        created_at=datetime.now(UTC),
    )
    with sessions() as db, db.begin():
        db.add(row)
