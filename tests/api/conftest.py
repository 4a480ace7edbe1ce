"""Fixtures of the API's tests (modules may define their own of the same name)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from monologue.db import make_engine, make_sessionmaker, migrate


@pytest.fixture
def db_sessions(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    """A migrated SQLite database of the test's own."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()
