"""Idempotency keys are claimed by the primary key, not by a check-then-insert: of many requests racing with one key,
on SQLite and on PostgreSQL, exactly one owns it and every other learns its session."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Barrier
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from monologue.db import IdempotencyKeyRow, make_engine, make_sessionmaker, migrate, utcnow
from monologue.repo.idempotency import Claim, Claimed, claim, holder, release
from tests.helpers import postgres_database

RACERS = 8


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    def migrated(url: str) -> Iterator[sessionmaker[Any]]:
        migrate(url)
        engine = make_engine(url)
        yield make_sessionmaker(engine)
        engine.dispose()

    if request.param == "sqlite":
        yield from migrated(f"sqlite:///{tmp_path}/keys.db")
        return
    with postgres_database() as url:
        yield from migrated(url)


def _claim(sessions: sessionmaker[Any], session_id: str, sha: str = "a" * 64, key: str = "retry-1") -> Claim:
    with sessions() as db:
        return claim(db, tenant="acme", key=key, request_sha256=sha, session_id=session_id, ttl_s=3600)


def test_of_racing_requests_with_one_key_exactly_one_owns_it(sessions: sessionmaker[Any]) -> None:
    barrier = Barrier(RACERS)

    def race(number: int) -> Claim:
        barrier.wait()
        return _claim(sessions, f"session-{number}")

    with ThreadPoolExecutor(RACERS) as pool:
        claims = list(pool.map(race, range(RACERS)))
    owners = [c for c in claims if c.outcome == Claimed.NEW]
    assert len(owners) == 1
    assert {c.outcome for c in claims} == {Claimed.NEW, Claimed.REPLAY}
    assert {c.session_id for c in claims} == {owners[0].session_id}  # every other names the owner's session


def test_another_request_is_a_mismatch_a_released_key_is_free_and_an_expired_one_too(
    sessions: sessionmaker[Any],
) -> None:
    assert _claim(sessions, "first").outcome == Claimed.NEW
    assert _claim(sessions, "second", sha="b" * 64) == Claim(Claimed.MISMATCH, "first")
    with sessions() as db:
        release(db, tenant="acme", key="retry-1", session_id="someone-else")  # not its session: kept
        assert holder(db, tenant="acme", key="retry-1") == "first"
        release(db, tenant="acme", key="retry-1", session_id="first")
        assert holder(db, tenant="acme", key="retry-1") is None
    assert _claim(sessions, "third").outcome == Claimed.NEW
    with sessions() as db:
        db.execute(update(IdempotencyKeyRow).values(expires_at=utcnow()))
        db.commit()
    assert _claim(sessions, "fourth", sha="c" * 64) == Claim(Claimed.NEW, "fourth")  # expired: names nothing
    assert _claim(sessions, "fifth", key="other-key").outcome == Claimed.NEW  # keys are independent
