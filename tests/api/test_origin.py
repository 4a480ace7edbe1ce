"""Who may reach the API from where (api/origin.py, `ops_access` in api/deps.py): keyless /ops on loopback is
decided from the socket's peer and a loopback Host, never from forwarded headers; unknown Host names get 400
(DNS rebinding); cross-site pages cannot change state (CSRF); links come from public_url, never from Host;
and crafted names and URLs get a 4xx, not a 500.

The first tests run the app in process on a real database (SQLite, and PostgreSQL where the database is the
point), with a fake Temporal client that records cancels. The last ones run a second real `monologue api`
process (uvicorn, as deployed) beside the stack fixture's, on the same Temporal and database."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from api.app import create_app
from api.deps import Services
from cli.stack import Stack, free_port, http_ok
from monologue import apikeys, keys
from monologue.db import SessionRow, make_engine, make_sessionmaker, migrate
from monologue.settings import ApiSettings, Settings, to_env
from monologue.storage import LocalStore
from tests.helpers import postgres_database

LOCAL = "http://127.0.0.1:8000"  # the default public_url, and so a loopback origin
OPTIONS = {
    "fps": 25,
    "chunk_frames": 40,
    "i_frames": 4,
    "seed": 0,
    "resolution": "source",
    "preview": False,
    "family": "warp",
}
STREAM = {"init.mp4": b"init", "stream.m3u8": b"#EXTM3U\n", "seg-N00000.m4s": b"segment"}
FORWARDING = [
    {"X-Forwarded-For": "127.0.0.1"},  # client-supplied, passed on by a proxy on this machine
    {"Forwarded": "for=127.0.0.1"},
    {"X-Forwarded-Host": "127.0.0.1:8000"},
    {"X-Real-IP": "127.0.0.1"},
]


@dataclass
class RecordingTemporal:
    """Stands in for the Temporal client where cancel reaches it: records the workflows asked to stop."""

    cancelled: list[str] = field(default_factory=list)

    def get_workflow_handle(self, workflow_id: str) -> Any:
        temporal = self

        class Handle:
            async def cancel(self) -> None:
                temporal.cancelled.append(workflow_id)

        return Handle()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    """A migrated SQLite database with one running live session, `live`, of tenant `acme`."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        session.add(
            SessionRow(
                id="live", status="running", created_at=datetime.now(UTC), tenant="acme", kind="live",
                options=OPTIONS, workflow_id="render-live", audio_seconds=0.0, width=64, height=64,
            )
        )  # fmt: skip
        session.commit()
    yield sessions
    engine.dispose()


@pytest.fixture
def temporal() -> RecordingTemporal:
    return RecordingTemporal()


def _app(tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal, **api: Any) -> FastAPI:
    settings = Settings(home=tmp_path, api=ApiSettings(**api))
    app = create_app(settings)
    store = LocalStore(tmp_path / "objects")
    for name, data in STREAM.items():
        store.put(keys.output("live", name), data)
    # No lifespan (so no Temporal): the routes read the database, and cancel reaches the fake.
    app.state.services = Services(settings=settings, store=store, sessions=db, temporal=temporal)  # type: ignore[arg-type]
    return app


def _key(db: sessionmaker[Any], tenant: str, *scopes: str) -> dict[str, str]:
    with db() as session:
        return {"Authorization": f"Bearer {apikeys.create_key(session, tenant=tenant, scopes=scopes)[1]}"}


def _local(app: FastAPI, peer: str = "127.0.0.1", base_url: str = LOCAL) -> TestClient:
    return TestClient(app, base_url=base_url, client=(peer, 50000), raise_server_exceptions=False)


# Keyless /ops on loopback.


def test_a_loopback_peer_on_a_loopback_host_without_proxy_headers_gets_ops_without_a_key(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    app = _app(tmp_path, db, temporal, ops_open_on_loopback=True)
    for base_url in (LOCAL, "http://localhost:8000", "http://[::1]:8000", "http://localhost"):
        assert _local(app, base_url=base_url).get("/ops/api/nodes").status_code == 200, base_url
    assert _local(app, peer="::1").get("/ops/api/nodes").status_code == 200


def test_forwarding_headers_mean_a_proxy_in_front_and_keyless_ops_is_refused(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    local = _local(_app(tmp_path, db, temporal, ops_open_on_loopback=True))
    for headers in FORWARDING:
        refused = local.get("/ops/api/nodes", headers=headers)
        assert refused.status_code == 401 and "Authorization: Bearer" in refused.json()["detail"], headers
    assert local.get("/ops/api/nodes", headers=FORWARDING[0] | _key(db, "ops-team", "ops")).status_code == 200


def test_a_loopback_peer_with_a_public_host_name_needs_a_key(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    """A name that resolves here (DNS rebinding, or a proxy passing Host on) is not this machine's browser."""
    app = _app(tmp_path, db, temporal, ops_open_on_loopback=True, allowed_hosts=["public.example.com"])
    public = _local(app, base_url="http://public.example.com")
    assert public.get("/ops/api/nodes").status_code == 401
    assert public.get("/ops/api/nodes", headers=_key(db, "ops-team", "ops")).status_code == 200  # Host allowed


def test_a_peer_on_another_machine_needs_a_key_even_on_a_loopback_host(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    app = _app(tmp_path, db, temporal, ops_open_on_loopback=True)
    assert _local(app, peer="192.0.2.7").get("/ops/api/nodes").status_code == 401


def test_keyless_ops_with_a_public_url_elsewhere_refuses_to_start(tmp_path: Path) -> None:
    """Behind a reverse proxy every client looks local: the two settings together are a mistake, named."""
    api = ApiSettings(ops_open_on_loopback=True, public_url="https://avatar.example.com")
    with pytest.raises(ValueError, match=r"MONOLOGUE_API__OPS_OPEN_ON_LOOPBACK.*MONOLOGUE_API__PUBLIC_URL"):
        create_app(Settings(home=tmp_path, api=api))


# Host names.


def test_an_unknown_host_gets_400_naming_the_setting_on_every_route(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    local = _local(_app(tmp_path, db, temporal, ops_open_on_loopback=True))
    for method, path in [
        ("GET", "/openapi.json"),
        ("GET", "/ops/api/nodes"),
        ("GET", "/v1/renders"),
        ("POST", "/v1/renders"),
    ]:
        refused = local.request(method, path, headers={"Host": "evil.example:8000"})
        assert refused.status_code == 400, (method, path)
        assert "MONOLOGUE_API__ALLOWED_HOSTS" in refused.json()["detail"]
    assert local.get("/openapi.json").status_code == 200
    # Probes and scrapes come by pod address: those GETs (and only those) answer any Host (api/origin.py).
    assert local.get("/healthz", headers={"Host": "10.0.0.7:8000"}).status_code == 200
    assert local.post("/healthz", headers={"Host": "10.0.0.7:8000"}).status_code == 400


def test_allowed_hosts_admit_exact_names_and_subdomains_of_wildcards_only(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    local = _local(_app(tmp_path, db, temporal, allowed_hosts=["alias.example", "*.corp.example"]))
    admitted = ["alias.example", "ALIAS.example:8443", "a.corp.example", "b.a.corp.example:80", "127.0.0.1", "[::1]"]
    refused = ["corp.example", "evilcorp.example", "alias.example.evil", "alias.example@evil", "[::1", "", "a b"]
    docs = "/openapi.json"  # public, and not a probe path (those skip the Host check)
    assert [local.get(docs, headers={"Host": host}).status_code for host in admitted] == [200] * len(admitted)
    assert [local.get(docs, headers={"Host": host}).status_code for host in refused] == [400] * len(refused)
    anywhere = _local(_app(tmp_path, db, temporal, allowed_hosts=["*"]))
    assert anywhere.get(docs, headers={"Host": "evil.example"}).status_code == 200


def test_an_unknown_host_or_a_cross_site_page_cannot_open_the_audio_socket(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    local = _local(_app(tmp_path, db, temporal))
    here = {"Host": "127.0.0.1:8000"}  # TestClient's sockets go to "testserver" whatever its base_url
    for headers, status in [({"Host": "evil.example:8000"}, 400), (here | {"Origin": "https://evil.example"}, 403)]:
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            local.websocket_connect("/v1/sessions/live/audio", headers=headers),
        ):
            pass
        assert refused.value.status_code == status, headers
        assert "MONOLOGUE_API__" in refused.value.json()["detail"]
    # The same handshake from this API's own page reaches the socket, which then asks for a key.
    with local.websocket_connect("/v1/sessions/live/audio", headers=here | {"Origin": LOCAL}) as websocket:
        assert "API key" in websocket.receive_json()["message"]
        with pytest.raises(WebSocketDisconnect) as closed:
            websocket.receive_json()
    assert closed.value.code == 4401


# Cross-site requests.


def test_a_cross_site_post_is_403_and_cancels_nothing(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    """With keyless ops on, a page elsewhere could make this machine's browser cancel any session."""
    local = _local(_app(tmp_path, db, temporal, ops_open_on_loopback=True, allowed_hosts=["alias.example"]))
    tenant = _key(db, "acme")
    cross_site = [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},  # a sandboxed frame
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port or subdomain of this site
        {"Origin": LOCAL, "Sec-Fetch-Site": "cross-site"},
    ]
    for headers in cross_site:
        for path, key in [("/ops/api/sessions/live/cancel", {}), ("/v1/renders/live/cancel", tenant)]:
            refused = local.post(path, headers=headers | key)
            assert refused.status_code == 403, (path, headers)
            assert "MONOLOGUE_API__PUBLIC_URL" in refused.json()["detail"]
    assert "https://evil.example" in local.post("/v1/renders/live/cancel", headers=cross_site[0]).json()["detail"]
    assert temporal.cancelled == []
    assert local.get("/ops/api/sessions/live", headers={"Origin": "https://evil.example"}).status_code == 200  # reads
    # This API's own pages, an allowed alias's page on its own host, and clients that are not browsers may.
    alias = _local(local.app, base_url="http://alias.example")  # type: ignore[arg-type]
    own_pages = [
        (local, {"Origin": LOCAL, "Sec-Fetch-Site": "same-origin"}),
        (local, {"Sec-Fetch-Site": "none"}),
        (alias, {"Origin": "http://alias.example", "Sec-Fetch-Site": "same-origin"}),
        (local, {}),
    ]
    for client, headers in own_pages:
        assert client.post("/v1/renders/live/cancel", headers=headers | tenant).status_code == 202, headers
    assert temporal.cancelled == ["render-live"] * len(own_pages)


# Links and crafted names.


def test_links_use_public_url_whatever_the_host_header_says(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    app = _app(tmp_path, db, temporal, public_url="https://avatar.example.com", allowed_hosts=["alias.example"])
    for base_url in ("http://alias.example:8080", LOCAL):
        client = _local(app, base_url=base_url)
        render = client.get("/v1/renders/live", headers=_key(db, "acme")).json()
        assert render["links"]["self"] == "https://avatar.example.com/v1/renders/live"
        assert render["links"]["stream"] == "https://avatar.example.com/v1/renders/live/stream.m3u8"
        assert render["links"]["audio"] == "wss://avatar.example.com/v1/sessions/live/audio"
        ops = client.get("/ops/api/sessions/live", headers=_key(db, "ops-team", "ops")).json()
        assert ops["links"]["cancel"] == "https://avatar.example.com/ops/api/sessions/live/cancel"


def test_a_stream_name_with_a_trailing_newline_is_404_not_500(
    tmp_path: Path, db: sessionmaker[Any], temporal: RecordingTemporal
) -> None:
    local = _local(_app(tmp_path, db, temporal))
    tenant, operator = _key(db, "acme"), _key(db, "ops-team", "ops")
    for name, data in STREAM.items():
        for prefix, key in [("/v1/renders/live/", tenant), ("/ops/api/sessions/live/stream/", operator)]:
            assert local.get(prefix + name, headers=key).content == data
            crafted = local.get(f"{prefix}{name}%0a", headers=key)
            assert crafted.status_code == 404 and "stream.m3u8, init.mp4" in crafted.json()["detail"], prefix + name


def test_a_key_or_a_tenant_with_a_trailing_newline_is_refused(db: sessionmaker[Any]) -> None:
    with pytest.raises(ValueError, match="lowercase"):
        apikeys.check_tenant("acme\n")
    key = _key(db, "acme")["Authorization"].removeprefix("Bearer ")
    with db() as session:
        assert apikeys.authenticate(session, key) is not None
        assert apikeys.authenticate(session, key + "\n") is None


def test_a_nul_in_the_url_is_a_4xx_on_every_route_on_postgresql(tmp_path: Path, temporal: RecordingTemporal) -> None:
    """PostgreSQL refuses strings holding NUL: an id or filter with one was a 500 wherever it was looked up."""
    with postgres_database() as url:
        migrate(url)
        engine = make_engine(url)
        try:
            sessions = make_sessionmaker(engine)
            app = _app(tmp_path, sessions, temporal)
            local, operator = _local(app), _key(sessions, "ops-team", "ops")  # a tenant's key too, for /v1
            requests = _nul_requests(app)
            assert len(requests) >= 30
            for method, path in requests:
                answer = local.request(method, path, headers=operator)
                assert 400 <= answer.status_code < 500, (method, path, answer.text)
            assert local.get("/ops/static/" + "a" * 5000).status_code == 404  # a name too long for the disk
        finally:
            engine.dispose()


def _nul_requests(app: FastAPI) -> list[tuple[str, str]]:
    """Every /v1 and /ops route with a NUL for each path parameter, and again with NULs in the query."""
    requests: list[tuple[str, str]] = []
    for context in iter_route_contexts(app.routes):
        if isinstance(context.route, APIRoute) and context.path and context.path.startswith(("/v1", "/ops")):
            path = re.sub(r"\{\w+(:path)?\}", "%00", context.path)
            urls = [path, f"{path}?status=%00"] if path != context.path else [f"{path}?status=%00"]
            requests += [(method, url) for method in context.methods or () for url in urls]
    return requests


# A real `monologue api` process (uvicorn as deployed), beside the stack's, with keyless ops on loopback.


@pytest.fixture(scope="module")
def open_api(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    api = ApiSettings(
        port=port, public_url=f"http://127.0.0.1:{port}", ops_open_on_loopback=True, allowed_hosts=["alias.example"]
    )
    env = os.environ | to_env(stack.settings.model_copy(update={"api": api})) | {"PYTHONUNBUFFERED": "1"}
    log_path = tmp_path_factory.mktemp("open-api") / "api.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "cli", "api"], stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 60
        while not http_ok(f"{api.public_url}/healthz"):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        yield str(api.public_url)
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.mark.slow
def test_a_real_server_takes_nothing_from_forwarded_headers(open_api: str) -> None:
    """uvicorn runs with proxy_headers off: from a loopback client (which its default trusts) it takes neither
    the peer from X-Forwarded-For nor the scheme from X-Forwarded-Proto; the scheme shows in a redirect."""
    assert httpx.get(f"{open_api}/ops/api/nodes").status_code == 200  # keyless: this machine's browser
    assert httpx.get(f"{open_api}/ops/api/nodes", headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 401
    # With proxy headers on, X-Forwarded-Proto from a loopback peer would turn the request's scheme to https.
    redirect = httpx.get(f"{open_api}/ops/api/nodes/", headers={"X-Forwarded-Proto": "https"})
    assert redirect.status_code == 307 and redirect.headers["location"] == f"{open_api}/ops/api/nodes"


@pytest.mark.slow
def test_a_real_server_refuses_unknown_hosts_on_http_and_on_the_socket(open_api: str) -> None:
    assert httpx.get(f"{open_api}/openapi.json", headers={"Host": "evil.example:8000"}).status_code == 400
    port = int(open_api.rsplit(":", 1)[1])
    assert _handshake(port, "evil.example:8000").startswith("HTTP/1.1 400")
    assert _handshake(port, f"127.0.0.1:{port}").startswith("HTTP/1.1 101")  # then it asks for a key


def _handshake(port: int, host: str) -> str:
    """The status line the server answers a WebSocket handshake for the audio socket with."""
    request = (
        f"GET /v1/sessions/x/audio HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request.encode())
        return connection.recv(4096).decode(errors="replace").splitlines()[0]


@pytest.mark.slow
def test_a_real_server_lets_no_cross_site_page_cancel_a_session(
    open_api: str, stack: Stack, sample_portrait: bytes
) -> None:
    engine = make_engine(stack.settings.db_url)
    tenant = _key(make_sessionmaker(engine), "origin-tenant")
    engine.dispose()
    created = httpx.post(
        f"{open_api}/v1/sessions",
        files={"portrait": ("p.jpg", sample_portrait)},
        headers=tenant | {"Host": "alias.example"},
    )
    assert created.status_code == 201, created.text
    live = created.json()
    assert live["links"]["self"] == f"{open_api}/v1/renders/{live['id']}"  # public_url's, not alias.example
    try:
        for path, key in [(f"/ops/api/sessions/{live['id']}/cancel", {}), (f"/v1/renders/{live['id']}/cancel", tenant)]:
            for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
                assert httpx.post(open_api + path, headers=headers | key).status_code == 403, (path, headers)
        assert httpx.get(live["links"]["self"], headers=tenant).json()["status"] in ("queued", "running")
    finally:
        own_page = {"Origin": open_api, "Sec-Fetch-Site": "same-origin"}  # keyless: this machine's browser
        assert httpx.post(f"{open_api}/ops/api/sessions/{live['id']}/cancel", headers=own_page).status_code == 202
