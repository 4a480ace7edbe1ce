"""Audio tickets open one live session's socket once, and nothing after they were seen somewhere else: a try on
another session uses a ticket up, and a ticket whose key was revoked opens nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from monologue import apikeys, audio_tickets, repo
from monologue.db import make_engine, make_sessionmaker, migrate


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    url = f"sqlite:///{tmp_path / 'tickets.db'}"
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _ticket(sessions: sessionmaker[Any], session_id: str = "live-1") -> tuple[str, str]:
    """(ticket, key id) for a new live session of a new key."""
    with sessions() as db:
        key_id, _ = apikeys.create_key(db, tenant="acme")
        if repo.get_session(db, session_id=session_id) is None:
            repo.create_session(
                db,
                session_id=session_id,
                tenant="acme",
                options={},
                workflow_id="w",
                audio_seconds=0,
                width=8,
                height=8,
            )
        ticket, _ = audio_tickets.issue(db, session_id=session_id, tenant="acme", key_id=key_id, ttl_s=60)
    return ticket, key_id


def test_a_ticket_opens_its_session_once(sessions: sessionmaker[Any]) -> None:
    ticket, key_id = _ticket(sessions)
    with sessions() as db:
        row = audio_tickets.redeem(db, ticket=ticket, session_id="live-1")
        assert row is not None and row.key_id == key_id
        assert audio_tickets.redeem(db, ticket=ticket, session_id="live-1") is None


def test_a_ticket_tried_on_another_session_is_used_up(sessions: sessionmaker[Any]) -> None:
    ticket, _ = _ticket(sessions)
    with sessions() as db:
        assert audio_tickets.redeem(db, ticket=ticket, session_id="live-2") is None
        assert audio_tickets.redeem(db, ticket=ticket, session_id="live-1") is None


def test_a_revoked_keys_ticket_opens_nothing(sessions: sessionmaker[Any]) -> None:
    ticket, key_id = _ticket(sessions)
    with sessions() as db:
        assert apikeys.revoke_key(db, key_id)
        assert audio_tickets.redeem(db, ticket=ticket, session_id="live-1") is None


def test_a_forged_ticket_uses_up_nothing(sessions: sessionmaker[Any]) -> None:
    """Only the holder of the whole ticket can use it up: its id with another secret changes nothing."""
    ticket, _ = _ticket(sessions)
    forged = ticket[:-4] + ("AAAA" if not ticket.endswith("AAAA") else "BBBB")
    with sessions() as db:
        assert audio_tickets.redeem(db, ticket=forged, session_id="live-1") is None
        assert audio_tickets.redeem(db, ticket=ticket, session_id="live-1") is not None
