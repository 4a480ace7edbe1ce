"""The ops UI's JSON and pages, on a real SQLite database and no Temporal (a fake client where a route
reaches it): fast, no stack. Requests carry a real API key with the `ops` scope, of a tenant that owns
none of the sessions: operators see every tenant."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker
from temporalio.service import RPCError, RPCStatusCode

from api.app import create_app
from api.deps import Services, ops_access
from api.routes import ops
from api.routes.ops import STATIC
from monologue import apikeys, contracts as c, keys
from monologue.db import CheckpointRow, ChunkRow, SessionRow
from monologue.repo import nodes as repo_nodes
from monologue.settings import ApiSettings, Settings, TemporalSettings
from monologue.storage import LocalStore

OPTIONS = {
    "fps": 25,
    "chunk_frames": 40,
    "i_frames": 4,
    "seed": 0,
    "resolution": "source",
    "preview": False,
    "family": "warp",
}


@dataclass
class FakeTemporal:
    """Stands in for the Temporal client where cancel reaches it: records the workflows it was asked to
    cancel, or fails like a workflow that has just closed."""

    cancelled: list[str] = field(default_factory=list)
    closed: bool = False

    def get_workflow_handle(self, workflow_id: str) -> FakeTemporal.Handle:
        return FakeTemporal.Handle(self, workflow_id)

    @dataclass
    class Handle:
        temporal: FakeTemporal
        workflow_id: str

        async def cancel(self) -> None:
            if self.temporal.closed:
                raise RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")
            self.temporal.cancelled.append(self.workflow_id)


def _app(tmp_path: Path, db_sessions: sessionmaker[Any], temporal: FakeTemporal, **api: Any) -> FastAPI:
    settings = Settings(
        home=tmp_path,
        temporal=TemporalSettings(ui_url="http://temporal.example:8233", namespace="ns"),
        api=ApiSettings(**{"allowed_hosts": ["testserver"]} | api),  # TestClient's Host (links use public_url)
    )
    app = create_app(settings)
    # No lifespan (so no Temporal): the ops routes read the database, and cancel reaches the fake.
    app.state.services = Services(
        settings=settings,
        store=LocalStore(tmp_path / "objects"),
        sessions=db_sessions,
        temporal=temporal,  # type: ignore[arg-type]
    )
    return app


def _key(db_sessions: sessionmaker[Any], tenant: str, *scopes: str) -> dict[str, str]:
    with db_sessions() as db:
        _, key = apikeys.create_key(db, tenant=tenant, scopes=scopes)
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def temporal() -> FakeTemporal:
    return FakeTemporal()


@pytest.fixture
def app(tmp_path: Path, db_sessions: sessionmaker[Any], temporal: FakeTemporal) -> FastAPI:
    return _app(tmp_path, db_sessions, temporal)


@pytest.fixture
def client(app: FastAPI, db_sessions: sessionmaker[Any]) -> TestClient:
    """An operator: a key with the `ops` scope, of a tenant without sessions."""
    return TestClient(app, headers=_key(db_sessions, "ops-team", "ops"))


@pytest.fixture
def store(app: FastAPI) -> LocalStore:
    store: LocalStore = app.state.services.store
    return store


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
    """`run`: 100 frames (N0 I0 N1 I1 N2), N0 N1 I0 made (I0 retried, N1 on another node); three ended ones.
    Times are relative to now, taken here (not at import: the figures compare against the clock)."""
    NOW = datetime.now(UTC)
    with db_sessions() as db:
        started = NOW - timedelta(seconds=10)
        five_minutes_ago = NOW - timedelta(minutes=5)
        sessions = [
            _session("run", status="running", created=NOW - timedelta(seconds=12), started_at=started,
                     node_id="node-b", frames=100, chunks_total=5, ttff_ms=850.0),
            _session("done", status="completed", created=five_minutes_ago, tenant="acme", node_id="node-a",
                     started_at=five_minutes_ago, finished_at=five_minutes_ago + timedelta(seconds=2),
                     frames=50, chunks_total=1, video_key=keys.final_video("done")),
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


def test_sessions_list_newest_first_with_progress_realtime_ratio_and_age(client: TestClient, seeded: None) -> None:
    page = client.get("/ops/api/sessions").json()
    assert [item["id"] for item in page["items"]] == ["run", "done", "bad", "talk"]
    assert page["total"] == 4
    run, done = page["items"][0], page["items"][1]
    assert run["progress"] == {
        "chunks_done": 3,
        "chunks_total": 5,
        "frames_done": 84,
        "frames_total": 100,
        "preemptions": 0,
    }
    # 84 frames at 25 fps (3.36 s of video) in the time since the render started, 2 s after its creation: both
    # figures read one clock at the request, however long the seeding took on a loaded machine.
    assert run["age_s"] >= 12 and run["ttff_ms"] == 850.0 and run["node_id"] == "node-b"
    assert run["realtime_ratio"] == pytest.approx(3.36 / (run["age_s"] - 2), rel=1e-3)
    assert done["realtime_ratio"] == pytest.approx(1.0)  # 2 s of video made in 2 s; ended, so it stays put
    assert page["items"][2]["error"] == "audio.wav is missing" and page["items"][2]["realtime_ratio"] is None


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
    # Everything else the page calls is under /ops/api, so the operator's access covers it.
    own = "http://127.0.0.1:8000/ops/api/sessions/run"  # public_url's, not the Host header's (testserver)
    assert {name: url for name, url in links.items() if name != "temporal"} == {
        "stream": f"{own}/stream/stream.m3u8",
        "captioned_stream": None,  # no captions: no multivariant playlist
        "events": f"{own}/events",
        "video": f"{own}/video.mp4",
        "cancel": f"{own}/cancel",
        "resume": f"{own}/resume",
        "webhooks": f"{own}/webhooks",
        "player": None,  # a render: no WebRTC player (a live session with delivery=webrtc has its signed page)
    }
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


@pytest.mark.parametrize(
    ("path", "assets"),
    [
        ("/ops", ["ops.css", "sessions.js"]),
        ("/ops/sessions/run", ["ops.css", "vendor/hls.min.js", "session.js"]),
        ("/ops/nodes", ["ops.css", "nodes.js"]),
    ],
)
def test_pages_are_html_loading_their_module_even_without_a_key(app: FastAPI, path: str, assets: list[str]) -> None:
    """A browser sends no key when it navigates: the page loads, then asks for one (it holds no data itself)."""
    anonymous = TestClient(app)
    response = anonymous.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert 'id="sign-out"' in response.text
    linked = re.findall(r'(?:src|href)="/ops/static/([^"]+)"', response.text)
    assert linked == assets  # the page's own assets, so the loop below cannot pass by running zero times
    for asset in linked:
        served = anonymous.get(f"/ops/static/{asset}")
        assert served.status_code == 200 and served.content, asset


def test_static_files_outside_the_folder_are_404(client: TestClient) -> None:
    assert client.get("/ops/static/common.js").headers["content-type"].startswith("text/javascript")
    for path in ("/ops/static/%2e%2e/schemas.py", "/ops/static/vendor", "/ops/static/x.js"):
        assert client.get(path).status_code == 404, path
    for escape in ("../schemas.py", "../../app.py", "/etc/passwd"):  # what HTTP clients would normalise away
        with pytest.raises(HTTPException) as refused:
            ops.static_file(escape)
        assert refused.value.status_code == 404


def test_every_ops_api_route_goes_through_the_access_hook(client: TestClient, seeded: None) -> None:
    def refuse() -> None:
        raise HTTPException(403, "no")

    app: Any = client.app
    app.dependency_overrides[ops_access] = refuse
    routes = [(route.path, method) for route in ops.router.routes for method in route.methods]  # type: ignore[attr-defined]
    api = [(path, method) for path, method in routes if path.startswith("/ops/api/")]
    # The JSON routes (their schema, sessions, one session, cancel, resume, events, video, stream, webhooks, nodes,
    # queue) and the others: three pages, the enums module, static files.
    assert len(api) == 11 and len(routes) == len(api) + 5
    for path, method in api:
        url = path.replace("{session_id}", "run").replace("{name}", "stream.m3u8")
        assert client.request(method, url).status_code == 403, (method, path)


def test_ops_api_needs_a_key_with_the_ops_scope(app: FastAPI, db_sessions: sessionmaker[Any], seeded: None) -> None:
    anonymous = TestClient(app)
    refused = anonymous.get("/ops/api/sessions")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in refused.json()["detail"]
    wrong = anonymous.get("/ops/api/sessions", headers={"Authorization": "Bearer mk_00000000_" + "x" * 32})
    assert wrong.status_code == 401 and "not valid" in wrong.json()["detail"]
    tenant = anonymous.get("/ops/api/sessions", headers=_key(db_sessions, "acme"))
    assert tenant.status_code == 403 and "'ops' scope" in tenant.json()["detail"]
    operator = anonymous.get("/ops/api/sessions", headers=_key(db_sessions, "acme", "ops"))
    assert operator.status_code == 200 and operator.json()["total"] == 4  # every tenant's, not only acme's


def test_open_on_loopback_admits_a_local_browser_without_a_key(
    tmp_path: Path, db_sessions: sessionmaker[Any], temporal: FakeTemporal, seeded: None
) -> None:
    """MONOLOGUE_API__OPS_OPEN_ON_LOOPBACK: no key needed from this machine, and only from it; a key that is
    sent is still checked."""
    open_app = _app(tmp_path, db_sessions, temporal, ops_open_on_loopback=True)
    local = TestClient(open_app, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 123))
    assert local.get("/ops/api/sessions").status_code == 200
    ipv6 = TestClient(open_app, base_url="http://[::1]:8000", client=("::1", 123))
    assert ipv6.get("/ops/api/nodes").status_code == 200
    assert local.get("/ops/api/sessions", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert TestClient(open_app, client=("192.0.2.7", 123)).get("/ops/api/sessions").status_code == 401
    closed = TestClient(_app(tmp_path, db_sessions, temporal), base_url=local.base_url, client=("127.0.0.1", 123))
    assert closed.get("/ops/api/sessions").status_code == 401  # the setting is off by default


def test_cancel_asks_temporal_to_cancel_any_tenants_running_session(
    client: TestClient, temporal: FakeTemporal, seeded: None
) -> None:
    response = client.post("/ops/api/sessions/run/cancel")
    assert response.status_code == 202 and response.json()["id"] == "run"
    assert response.json()["progress"]["chunks_done"] == 3
    assert temporal.cancelled == ["render-run"]


@pytest.mark.parametrize(
    ("action", "session_id", "status", "message"),
    [
        ("cancel", "nope", 404, "session 'nope' not found"),
        ("resume", "nope", 404, "session 'nope' not found"),
        ("cancel", "done", 409, "render done is already completed; there is nothing to cancel"),
        ("cancel", "bad", 409, "render bad is already failed; there is nothing to cancel"),
        ("resume", "run", 409, "render run is running; only failed or cancelled renders resume"),
        ("resume", "done", 409, "render done is completed; only failed or cancelled renders resume"),
    ],
)
def test_cancel_and_resume_refuse_unknown_and_wrong_status_sessions(
    client: TestClient, temporal: FakeTemporal, seeded: None, action: str, session_id: str, status: int, message: str
) -> None:
    """The same checks and messages as /v1/renders/{id}/cancel and /resume (the same code)."""
    response = client.post(f"/ops/api/sessions/{session_id}/{action}")
    assert (response.status_code, response.json()["detail"]) == (status, message)
    assert temporal.cancelled == []


def test_cancel_of_a_session_that_just_ended_is_409(client: TestClient, temporal: FakeTemporal, seeded: None) -> None:
    temporal.closed = True
    response = client.post("/ops/api/sessions/run/cancel")
    assert response.status_code == 409
    assert response.json()["detail"] == "render run could not be cancelled: workflow execution already completed"


def test_events_stream_progress_until_the_session_ends(client: TestClient, seeded: None) -> None:
    """An ended session: one `progress` event with its id, then the stream closes (a running one would go on); asked
    again with that id as Last-Event-ID, a 204: nothing new, stop reconnecting."""
    with client.stream("GET", "/ops/api/sessions/done/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        body = response.read().decode()
    opening, event = body.strip().split("\n\n")
    assert opening.startswith(": ") and "retry: " in opening  # a comment and the reconnection delay
    kind, data, event_id = event.split("\n")
    assert kind == "event: progress" and event_id.startswith("id: ")
    render = json.loads(data.removeprefix("data: "))
    assert (render["id"], render["status"], render["progress"]["chunks_done"]) == ("done", "completed", 1)
    again = client.get("/ops/api/sessions/done/events", headers={"Last-Event-ID": event_id.removeprefix("id: ")})
    assert again.status_code == 204
    assert client.get("/ops/api/sessions/nope/events").status_code == 404


def test_stream_files_are_served_with_their_media_types_and_caching(
    client: TestClient, store: LocalStore, seeded: None
) -> None:
    store.put(keys.output("run", "stream.m3u8"), b"#EXTM3U\n", content_type="application/vnd.apple.mpegurl")
    store.put(keys.output("run", "seg-N00000.m4s"), b"segment", content_type="video/iso.segment")
    playlist = client.get("/ops/api/sessions/run/stream/stream.m3u8")
    assert (playlist.status_code, playlist.content) == (200, b"#EXTM3U\n")
    assert playlist.headers["content-type"] == "application/vnd.apple.mpegurl"
    assert playlist.headers["cache-control"] == "no-cache"  # it grows while the session runs
    segment = client.get("/ops/api/sessions/run/stream/seg-N00000.m4s")
    assert (segment.status_code, segment.headers["content-type"]) == (200, "video/iso.segment")
    assert segment.headers["cache-control"] == "public, max-age=31536000, immutable"
    not_yet = client.get("/ops/api/sessions/run/stream/init.mp4")
    assert not_yet.status_code == 404 and "not published yet" in not_yet.json()["detail"]
    for name in ("audio.wav", "video.mp4", "seg-N0.m4s", "..%2Fin%2Faudio.wav"):  # only the stream's own files
        assert client.get(f"/ops/api/sessions/run/stream/{name}").status_code == 404, name
    assert client.get("/ops/api/sessions/nope/stream/stream.m3u8").status_code == 404


def test_the_video_is_served_once_completed(client: TestClient, store: LocalStore, seeded: None) -> None:
    store.put(keys.final_video("done"), b"mp4 bytes", content_type="video/mp4")
    video = client.get("/ops/api/sessions/done/video.mp4")
    assert (video.status_code, video.content, video.headers["content-type"]) == (200, b"mp4 bytes", "video/mp4")
    running = client.get("/ops/api/sessions/run/video.mp4")
    assert running.status_code == 409 and "is running (3/5 chunks)" in running.json()["detail"]


def test_the_vendored_hls_js_is_the_published_file() -> None:
    recorded = re.search(r"SHA-256 of `hls.min.js`[^`]*`([0-9a-f]{64})`", (STATIC / "vendor" / "README.md").read_text())
    assert recorded is not None
    assert hashlib.sha256((STATIC / "vendor" / "hls.min.js").read_bytes()).hexdigest() == recorded.group(1)


def test_the_pages_enums_are_generated_from_the_python_enums(client: TestClient) -> None:
    """The ops pages list statuses and kinds from enums.js, which the API writes from `contracts`."""
    module = client.get("/ops/static/enums.js")
    assert module.status_code == 200 and module.headers["content-type"].startswith("text/javascript")
    lines = dict(line.removeprefix("export const ").rstrip(";").split(" = ") for line in module.text.splitlines()[1:])
    assert json.loads(lines["STATUSES"]) == [status.value for status in c.SessionStatus]
    assert set(json.loads(lines["TERMINAL"])) == {status.value for status in c.TERMINAL}
    assert json.loads(lines["KINDS"]) == [kind.value for kind in c.SessionKind]
