"""Which one API replica of a cluster exports the cluster-wide figures (`monologue_sessions`, in
`monologue/metrics.py`): every replica answers Prometheus, and a figure each of them reported would be summed
over the replicas. Never raises into a scrape."""

from __future__ import annotations

import contextlib
import threading

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool


class ExporterLock:
    """Whether this API replica is the one that exports the cluster-wide figures. PostgreSQL: the replica holding a
    session-level advisory lock on a connection of its own (outside the pool, so no request waits for it); the
    others try for it at every scrape, so when the holder dies (PostgreSQL ends its connection, and with it the
    lock: at once for a killed process, within ~30 s by the keepalives below for a vanished host) the next scrape
    of another replica takes over. SQLite: one process, always the exporter. The connection must reach PostgreSQL
    itself or a session-pooling proxy: behind PgBouncer's transaction pooling a session's lock means nothing."""

    # The server probes a silent holder's connection after 15 s, then every 5 s, 3 times (Linux's default: 2 hours).
    _KEEPALIVES = "-c tcp_keepalives_idle=15 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"

    def __init__(self, engine: Engine) -> None:
        self._engine: Engine | None = None
        if engine.dialect.name == "postgresql":
            self._engine = create_engine(
                engine.url,
                poolclass=NullPool,  # closing the connection ends the PostgreSQL session, and so the lock
                isolation_level="AUTOCOMMIT",  # no transaction held open for hours (it would hold back VACUUM)
                # tcp_user_timeout: a scrape gives up on a holder's connection that stopped answering after 10 s.
                connect_args={"connect_timeout": 5, "tcp_user_timeout": 10_000, "options": self._KEEPALIVES},
            )
        self._connection: Connection | None = None
        self._held = False
        self._lock = threading.Lock()  # two scrapes at once share one connection

    def held(self) -> bool:
        """True if this replica exports now (taking the lock if it is free); False, never an error, otherwise."""
        if self._engine is None:
            return True
        with self._lock:
            for _ in range(2):  # a held connection the server closed: reconnect once, at once
                try:
                    return self._try(self._engine)
                except SQLAlchemyError:
                    self._drop()
            return False

    def _try(self, engine: Engine) -> bool:
        if self._connection is None:
            self._connection = engine.connect()
        if self._held:
            self._connection.exec_driver_sql("SELECT 1")  # the lock lasts as long as the connection answers
        else:
            key = {"key": "metrics:exporter"}
            self._held = bool(
                self._connection.scalar(text("SELECT pg_try_advisory_lock(hashtextextended(:key, 0))"), key)
            )
        return self._held

    def close(self) -> None:
        """Let another replica export (a stopping API)."""
        with self._lock:
            self._drop()
        if self._engine is not None:
            self._engine.dispose()

    def _drop(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(SQLAlchemyError):  # gone already: so is the lock
                if self._held:
                    # Released now, not when the server's backend has gone after the close (a moment later: another
                    # replica's scrape in that moment found it still held; seen once in CI).
                    self._connection.exec_driver_sql("SELECT pg_advisory_unlock_all()")
                self._connection.close()
        self._connection, self._held = None, False
