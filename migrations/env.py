"""Alembic environment: runs migrations against the URL set by `monologue.db.alembic_config`
(or `sqlalchemy.url` in alembic.ini when run from the command line)."""

from __future__ import annotations

from alembic import context

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
    with engine.connect() as connection:
        # Batch mode lets SQLite alter tables (it cannot ALTER most things in place).
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
