"""Alembic environment: runs migrations against the URL set by `monologue.db.alembic_config`
(or `sqlalchemy.url` in alembic.ini when run from the command line). It must never lose rows that a revision's
schema can hold: on SQLite it is the one place that makes table rebuilds safe, for every migration present or
future."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine, event

from monologue.db import Base, make_engine

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: set sqlalchemy.url or use `monologue migrate`")
    engine = make_engine(url)
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:
        _sqlite_without_cascades_in_one_transaction(engine)
    applied: list[str] = []
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                # Batch mode lets SQLite alter tables (it cannot ALTER most things in place).
                render_as_batch=True,
                # One transaction for the whole run, on SQLite too: a failed migration (or the foreign key check
                # below) then leaves the database as it was, not half rebuilt.
                transactional_ddl=True,
                on_version_apply=lambda **step: applied.append(str(step["step"])),
            )
            with context.begin_transaction():
                context.run_migrations()
                if sqlite and applied:
                    _check_foreign_keys(connection)
    finally:
        engine.dispose()


def _sqlite_without_cascades_in_one_transaction(engine: Engine) -> None:
    """Turn foreign keys off, and take over BEGIN from pysqlite, on this engine's connections (it is disposed
    after the run, so no other code gets them).

    Batch mode rebuilds a table as create-copy-drop-rename. With foreign keys on (`make_engine` turns them on),
    dropping the old `sessions` deletes its rows, and ON DELETE CASCADE empties `chunks`, `checkpoints` and
    `sinks` with it. SQLite's own procedure for altering a table says to turn foreign keys off around it, and
    the pragma is a no-op inside a transaction, so it is set when the connection opens. pysqlite would not BEGIN
    before DDL (each CREATE or DROP committed alone), so BEGIN is ours, IMMEDIATE so a second process migrating
    at the same moment waits for the write lock instead of failing halfway."""

    @event.listens_for(engine, "connect")
    def _foreign_keys_off(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN or COMMIT of its own
        dbapi_connection.execute("PRAGMA foreign_keys=OFF")

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _check_foreign_keys(connection: Connection) -> None:
    """With foreign keys off, nothing stopped a migration from leaving a row whose parent is gone; refuse to
    commit one (raising rolls the whole run back)."""
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        listed = ", ".join(f"{table} rowid {rowid} → {parent}" for table, rowid, parent, _ in broken[:10])
        raise RuntimeError(
            f"migration rolled back: {len(broken)} rows would break a foreign key ({listed}). Nothing was changed;"
            " delete or fix those rows (`PRAGMA foreign_key_check` lists them) and migrate again"
        )


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
