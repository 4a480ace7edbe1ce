"""Migrations up and down on SQLite and on a real PostgreSQL, and the idempotent writes on both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import inspect

from monologue import repo
from monologue.db import downgrade, make_engine, make_sessionmaker, migrate
from tests.helpers import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/test.db"
        return
    with postgres_database() as url:
        yield url


def test_migrations_upgrade_and_downgrade(database_url: str) -> None:
    migrate(database_url)
    engine = make_engine(database_url)
    assert {"sessions", "chunks", "alembic_version"} <= set(inspect(engine).get_table_names())
    downgrade(database_url, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate(database_url)
    assert {"sessions", "chunks"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_chunk_writes_are_idempotent_and_progress_counts_them(database_url: str) -> None:
    migrate(database_url)
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as db:
        repo.create_session(
            db,
            session_id="s1",
            tenant="local",
            options={"fps": 25},
            workflow_id="render-s1",
            audio_seconds=3.0,
            width=512,
            height=512,
        )
        repo.mark_running(db, session_id="s1", frames=75, chunks_total=2)
        for _ in range(2):  # a retried activity writes the same row again
            repo.record_chunk(
                db,
                session_id="s1",
                kind="N",
                index=0,
                first_frame=0,
                frames=40,
                node_id="n",
                attempt=1,
                stage_ms={"context": 1.0, "encode": 2.0},
                segment_key="k0",
                frames_sha256="a" * 64,
            )
        assert repo.chunks_done(db, session_id="s1") == 1
        row = repo.get_session(db, session_id="s1")
        assert row is not None and row.status == "running" and row.ttff_ms is not None and row.ttff_ms >= 0
        repo.mark_completed(db, session_id="s1", video_key="v", frames=10, chunks=1)
        assert repo.get_session(db, session_id="s1").status == "completed"  # type: ignore[union-attr]
        repo.delete_session(db, session_id="s1")
        assert repo.get_session(db, session_id="s1") is None
        assert repo.chunks_done(db, session_id="s1") == 0  # chunks go with their session
    engine.dispose()
