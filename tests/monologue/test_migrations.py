"""Migrations keep data: rows seeded at every revision survive every upgrade and downgrade, on SQLite and on a
real PostgreSQL. Only a dropped table may take its rows, and only a dropped column its values.

The schema each revision adds is written out here, column by column, instead of taken from `monologue.db`'s
models: those describe the head, and a test of old revisions must not change when the head does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, Engine, Float, Integer, String, Text, create_engine, insert, inspect, select, text
from sqlalchemy.sql import TableClause, column, table
from sqlalchemy.types import TypeEngine

from monologue.db import UtcDateTime, downgrade, make_engine, migrate
from tests.helpers import postgres_database

Columns = dict[str, TypeEngine[Any]]
Rows = dict[str, list[dict[str, Any]]]

# What each revision adds: new tables whole, new columns of older tables (types as the app writes and reads them).
ADDED: dict[str, dict[str, Columns]] = {
    "0001": {
        "sessions": {
            "id": String(),
            "tenant": String(),
            "kind": String(),
            "status": String(),
            "options": JSON(),
            "node_id": String(),
            "workflow_id": String(),
            "created_at": UtcDateTime(),
            "started_at": UtcDateTime(),
            "finished_at": UtcDateTime(),
            "ttff_ms": Float(),
            "audio_seconds": Float(),
            "frames": Integer(),
            "chunks_total": Integer(),
            "width": Integer(),
            "height": Integer(),
            "video_key": String(),
            "error": Text(),
        },
        "chunks": {
            "session_id": String(),
            "kind": String(),
            "index": Integer(),
            "first_frame": Integer(),
            "frames": Integer(),
            "status": String(),
            "attempt": Integer(),
            "node_id": String(),
            "stage_ms": JSON(),
            "segment_key": String(),
            "frames_sha256": String(),
            "updated_at": UtcDateTime(),
        },
    },
    "0002": {
        "checkpoints": {
            "session_id": String(),
            "index": Integer(),
            "key": String(),
            "sha256": String(),
            "created_at": UtcDateTime(),
        },
    },
    "0003": {
        "sessions": {"audio_samples": Integer(), "latency": JSON()},
        "chunks": {"audio_ready_at": UtcDateTime(), "published_at": UtcDateTime()},
        "sinks": {
            "session_id": String(),
            "name": String(),
            "kind": String(),
            "status": String(),
            "acknowledged": Integer(),
            "error": Text(),
            "updated_at": UtcDateTime(),
        },
        "nodes": {
            "id": String(),
            "capacity": Integer(),
            "status": String(),
            "sessions": JSON(),
            "chunks_done": Integer(),
            "memory_mb": Float(),
            "started_at": UtcDateTime(),
            "heartbeat_at": UtcDateTime(),
        },
        "api_keys": {
            "id": String(),
            "tenant": String(),
            "key_hash": String(),
            "scopes": JSON(),
            "created_at": UtcDateTime(),
            "revoked_at": UtcDateTime(),
        },
    },
    "0004": {
        "sessions": {"audio_socket": String(), "audio_socket_at": UtcDateTime()},
        "audio_tickets": {
            "id": String(),
            "session_id": String(),
            "tenant": String(),
            "key_id": String(),
            "ticket_hash": String(),
            "created_at": UtcDateTime(),
            "expires_at": UtcDateTime(),
            "used_at": UtcDateTime(),
        },
        "idempotency_keys": {
            "tenant": String(),
            "key": String(),
            "request_sha256": String(),
            "session_id": String(),
            "created_at": UtcDateTime(),
            "expires_at": UtcDateTime(),
        },
        "webhook_endpoints": {
            "id": String(),
            "tenant": String(),
            "url": Text(),
            "secret": String(),
            "events": JSON(),
            "created_at": UtcDateTime(),
            "disabled_at": UtcDateTime(),
        },
        "webhook_deliveries": {
            "id": String(),
            "endpoint_id": String(),
            "tenant": String(),
            "session_id": String(),
            "event": String(),
            "payload": JSON(),
            "status": String(),
            "attempts": Integer(),
            "created_at": UtcDateTime(),
            "finished_at": UtcDateTime(),
            "error": Text(),
        },
        "webhook_attempts": {
            "delivery_id": String(),
            "attempt": Integer(),
            "started_at": UtcDateTime(),
            "duration_ms": Float(),
            "status_code": Integer(),
            "error": Text(),
        },
    },
    "0005": {},  # no column added: webhook_endpoints.secret made Text, nullable (see test_webhook_secrets.py)
    "0006": {"sessions": {"preemptions": Integer(), "yield_asked_at": UtcDateTime(), "yield_for": String()}},
    "0007": {"sessions": {"lease": Integer()}},
    "0008": {
        "sessions": {
            "inputs_removed_at": UtcDateTime(),
            "outputs_removed_at": UtcDateTime(),
            "deleted_at": UtcDateTime(),
        }
    },
    "0009": {"sessions": {"client_metadata": JSON()}, "webhook_endpoints": {"session_id": String()}},
    "0010": {
        "avatars": {
            "id": String(),
            "tenant": String(),
            "created_at": UtcDateTime(),
            "width": Integer(),
            "height": Integer(),
            "portrait_sha256": String(),
        },
        "sessions": {"avatar_id": String()},
    },
}
REVISIONS = list(ADDED)
# Columns added with a server default: older rows get the default, not NULL.
SERVER_DEFAULTS = {("sessions", "preemptions"): 0, ("sessions", "lease"): 0}


def position(revision: str) -> int:
    return REVISIONS.index(revision) if revision != "base" else -1


def schema(revision: str) -> dict[str, Columns]:
    """Every table and column that exists at `revision` ("base": none)."""
    tables: dict[str, Columns] = {}
    for done in REVISIONS[: position(revision) + 1]:
        for name, columns in ADDED[done].items():
            tables[name] = {**tables.get(name, {}), **columns}
    return tables


def full_rows(tag: str, number: int) -> dict[str, dict[str, Any]]:
    """One row per table with every column of the head filled in (no NULLs, so a lost value shows)."""
    moment = datetime(2026, 11, 30, 12, number, 7, 123456, tzinfo=UTC)
    session = f"s-{tag}"
    return {
        "sessions": {
            "id": session,
            "tenant": f"tenant-{tag}",
            "kind": "live",
            "status": "running",
            "options": {"fps": 25, "tag": tag},
            "node_id": "node-a",
            "workflow_id": f"render-{session}",
            "created_at": moment,
            "started_at": moment,
            "finished_at": moment,
            "ttff_ms": 812.5,
            "audio_seconds": 3.25,
            "frames": 81,
            "chunks_total": 3,
            "width": 512,
            "height": 384,
            "video_key": f"videos/{session}.mp4",
            "error": f"error of {tag}",
            "audio_samples": 52000 + number,
            "latency": {"p50": 250.0, "p95": 410.5},
            "audio_socket": f"socket-{tag}",
            "audio_socket_at": moment,
            "preemptions": 2,
            "yield_asked_at": moment,
            "yield_for": f"live-{tag}",
            "lease": 3 + number,
            "inputs_removed_at": moment,
            "outputs_removed_at": moment,
            "deleted_at": moment,
            "client_metadata": {"order": f"o-{tag}", "n": number},
            "avatar_id": f"avatar-{tag}",
        },
        "chunks": {
            "session_id": session,
            "kind": "N",
            "index": number,
            "first_frame": 40 * number,
            "frames": 40,
            "status": "done",
            "attempt": 2,
            "node_id": "node-a",
            "stage_ms": {"context": 1.5, "encode": 2.0},
            "segment_key": f"segments/{session}/{number}.ts",
            "frames_sha256": "a" * 64,
            "updated_at": moment,
            "audio_ready_at": moment,
            "published_at": moment,
        },
        "checkpoints": {
            "session_id": session,
            "index": number,
            "key": f"checkpoints/{session}/{number}",
            "sha256": "b" * 64,
            "created_at": moment,
        },
        "sinks": {
            "session_id": session,
            "name": "archive",
            "kind": "s3",
            "status": "streaming",
            "acknowledged": number,
            "error": "slow down",
            "updated_at": moment,
        },
        "nodes": {
            "id": f"node-{tag}",
            "capacity": 2,
            "status": "draining",
            "sessions": [session],
            "chunks_done": 17,
            "memory_mb": 2048.5,
            "started_at": moment,
            "heartbeat_at": moment,
        },
        "api_keys": {
            "id": f"key-{tag}",
            "tenant": f"tenant-{tag}",
            "key_hash": f"{tag:0>64}",
            "scopes": ["submit", "read"],
            "created_at": moment,
            "revoked_at": moment,
        },
        "audio_tickets": {
            "id": f"ticket-{tag}",
            "session_id": session,
            "tenant": f"tenant-{tag}",
            "key_id": f"key-{tag}",
            "ticket_hash": "c" * 64,
            "created_at": moment,
            "expires_at": moment,
            "used_at": moment,
        },
        "idempotency_keys": {
            "tenant": f"tenant-{tag}",
            "key": f"retry-{tag}",
            "request_sha256": "d" * 64,
            "session_id": session,
            "created_at": moment,
            "expires_at": moment,
        },
        "webhook_endpoints": {
            "id": f"hook-{tag}",
            "tenant": f"tenant-{tag}",
            "url": f"https://hooks.example/{tag}",
            "secret": f"whsec_{tag}",
            "events": ["session.completed"],
            "created_at": moment,
            "disabled_at": moment,
            "session_id": session,
        },
        "webhook_deliveries": {
            "id": f"msg-{tag}",
            "endpoint_id": f"hook-{tag}",
            "tenant": f"tenant-{tag}",
            "session_id": session,
            "event": "session.failed",
            "payload": {"type": "session.failed", "tag": tag},
            "status": "delivered",
            "attempts": 3,
            "created_at": moment,
            "finished_at": moment,
            "error": "503 from the receiver",
        },
        "webhook_attempts": {
            "delivery_id": f"msg-{tag}",
            "attempt": number,
            "started_at": moment,
            "duration_ms": 12.5,
            "status_code": 503,
            "error": "service unavailable",
        },
        "avatars": {
            "id": f"avatar-{tag}",
            "tenant": f"tenant-{tag}",
            "created_at": moment,
            "width": 512,
            "height": 640 + number,
            "portrait_sha256": "e" * 64,
        },
    }


class Model:
    """What the database must hold: the rows seeded so far, shaped to the current revision's schema."""

    def __init__(self) -> None:
        self.revision = "base"
        self.rows: Rows = {}
        self.seeded = 0

    def seed(self, engine: Engine) -> None:
        """Insert one row into every table the current revision has, each column filled."""
        self.seeded += 1
        rows = full_rows(f"{self.revision}-{self.seeded}", self.seeded)
        with engine.begin() as connection:
            for name, columns in schema(self.revision).items():  # dicts keep order: parents before children
                row = {key: rows[name][key] for key in columns}
                connection.execute(insert(lightweight(name, columns)).values(row))
                self.rows[name].append(row)

    def move_to(self, revision: str) -> None:
        """Reshape the rows as `revision`'s schema holds them: tables it lacks lose their rows, columns it lacks
        their values, and columns it adds are NULL in older rows (or their server default)."""
        tables = schema(revision)
        self.rows = {
            name: [
                {key: row[key] if key in row else SERVER_DEFAULTS.get((name, key)) for key in columns}
                for row in self.rows.get(name, [])
            ]
            for name, columns in tables.items()
        }
        self.revision = revision


def lightweight(name: str, columns: Columns) -> TableClause:
    """The table as this test knows it at one revision (not the head models of `monologue.db`)."""
    return table(name, *(column(key, type_) for key, type_ in columns.items()))


def read_all(engine: Engine, revision: str) -> Rows:
    with engine.connect() as connection:
        return {
            name: [dict(row) for row in connection.execute(select(lightweight(name, columns))).mappings()]
            for name, columns in schema(revision).items()
        }


def in_order(rows: Rows) -> Rows:
    return {name: sorted(values, key=lambda row: json.dumps(row, default=str)) for name, values in rows.items()}


def current_revision(engine: Engine) -> str:
    with engine.connect() as connection:
        if "alembic_version" not in inspect(connection).get_table_names():
            return "base"
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none() or "base"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/test.db"
        return
    with postgres_database() as url:
        yield url


# Up one revision at a time (seeding at each), down one and several at once, down to nothing and up again.
PATH = ["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0002", "0003", "0004", "0001", "0002"]
PATH += ["0003", "0004", "base", "0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010"]


def test_rows_survive_every_upgrade_and_downgrade(database_url: str) -> None:
    engine = make_engine(database_url)
    model = Model()
    try:
        for revision in PATH:
            going_up = position(revision) > position(model.revision)
            (migrate if going_up else downgrade)(database_url, revision)
            model.move_to(revision)
            tables = set(inspect(engine).get_table_names()) - {"alembic_version"}
            assert (current_revision(engine), tables) == (revision, set(schema(revision)))
            assert in_order(read_all(engine, revision)) == in_order(model.rows), f"after moving to {revision}"
            if going_up:
                model.seed(engine)
                assert in_order(read_all(engine, revision)) == in_order(model.rows), f"seeded at {revision}"
        # The rows seeded since base (at 0001 to 0010), so the comparisons above were not of empty tables.
        counts = {name: len(rows) for name, rows in model.rows.items()}
        since_0003 = dict.fromkeys(["sinks", "nodes", "api_keys"], 8) | dict.fromkeys(ADDED["0004"], 7)
        assert counts == {"chunks": 10, "checkpoints": 9} | since_0003 | {"sessions": 10, "avatars": 1}
        # The rebuilt tables still hold their foreign keys: a deleted session takes its chunks, checkpoints, sinks,
        # tickets and callback endpoints; a deleted endpoint its deliveries and their attempts.
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM sessions"))
            connection.execute(text("DELETE FROM webhook_endpoints"))
        remaining = {name: len(rows) for name, rows in read_all(engine, "0010").items()}
        kept = {"nodes": 8, "api_keys": 8, "idempotency_keys": 7, "avatars": 1}  # no parent row: kept
        assert remaining == dict.fromkeys(remaining, 0) | kept
    finally:
        engine.dispose()


def test_a_migration_that_breaks_a_foreign_key_on_sqlite_fails_and_changes_nothing(tmp_path: Path) -> None:
    """SQLite migrations run with foreign keys off (so rebuilding a table does not cascade into its children);
    the check afterwards must refuse to commit rows whose parent is missing."""
    url = f"sqlite:///{tmp_path}/test.db"
    migrate(url, "0002")
    unchecked = create_engine(url)  # SQLite's default: foreign keys not enforced, as in a database made elsewhere
    with unchecked.begin() as connection:
        columns = schema("0002")["chunks"]
        orphan = {key: value for key, value in full_rows("orphan", 1)["chunks"].items() if key in columns}
        connection.execute(insert(lightweight("chunks", columns)).values(orphan))
    unchecked.dispose()
    with pytest.raises(RuntimeError, match=r"foreign key.*chunks"):
        migrate(url, "0003")
    engine = make_engine(url)
    try:
        assert current_revision(engine) == "0002"
        assert "audio_samples" not in {info["name"] for info in inspect(engine).get_columns("sessions")}
        assert "nodes" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
