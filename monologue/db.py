"""Database models (SQLAlchemy 2) and the engine. The schema is owned by the Alembic migrations in
`migrations/`; `migrate()` applies them. SQLite (embedded default) and PostgreSQL (psycopg) both work."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, TypeDecorator, create_engine, event
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.pool import NullPool

from monologue.contracts import ChunkKind, SessionKind, SessionStatus, SinkType
from monologue.localfs import private_file
from monologue.schemas import DeliveryStatus, SinkState, WebhookEvent
from monologue.settings import DatabasePoolSettings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A moment, always read back with its zone. SQLite keeps none and returns naive values; everything here
    is written in UTC (`utcnow`), so they get UTC back, as PostgreSQL's already have it. Without this the API
    sent times without an offset on SQLite, which are not RFC 3339 date-times."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return value if value is None or value.tzinfo is not None else value.replace(tzinfo=UTC)


E = TypeVar("E", bound=StrEnum)


class EnumText(TypeDecorator[E]):
    """An enum stored as its plain value (a short string column, as before the enums, so no migration and
    every reader of the table sees the same text) and read back as the enum."""

    impl = String(16)
    cache_ok = True

    def __init__(self, enum: type[E], length: int = 16) -> None:
        super().__init__(length)
        self.enum = enum

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        # Plain text passes: a filter with a value no enum member has simply matches nothing.
        return None if value is None else str(value.value if isinstance(value, StrEnum) else value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum(value)


class ChunkStatus(StrEnum):
    """A chunk's status. Its row is written once the chunk is made, so the table holds `done` only; the ops
    timeline says `pending` (not made yet) or `running` (the next in generation order) of chunks with no row."""

    DONE = "done"
    RUNNING = "running"
    PENDING = "pending"


class NodeStatus(StrEnum):
    """What a node last said of itself: up, draining (told to stop, finishing its chunks), stopped (exited). A
    node killed outright stays `up`: only its heartbeat's age says it has gone quiet."""

    UP = "up"
    DRAINING = "draining"
    STOPPED = "stopped"


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, datetime: UtcDateTime()}


class SessionRow(Base):
    """One session (a render or a live one). Its workflow moves it through queued → running → completed | failed |
    cancelled; a DELETE leaves a tombstone of it (`deleted_at`)."""

    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), default="local", index=True)
    kind: Mapped[SessionKind] = mapped_column(EnumText(SessionKind), default=SessionKind.RENDER)
    status: Mapped[SessionStatus] = mapped_column(EnumText(SessionStatus), default=SessionStatus.QUEUED, index=True)
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    node_id: Mapped[str | None] = mapped_column(String(128))
    workflow_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    ttff_ms: Mapped[float | None] = mapped_column(Float)  # submit → first chunk encoded
    audio_seconds: Mapped[float | None] = mapped_column(Float)
    frames: Mapped[int | None] = mapped_column(Integer)
    chunks_total: Mapped[int | None] = mapped_column(Integer)
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    video_key: Mapped[str | None] = mapped_column(String(512))
    error: Mapped[str | None] = mapped_column(Text)
    audio_samples: Mapped[int | None] = mapped_column(Integer)  # live sessions: audio received so far
    latency: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # live: audio in → segment out p50/p95 ms
    # Live sessions: the audio socket open now (its holder's id) and when it last said so; a claim older than a
    # few key re-checks is stale (its API process died), so a reconnect is not locked out forever.
    audio_socket: Mapped[str | None] = mapped_column(String(32))
    audio_socket_at: Mapped[datetime | None]
    # Renders: times the session gave its slot up to a waiting session, and when it was last asked to and for whom
    # (cleared once it has); see monologue/repo/sched.py.
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    yield_asked_at: Mapped[datetime | None]
    yield_for: Mapped[str | None] = mapped_column(String(64))  # the waiting session it was asked for
    # The newest node lease that claimed the session: a node's write under an older one is refused (repo/fence.py).
    lease: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Data lifecycle (monologue/lifecycle.py): when the session's inputs (portrait, speech and what is derived from
    # them) and its outputs (stream, video) were removed, by retention or a DELETE; and when a DELETE made the row a
    # tombstone (the API answers 410 Gone for it).
    inputs_removed_at: Mapped[datetime | None]
    outputs_removed_at: Mapped[datetime | None]
    deleted_at: Mapped[datetime | None]
    # The create's `metadata` (schemas.SessionMetadata), returned as given and never read here. Not `metadata`:
    # SQLAlchemy's declarative classes keep that name for themselves.
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The avatar the session's portrait came from (`AvatarRow`), so "is this avatar in use" is a query.
    avatar_id: Mapped[str | None] = mapped_column(String(64), index=True)


class ChunkRow(Base):
    """One generated chunk; keyed by (session, kind, index) so a retried activity overwrites it."""

    __tablename__ = "chunks"

    session_id: Mapped[str] = mapped_column(String(64), ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[ChunkKind] = mapped_column(EnumText(ChunkKind, 1), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    first_frame: Mapped[int] = mapped_column(Integer)
    frames: Mapped[int] = mapped_column(Integer)
    status: Mapped[ChunkStatus] = mapped_column(EnumText(ChunkStatus), default=ChunkStatus.DONE)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    node_id: Mapped[str | None] = mapped_column(String(128))
    stage_ms: Mapped[dict[str, Any]] = mapped_column(default=dict)  # per stage: context, audio_to_video, …
    segment_key: Mapped[str | None] = mapped_column(String(512))
    frames_sha256: Mapped[str | None] = mapped_column(String(64))  # hash of the per-frame hashes
    audio_ready_at: Mapped[datetime | None]  # live sessions: when the chunk's last audio sample arrived
    published_at: Mapped[datetime | None]  # when its segment entered the playlist
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class CheckpointRow(Base):
    """A checkpoint (the anchors an N chunk left, and the cursor) in object storage, with its SHA-256 so a
    corrupt or missing file is noticed before its anchors are trusted. Only the last two are kept."""

    __tablename__ = "checkpoints"

    session_id: Mapped[str] = mapped_column(String(64), ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)  # the N chunk's index
    key: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SinkRow(Base):
    """One publisher of a session besides its own HLS stream (S3, Kinesis Video Streams): how far it got."""

    __tablename__ = "sinks"

    session_id: Mapped[str] = mapped_column(String(64), ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[SinkType] = mapped_column(EnumText(SinkType))
    status: Mapped[SinkState] = mapped_column(EnumText(SinkState), default=SinkState.STARTING)
    acknowledged: Mapped[int] = mapped_column(Integer, default=0)  # leading segments the far side holds
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class NodeRow(Base):
    """A node as it last reported itself (written by the node every few seconds; read by the ops UI)."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    capacity: Mapped[int] = mapped_column(Integer)
    status: Mapped[NodeStatus] = mapped_column(EnumText(NodeStatus), default=NodeStatus.UP)
    sessions: Mapped[list[str]] = mapped_column(JSON, default=list)
    chunks_done: Mapped[int] = mapped_column(Integer, default=0)
    memory_mb: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    media_url: Mapped[str | None] = mapped_column(String(256))  # its WebRTC signalling port (node/webrtc/)


class ApiKeyRow(Base):
    """An API key: only its SHA-256 is stored; `id` is the key's public prefix, for listing and revoking."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class AudioTicketRow(Base):
    """A single-use, short-lived ticket that opens one live session's audio socket (browsers cannot send an
    Authorization header on a WebSocket). Only its SHA-256 is stored; `used_at` is set once, when it is used."""

    __tablename__ = "audio_tickets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64), ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str | None] = mapped_column(String(32))  # the API key that asked for it (None: keyless ops)
    ticket_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]


class IdempotencyKeyRow(Base):
    """An `Idempotency-Key` a tenant sent with a create: the request it came with (its SHA-256) and the session
    it made. The primary key is the uniqueness: of two requests racing with one key, one insert wins."""

    __tablename__ = "idempotency_keys"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_sha256: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(64))  # its row exists once the first request has recorded it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


class WebhookEndpointRow(Base):
    """Where a tenant's session events go (or one session's: `session_id`), signed with the endpoint's secret (shown
    once, when it is created)."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    url: Mapped[str] = mapped_column(Text)
    # Needed to sign, so kept (never shown again), encrypted under MONOLOGUE_WEBHOOKS__SECRET_KEYS: a Fernet token
    # (`whsec_<base64>` itself in rows from before 0005, until `monologue webhooks rotate-key`); None once deleted.
    secret: Mapped[str | None] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None]
    # A session's own endpoint (its create's `callback_url`): only that session's events go to it, and it is not
    # among the tenant's endpoints (listed, counted, deleted). None: a tenant's endpoint.
    session_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("sessions.id", ondelete="CASCADE", name="fk_webhook_endpoints_session_id"), index=True
    )


class WebhookDeliveryRow(Base):
    """One event for one endpoint: its id is the `webhook-id` every attempt sends, so receivers deduplicate."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True
    )
    tenant: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(64), index=True)
    event: Mapped[WebhookEvent] = mapped_column(EnumText(WebhookEvent, 32))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[DeliveryStatus] = mapped_column(EnumText(DeliveryStatus), default=DeliveryStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)


class WebhookAttemptRow(Base):
    """One try of a delivery: when, how long, and what came back (a status code, or why there was none)."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    duration_ms: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


class AvatarRow(Base):
    """A portrait checked once (`POST /v1/avatars`) and named by sessions instead of an upload; its objects live
    under `keys.avatar_prefix(tenant, id)`."""

    __tablename__ = "avatars"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    width: Mapped[int] = mapped_column(Integer)  # the normalised portrait
    height: Mapped[int] = mapped_column(Integer)
    portrait_sha256: Mapped[str] = mapped_column(String(64))  # of the normalised portrait


def make_engine(url: str, pool: DatabasePoolSettings | None = None) -> Engine:
    """An engine for `url` with `pool`'s sizes (default: DatabasePoolSettings' defaults); SQLite gets WAL and a
    busy timeout because the API and nodes share it."""
    pool = pool or DatabasePoolSettings()
    sizes = {"pool_size": pool.size, "max_overflow": pool.max_overflow, "pool_timeout": pool.timeout_s}
    if url.startswith("sqlite"):
        _private_sqlite_file(url)
        if url.removeprefix("sqlite:///") in ("", ":memory:", "sqlite://"):
            sizes = {}  # an in-memory database lives in one connection (SingletonThreadPool), not a sized pool
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **sizes)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **sizes)


def _private_sqlite_file(url: str) -> None:
    """Create a SQLite database file 0600 (in a 0700 folder when that is new) before SQLite does (0644): it holds
    every tenant's sessions and the API keys' hashes. SQLite gives its -wal and -shm files the same mode."""
    if not url.startswith("sqlite:///") or url.removeprefix("sqlite:///") in ("", ":memory:"):
        return
    private_file(Path(url.removeprefix("sqlite:///")))


def make_sessionmaker(engine: Engine) -> sessionmaker[Any]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


MIGRATION_LOCK = 0x6D6F6E6F6C6F6775  # PostgreSQL advisory lock key held while migrating ("monologu")


def migrate(url: str, revision: str = "head") -> None:
    """Bring the schema at `url` up to `revision` (creating the SQLite folder if needed).

    Safe to run from several processes at once (API processes starting together): on PostgreSQL each waits for
    an advisory lock, so the first migrates and the others then find the schema already at `revision`.
    SQLite's migrations take its write lock for their whole run (`migrations/env.py`), with the same effect."""
    from alembic import command

    _private_sqlite_file(url)
    if not url.startswith("postgresql"):
        command.upgrade(alembic_config(url), revision)
        return
    engine = create_engine(url, poolclass=NullPool)
    try:
        # A session-level lock on a connection of its own: the migration runs on another connection (and
        # commits there), so a transaction-level lock here would not cover it.
        with engine.connect() as lock:
            lock.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
            try:
                command.upgrade(alembic_config(url), revision)
            finally:
                lock.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


@functools.cache
def schema_head() -> str:
    """The newest migration's revision: the schema this code needs."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations in {MIGRATIONS_DIR}")
    return head


def schema_problem(connection: Connection) -> str | None:
    """Why the database's schema is not the one this code needs (no migration applied yet, or another one), or
    None when it is."""
    from sqlalchemy import inspect, text

    if not inspect(connection).has_table("alembic_version"):
        return f"no migrations applied: run `monologue migrate` (this code needs {schema_head()})"
    current = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    if current != schema_head():
        return f"the schema is at {current}, this code needs {schema_head()}: run `monologue migrate`"
    return None
