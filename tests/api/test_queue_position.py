"""Queue visibility and admission through the real API (uvicorn on a thread) on SQLite, with session rows seeded in
the database: a waiting session's `queue` (position, ETA, class) on GET, in lists and in the event stream, falling as
sessions ahead leave; the operator's queue counts; Retry-After on 429s; and who may ask for priority=high. Creates
reach a fake Temporal client (no server): it checks every upload as valid and starts nothing.

The seeded queue, worked out by hand: one node of one slot holds `run` (5 chunks, 3 done 2 s apart: 2 s a chunk, so
its slot frees in 4 s). Waiting, each 5 chunks (4 s of audio at 25 fps, chunks of 40 frames): acme's w1 and w2 and
beta's b1. Equal weights: w1 and b1 tag 1 (w1 came first), w2 tags 2, so w1 starts at 4 s and ends at 14, b1 starts
at 14 and ends at 24, and w2 starts at 24."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from monologue import apikeys, contracts as c
from monologue.client import auth
from monologue.db import ChunkRow, NodeStatus, SessionRow, make_engine, make_sessionmaker, migrate
from monologue.repo import nodes as repo_nodes
from monologue.settings import LimitSettings, Settings
from tests.helpers import serve_api

LIMIT = 3  # acme's three seeded sessions fill it
OPTIONS = {"fps": 25, "chunk_frames": 40, "i_frames": 4, "family": "warp", "resolution": "source"}
FILES = {"portrait": ("portrait.jpg", b"a portrait"), "audio": ("speech.wav", b"some speech")}


@dataclass
class FakeTemporal:
    """Every upload checks out (4 s of audio); workflows are recorded, not run."""

    started: list[str] = field(default_factory=list)

    async def execute_workflow(self, *_args: Any, **_kwargs: Any) -> c.ValidateInputsResult:
        return c.ValidateInputsResult(width=256, height=256, audio_samples=4 * 16_000)

    async def start_workflow(self, *_args: Any, id: str, **_kwargs: Any) -> None:  # `id`: Temporal's name
        self.started.append(id)


@dataclass
class Api:
    url: str
    app: FastAPI
    db: sessionmaker[Any]
    temporal: FakeTemporal

    def key(self, tenant: str, *scopes: str) -> dict[str, str]:
        with self.db() as db:
            return auth(apikeys.create_key(db, tenant=tenant, scopes=scopes)[1])

    def get(self, path: str, headers: dict[str, str]) -> dict[str, Any]:
        response = httpx.get(f"{self.url}{path}", headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    def end(self, session_id: str, status: str = "completed") -> None:
        with self.db() as db:
            db.execute(update(SessionRow).where(SessionRow.id == session_id).values(status=status))
            db.commit()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    db = make_sessionmaker(engine)
    with db() as session:
        _seed(session)
    settings = Settings(
        home=tmp_path, database_url=url, limits=LimitSettings(max_sessions_per_tenant=LIMIT, max_streams_per_key=1)
    )
    with serve_api(settings, api={"events_poll_s": 0.05}) as (base, app):
        temporal = FakeTemporal()
        app.state.services.temporal = temporal
        yield Api(base, app, db, temporal)
    engine.dispose()


def _session(sid: str, tenant: str, status: str, age_s: float, **fields: Any) -> SessionRow:
    created = datetime.now(UTC) - timedelta(seconds=age_s)
    values: dict[str, Any] = {
        "kind": "render",
        "options": OPTIONS,
        "audio_seconds": 4.0,
        "workflow_id": f"render-{sid}",
    }
    return SessionRow(id=sid, tenant=tenant, status=status, created_at=created, **(values | fields))


def _seed(db: Session) -> None:
    now = datetime.now(UTC)
    db.add_all(
        [
            _session("run", "acme", "running", 120, node_id="node-a", chunks_total=5, frames=100),
            _session("w1", "acme", "queued", 60),
            _session("w2", "acme", "running", 50, chunks_total=5, frames=100),  # prepared, no node yet
            _session("b1", "beta", "queued", 40),
        ]
    )
    db.flush()
    for index, age_s in enumerate((10, 8, 6)):
        done_at = now - timedelta(seconds=age_s)
        db.add(
            ChunkRow(
                session_id="run", kind="N", index=index, first_frame=44 * index, frames=40, status="done",
                attempt=1, node_id="node-a", stage_ms={"audio_to_video": 900.0}, updated_at=done_at,
            )
        )  # fmt: skip
    db.commit()
    repo_nodes.report_node(
        db, node_id="node-a", capacity=1, status=NodeStatus.UP, sessions=["run"], chunks_done=3, memory_mb=None,
        started_at=now,
    )  # fmt: skip


def _queue(api: Api, session_id: str, headers: dict[str, str]) -> Any:
    return api.get(f"/v1/renders/{session_id}", headers)["queue"]


def test_a_waiting_render_shows_its_place_and_eta_and_moves_up_when_one_ahead_ends(api: Api) -> None:
    acme = api.key("acme")
    assert _queue(api, "w1", acme) == {"position": 0, "eta_s": 4.0, "class": "normal"}
    assert _queue(api, "w2", acme) == {"position": 2, "eta_s": 24.0, "class": "normal"}
    assert _queue(api, "run", acme) is None  # a node holds it
    listed = {item["id"]: item["queue"] for item in api.get("/v1/renders", acme)["items"]}
    assert listed == {"run": None, "w1": _queue(api, "w1", acme), "w2": _queue(api, "w2", acme)}
    api.end("w1")  # w2 is now acme's first: it tags 1 and came before b1, so it is next
    assert _queue(api, "w2", acme) == {"position": 0, "eta_s": 4.0, "class": "normal"}
    assert _queue(api, "w1", acme) is None


def test_a_waiting_live_session_goes_before_every_render(api: Api) -> None:
    """It takes the slot at 4 s and holds it for as long as its speaker talks: the renders' ETAs are unknown."""
    with api.db() as db:
        db.add(_session("talk", "beta", "queued", 1, kind="live", audio_seconds=None))
        db.commit()
    beta = api.key("beta")
    assert api.get("/v1/sessions/talk", beta)["queue"] == {"position": 0, "eta_s": 4.0, "class": "live"}
    assert _queue(api, "b1", beta) == {"position": 2, "eta_s": None, "class": "normal"}


def test_the_event_stream_reports_the_queue_and_its_changes(api: Api) -> None:
    with httpx.stream("GET", f"{api.url}/v1/renders/w2/events", headers=api.key("acme"), timeout=30) as stream:
        events = _progress_events(stream.iter_lines())
        assert next(events)["queue"] == {"position": 2, "eta_s": 24.0, "class": "normal"}
        api.end("b1", "cancelled")
        assert next(events)["queue"] == {"position": 1, "eta_s": 14.0, "class": "normal"}


def _progress_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    kind = None
    for line in lines:
        if line.startswith("event:"):
            kind = line.removeprefix("event:").strip()
        elif line.startswith("data:") and kind == "progress":
            yield json.loads(line.removeprefix("data:"))


def test_the_ops_queue_counts_waiting_sessions_by_class_and_tenant(api: Api) -> None:
    with api.db() as db:
        db.add(_session("talk", "beta", "queued", 1, kind="live", audio_seconds=None))
        db.add(_session("rush", "vip", "queued", 1, options=OPTIONS | {"priority": "high"}))
        db.commit()
    queue = api.get("/ops/api/queue", api.key("ops-team", "ops"))
    assert queue["waiting"] == [
        {"class": "live", "tenant": "beta", "sessions": 1},
        {"class": "high", "tenant": "vip", "sessions": 1},
        {"class": "normal", "tenant": "acme", "sessions": 2},
        {"class": "normal", "tenant": "beta", "sessions": 1},
    ]
    assert queue["running"] == [{"class": "normal", "sessions": 1}]
    assert queue["slots"] == 1 and queue["seconds_per_chunk"] == pytest.approx(2.0)
    enums = httpx.get(f"{api.url}/ops/static/enums.js", timeout=30).text
    assert 'QUEUE_CLASSES = ["live", "moving", "yielded", "high", "normal", "low"]' in enums


def test_a_tenant_at_its_limit_is_told_when_its_first_session_likely_ends(api: Api) -> None:
    refused = httpx.post(f"{api.url}/v1/renders", files=FILES, headers=api.key("acme"), timeout=30)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "4"  # `run` has 2 chunks left at 2 s a chunk


def test_without_an_end_to_estimate_retry_after_is_the_default(api: Api) -> None:
    """Live sessions end when their speakers stop: nothing to estimate."""
    with api.db() as db:
        db.add_all([_session(f"talk{n}", "chatty", "queued", 1, kind="live") for n in range(LIMIT)])
        db.commit()
    refused = httpx.post(f"{api.url}/v1/renders", files=FILES, headers=api.key("chatty"), timeout=30)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"


def test_a_key_past_its_stream_limit_is_told_to_retry(api: Api) -> None:
    acme = api.key("acme")
    with httpx.stream("GET", f"{api.url}/v1/renders/w2/events", headers=acme, timeout=30) as held:
        assert held.status_code == 200
        refused = httpx.get(f"{api.url}/v1/renders/w1/events", headers=acme, timeout=30)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "10"


def _sessions_of(api: Api, tenant: str) -> int:
    with api.db() as db:
        return int(db.scalar(select(func.count()).where(SessionRow.tenant == tenant)) or 0)


def test_high_priority_needs_the_priority_scope_and_is_refused_before_anything_is_written(api: Api) -> None:
    refused = httpx.post(
        f"{api.url}/v1/renders", files=FILES, data={"priority": "high"}, headers=api.key("rush"), timeout=30
    )
    assert refused.status_code == 403, refused.text
    assert "'priority' scope" in refused.json()["detail"]
    assert _sessions_of(api, "rush") == 0 and api.temporal.started == []


@pytest.mark.parametrize(
    ("scopes", "priority"), [(("priority",), "high"), (("ops",), "high"), ((), "low"), ((), "normal")]
)
def test_a_priority_the_key_may_ask_for_starts_the_render_in_its_class(
    api: Api, scopes: tuple[str, ...], priority: str
) -> None:
    headers = api.key("rush", *scopes)
    created = httpx.post(f"{api.url}/v1/renders", files=FILES, data={"priority": priority}, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    session = created.json()
    assert session["options"]["priority"] == priority and api.temporal.started == [f"render-{session['id']}"]
    assert session["queue"]["class"] == priority
    if priority == "high":  # ahead of the three normal renders waiting: next, once `run` frees the slot
        assert session["queue"] == {"position": 0, "eta_s": 4.0, "class": "high"}
