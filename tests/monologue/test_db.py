"""Migrations up and down on SQLite and on a real PostgreSQL, and the idempotent writes on both."""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum

import pytest
from sqlalchemy import inspect, select, text

from monologue import repo
from monologue.contracts import ChunkKind, SessionKind, SessionStatus, SinkType
from monologue.db import (
    Base,
    ChunkRow,
    ChunkStatus,
    EnumText,
    NodeRow,
    NodeStatus,
    SessionRow,
    SinkRow,
    WebhookDeliveryRow,
    WebhookEndpointRow,
    downgrade,
    make_engine,
    make_sessionmaker,
    migrate,
)
from monologue.schemas import DeliveryStatus, SinkState, WebhookEvent
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


def _every_member(*enums: type[StrEnum]) -> list[tuple[StrEnum, ...]]:
    """Enough rows that each enum's every member is in one: row i takes member i of each (wrapping round)."""
    members = [list(enum) for enum in enums]
    return [tuple(values[i % len(values)] for values in members) for i in range(max(map(len, members)))]


def test_every_state_round_trips_as_its_enum_and_is_stored_as_its_text(database_url: str) -> None:
    """Each enum column, every member: read back as the member itself, held in the table as its plain value
    (text, as before the enums, so no row needed migrating)."""
    migrate(database_url)
    engine = make_engine(database_url)
    with make_sessionmaker(engine)() as db:
        for i, (status, kind) in enumerate(_every_member(SessionStatus, SessionKind)):
            db.add(SessionRow(id=f"s{i}", status=status, kind=kind))
        db.flush()
        for i, (status, kind) in enumerate(_every_member(ChunkStatus, ChunkKind)):
            db.add(ChunkRow(session_id="s0", kind=kind, index=i, first_frame=0, frames=1, status=status))
        for i, (status, kind) in enumerate(_every_member(SinkState, SinkType)):
            db.add(SinkRow(session_id="s0", name=f"sink{i}", kind=kind, status=status))
        for i, (node_status,) in enumerate(_every_member(NodeStatus)):
            db.add(NodeRow(id=f"node{i}", capacity=1, status=node_status))
        db.add(WebhookEndpointRow(id="e", tenant="local", url="https://example.com/hook"))
        db.flush()
        for i, (event, delivery) in enumerate(_every_member(WebhookEvent, DeliveryStatus)):
            db.add(
                WebhookDeliveryRow(
                    id=f"d{i}", endpoint_id="e", tenant="local", session_id="s0", event=event, status=delivery
                )
            )
        db.commit()
    columns = [
        (table.name, column, column.type.enum)
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, EnumText)
    ]
    assert len(columns) == 9  # sessions, chunks and sinks: kind and status; nodes: status; deliveries: event, status
    with make_sessionmaker(engine)() as db:
        for table, column, enum in columns:
            read = list(db.scalars(select(column)))
            assert set(read) == set(enum) and all(type(value) is enum for value in read), f"{table}.{column.name}"
            stored = list(db.scalars(text(f"SELECT {column.name} FROM {table}")))
            assert {type(value) for value in stored} == {str} and set(stored) == {member.value for member in enum}
    engine.dispose()
