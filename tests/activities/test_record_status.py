"""A cancelled or failed session's stream is closed with every chunk already generated (issue 28, item 7): the
workflow may not yet have heard of a chunk the node finished as the cancel came, but the database has it, and the
closed playlist keeps it. Only chunks from the timeline's start without a gap go in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.session import SessionActivities
from monologue import contracts as c, keys, repo
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.plan import chunk_sizes, plan_chunks
from monologue.storage import LocalStore

OPTIONS = c.RenderOptions(chunk_frames=40, i_frames=4)
FRAMES = 97  # N0 0+40, I0 40+4, N1 44+40, I1 84+4, N2 88+9 in the timeline


@pytest.fixture
def parts(tmp_path: Path) -> tuple[SessionActivities, LocalStore, Any]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    sessions = make_sessionmaker(make_engine(url))
    with sessions() as db:
        repo.create_session(
            db, session_id="s", tenant="local", options={}, workflow_id="w", audio_seconds=4.0, width=64, height=64
        )
    store = LocalStore(tmp_path / "objects")
    return SessionActivities(store=store, sessions=sessions), store, sessions


def _generated(sessions: Any, *names: str) -> None:
    specs = {spec.name: spec for spec in plan_chunks(FRAMES, **chunk_sizes(OPTIONS))}
    with sessions() as db:
        for name in names:
            spec = specs[name]
            repo.record_chunk(
                db,
                session_id="s",
                kind=spec.kind,
                index=spec.index,
                first_frame=spec.first_frame,
                frames=spec.n_frames,
                node_id="n",
                attempt=1,
                stage_ms={},
                segment_key=keys.segment("s", spec.kind, spec.index),
                frames_sha256="0" * 64,
            )


def _cancel(activities: SessionActivities, published_frames: int) -> None:
    request = c.RecordStatusInput(
        session_id="s",
        status=c.SessionStatus.CANCELLED,
        options=OPTIONS,
        total_frames=FRAMES,
        published_frames=published_frames,
        error=None,
    )
    ActivityEnvironment().run(activities.record_status, request)


def _segments(store: LocalStore) -> list[str]:
    text = store.get(keys.playlist("s")).decode()
    assert text.rstrip().endswith("#EXT-X-ENDLIST")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_a_chunk_the_workflow_had_not_heard_of_is_kept(parts: tuple[SessionActivities, LocalStore, Any]) -> None:
    activities, store, sessions = parts
    _generated(sessions, "N0")  # done on the node and recorded; the workflow still counted 0 frames
    _cancel(activities, published_frames=0)
    assert _segments(store) == [keys.segment_name(c.ChunkKind.N, 0)]


def test_only_the_chunks_from_the_start_without_a_gap_go_in(parts: tuple[SessionActivities, LocalStore, Any]) -> None:
    activities, store, sessions = parts
    _generated(sessions, "N0", "N1")  # I0 (40+4) sits between them and is not made: N1 cannot go out
    _cancel(activities, published_frames=0)
    assert _segments(store) == [keys.segment_name(c.ChunkKind.N, 0)]
    _generated(sessions, "I0")
    _cancel(activities, published_frames=40)
    names = [
        keys.segment_name(kind, index) for kind, index in ((c.ChunkKind.N, 0), (c.ChunkKind.I, 0), (c.ChunkKind.N, 1))
    ]
    assert _segments(store) == names
