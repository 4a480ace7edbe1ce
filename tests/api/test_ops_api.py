"""The ops UI's JSON and pages, on a real SQLite database and no Temporal: fast, no stack."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker

from api.app import create_app
from api.deps import Services, ops_access
from api.routes import ops
from api.routes.ops import STATIC
from monologue import repo_nodes
from monologue.db import CheckpointRow, ChunkRow, SessionRow, make_engine, make_sessionmaker, migrate
from monologue.settings import Settings, TemporalSettings
from monologue.storage import LocalStore

NOW = datetime.now(UTC)
OPTIONS = {"fps": 25, "chunk_frames": 40, "i_frames": 4, "seed": 0, "resolution": "source", "preview": False}


@pytest.fixture
def db_sessions(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def client(tmp_path: Path, db_sessions: sessionmaker[Any]) -> TestClient:
    settings = Settings(home=tmp_path, temporal=TemporalSettings(ui_url="http://temporal.example:8233", namespace="ns"))
    app = create_app(settings)
    # No lifespan (so no Temporal): the ops routes only read the database.
    app.state.services = Services(
        settings=settings,
        store=LocalStore(tmp_path / "objects"),
        sessions=db_sessions,
        temporal=None,  # type: ignore[arg-type]
    )
    return TestClient(app)


def _session(sid: str, *, status: str, created: datetime, **fields: Any) -> SessionRow:
    values: dict[str, Any] = {
        "tenant": "local",
        "kind": "render",
        "options": OPTIONS,
        "workflow_id": f"render-{sid}",
        "audio_seconds": 4.0,
        "width": 256,
        "height": 256,
    } | fields
    return SessionRow(id=sid, status=status, created_at=created, **values)


def _chunk(
    sid: str, kind: str, index: int, first: int, frames: int, node: str, at: datetime, attempt: int = 1
) -> ChunkRow:
    return ChunkRow(
        session_id=sid,
        kind=kind,
        index=index,
        first_frame=first,
        frames=frames,
        status="done",
        attempt=attempt,
        node_id=node,
        stage_ms={"context": 1.5, "audio_to_video": 10.0},
        updated_at=at,
    )


@pytest.fixture
def seeded(db_sessions: sessionmaker[Any]) -> None:
    """`run`: 100 frames (N0 I0 N1 I1 N2), N0 N1 I0 made (I0 retried, N1 on another node); three ended ones."""
    with db_sessions() as db:
        started = NOW - timedelta(seconds=10)
        five_minutes_ago = NOW - timedelta(minutes=5)
        sessions = [
            _session("run", status="running", created=NOW - timedelta(seconds=12), started_at=started,
                     node_id="node-b", frames=100, chunks_total=5, ttff_ms=850.0),
            _session("done", status="completed", created=five_minutes_ago, tenant="acme", node_id="node-a",
                     started_at=five_minutes_ago, finished_at=five_minutes_ago + timedelta(seconds=2),
                     frames=50, chunks_total=1),
            _session("bad", status="failed", created=NOW - timedelta(minutes=6), error="audio.wav is missing"),
            _session("talk", status="running", created=NOW - timedelta(minutes=7), kind="live"),
        ]  # fmt: skip
        db.add_all(sessions)
        db.flush()
        db.add(_chunk("run", "N", 0, 0, 40, "node-a", started + timedelta(seconds=1)))
        db.add(_chunk("run", "N", 1, 44, 40, "node-b", started + timedelta(seconds=2)))
        db.add(_chunk("run", "I", 0, 40, 4, "node-b", started + timedelta(seconds=3), attempt=2))
        db.add(_chunk("done", "N", 0, 0, 50, "node-a", NOW - timedelta(minutes=5)))
        for index in (0, 1):
            db.add(CheckpointRow(session_id="run", index=index, key=f"ckpt/{index}", sha256="f" * 64, created_at=NOW))
        db.commit()
        repo_nodes.report_node(
            db,
            node_id="node-b",
            capacity=2,
            status="up",
            sessions=["run"],
            chunks_done=12,
            memory_mb=321.5,
            started_at=NOW - timedelta(minutes=4),
        )


def test_sessions_list_newest_first_with_progress_realtime_factor_and_age(client: TestClient, seeded: None) -> None:
    page = client.get("/ops/api/sessions").json()
    assert [item["id"] for item in page["items"]] == ["run", "done", "bad", "talk"]
    assert page["total"] == 4
    run, done = page["items"][0], page["items"][1]
    assert run["progress"] == {"chunks_done": 3, "chunks_total": 5, "frames_done": 84, "frames_total": 100}
    # 84 frames at 25 fps (3.36 s of video) in the ~10 s since the render started.
    assert run["realtime_factor"] == pytest.approx(0.336, rel=0.05)
    assert run["age_s"] == pytest.approx(12, abs=2) and run["ttff_ms"] == 850.0 and run["node_id"] == "node-b"
    assert done["realtime_factor"] == pytest.approx(1.0)  # 2 s of video made in 2 s; ended, so it stays put
    assert page["items"][2]["error"] == "audio.wav is missing" and page["items"][2]["realtime_factor"] is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": "running"}, ["run", "talk"]),
        ({"tenant": "acme"}, ["done"]),
        ({"node": "node-a"}, ["done"]),
        ({"kind": "live"}, ["talk"]),
        ({"status": "running", "kind": "render"}, ["run"]),
        ({"status": ""}, ["run", "done", "bad", "talk"]),  # an empty filter field (the form's "any") matches all
        ({"limit": 2, "offset": 1}, ["done", "bad"]),
    ],
)
def test_sessions_filter_and_page(client: TestClient, seeded: None, query: dict[str, Any], expected: list[str]) -> None:
    page = client.get("/ops/api/sessions", params=query).json()
    assert [item["id"] for item in page["items"]] == expected
    if "limit" in query:
        assert (page["total"], page["limit"], page["offset"]) == (4, 2, 1)


def test_session_detail_lists_every_chunk_in_timeline_order_with_retries_nodes_and_checkpoints(
    client: TestClient, seeded: None
) -> None:
    detail = client.get("/ops/api/sessions/run").json()
    chunks = detail["chunks"]
    assert [f"{c['kind']}{c['index']}" for c in chunks] == ["N0", "I0", "N1", "I1", "N2"]
    assert [c["first_frame"] for c in chunks] == [0, 40, 44, 84, 88]
    # Made: N0, N1, I0. Generation order is N0 N1 I0 N2 I1, so N2 is the one running now.
    assert [c["status"] for c in chunks] == ["done", "done", "done", "pending", "running"]
    assert [c["attempt"] for c in chunks] == [1, 2, 1, 0, 0]
    assert [c["moved"] for c in chunks] == [False, False, True, False, False]  # N1 went to node-b after N0 on node-a
    assert chunks[0]["stage_ms"] == {"context": 1.5, "audio_to_video": 10.0} and chunks[0]["node_id"] == "node-a"
    assert chunks[3]["stage_ms"] == {} and chunks[3]["updated_at"] is None
    assert [ckpt["index"] for ckpt in detail["checkpoints"]] == [0, 1]
    links = detail["links"]
    assert links["temporal"] == "http://temporal.example:8233/namespaces/ns/workflows/render-run"
    assert links["stream"].endswith("/v1/renders/run/stream.m3u8") and links["cancel"].endswith(
        "/v1/renders/run/cancel"
    )
    assert detail["session"]["progress"]["chunks_done"] == 3 and detail["options"]["fps"] == 25


def test_a_session_without_a_frame_count_shows_only_its_rows(client: TestClient, seeded: None) -> None:
    detail = client.get("/ops/api/sessions/talk").json()
    assert detail["chunks"] == [] and detail["session"]["kind"] == "live"


def test_an_unknown_session_is_404(client: TestClient, seeded: None) -> None:
    response = client.get("/ops/api/sessions/nope")
    assert response.status_code == 404 and "nope" in response.json()["detail"]


def test_nodes_report_heartbeat_age_rate_and_memory(client: TestClient, seeded: None) -> None:
    (node,) = client.get("/ops/api/nodes").json()["items"]
    assert (node["id"], node["status"], node["sessions"], node["capacity"]) == ("node-b", "up", ["run"], 2)
    assert 0 <= node["heartbeat_age_s"] < 5
    assert node["chunks_per_minute"] == pytest.approx(3.0, rel=0.05)  # 12 chunks in 4 minutes
    assert node["memory_mb"] == 321.5


@pytest.mark.parametrize("path", ["/ops", "/ops/sessions/run", "/ops/nodes"])
def test_pages_are_html_loading_their_module(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    for asset in re.findall(r'(?:src|href)="(/ops/static/[^"]+)"', response.text):
        assert client.get(asset).status_code == 200, asset


def test_static_files_outside_the_folder_are_404(client: TestClient) -> None:
    assert client.get("/ops/static/common.js").headers["content-type"].startswith("text/javascript")
    for path in ("/ops/static/%2e%2e/schemas.py", "/ops/static/vendor", "/ops/static/x.js"):
        assert client.get(path).status_code == 404, path
    for escape in ("../schemas.py", "../../app.py", "/etc/passwd"):  # what HTTP clients would normalise away
        with pytest.raises(HTTPException) as refused:
            ops.static_file(escape, None)
        assert refused.value.status_code == 404


def test_every_ops_route_goes_through_the_access_hook(client: TestClient) -> None:
    def refuse() -> None:
        raise HTTPException(403, "no")

    app: Any = client.app
    app.dependency_overrides[ops_access] = refuse
    paths = [route.path for route in ops.router.routes]  # type: ignore[attr-defined]
    assert len(paths) >= 7
    for path in paths:
        url = path.replace("{session_id}", "run").replace("{path:path}", "ops.css")
        assert client.get(url).status_code == 403, path


def test_the_vendored_hls_js_is_the_published_file() -> None:
    recorded = re.search(r"SHA-256 of `hls.min.js`[^`]*`([0-9a-f]{64})`", (STATIC / "vendor" / "README.md").read_text())
    assert recorded is not None
    assert hashlib.sha256((STATIC / "vendor" / "hls.min.js").read_bytes()).hexdigest() == recorded.group(1)
