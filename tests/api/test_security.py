"""API keys and tenants on the real embedded stack: every /v1 route needs a key; a tenant sees only its own
sessions, and another tenant's ids get exactly what unknown ids get (404, same message), so they leak
nothing; tenant keys stay out of /ops; the per-tenant session limit refuses with 429 and stores nothing;
and `monologue keys` stores only a key's hash."""

from __future__ import annotations

import hashlib
import importlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute, RouteContext, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from api.app import create_app
from api.deps import require_key
from api.submit import TERMINAL
from cli.main import main
from cli.stack import Stack
from monologue import apikeys, repo
from monologue.client import auth
from monologue.db import ApiKeyRow, make_engine, make_sessionmaker
from monologue.media import AUDIO_RATE
from monologue.settings import Settings, get_settings
from tests.api.route_table import KEYLESS_ROUTES, OTHER_ROUTES, SESSION_ROUTES
from tests.helpers import api_key, poll, skip_ready, wav_bytes, workflow_count

pytestmark = pytest.mark.slow
UNKNOWN = "0123456789abcdef0123456789abcdef"  # a well-formed session id nobody has
HOW_TO_GET_A_KEY = "monologue keys create"


@pytest.fixture(scope="module")
def db(stack: Stack) -> Iterator[sessionmaker[Any]]:
    """The stack's own database (migrated by the stack)."""
    engine = make_engine(stack.settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def keys(db: sessionmaker[Any]) -> dict[str, str]:
    with db() as session:
        return {tenant: apikeys.create_key(session, tenant=tenant)[1] for tenant in ("tenant-a", "tenant-b")}


@pytest.fixture(scope="module")
def a_render(api_url: str, keys: dict[str, str], sample_portrait: bytes) -> dict[str, Any]:
    """Tenant A's render of one second of silence (one chunk), completed."""
    files = {"portrait": ("portrait.jpg", sample_portrait), "audio": ("silence.wav", wav_bytes(np.zeros(AUDIO_RATE)))}
    created = _call(api_url, "POST", "/v1/renders", keys["tenant-a"], files=files)
    assert created.status_code == 201, created.text
    render = poll(
        api_url, created.json()["id"], lambda s: s["status"] in TERMINAL, timeout_s=240, api_key=keys["tenant-a"]
    )
    assert render["status"] == "completed", render["error"]
    return render


def _call(api_url: str, method: str, path: str, key: str | None, **kwargs: Any) -> httpx.Response:
    """A request with exactly this key (or none): not the helpers' registered one."""
    return httpx.request(method, api_url + path, headers=auth(key) | kwargs.pop("headers", {}), timeout=60, **kwargs)


def _answer(response: httpx.Response, session_id: str) -> tuple[int, str]:
    """Status and body, the id blanked out: what a caller learns about an id."""
    return response.status_code, response.text.replace(session_id, "<id>")


def _socket_refusal(url: str, headers: dict[str, str]) -> tuple[int | None, str]:
    """Open an audio socket and read until the server closes it: (close code, its last message)."""
    messages: list[dict[str, Any]] = []
    with connect(url, additional_headers=headers) as socket:
        try:
            for message in socket:
                messages.append(json.loads(message))
        except ConnectionClosed:  # a close code other than 1000
            pass
    return socket.close_code, messages[-1]["message"] if messages else ""


def _routes(settings: Settings, prefix: str) -> dict[tuple[str, str], RouteContext]:
    """The app's routes under `prefix` by (method, path), included routers flattened; WebSockets as "WS"."""
    routes: dict[tuple[str, str], RouteContext] = {}
    for context in iter_route_contexts(create_app(settings).routes):
        if context.path is None or not context.path.startswith(prefix):
            continue
        if isinstance(context.route, APIRoute):
            routes |= {(method, context.path): context for method in context.methods or ()}
        elif isinstance(context.route, APIWebSocketRoute):
            routes[("WS", context.path)] = context
    return routes


def _calls(dependant: Dependant) -> set[Any]:
    return {dependant.call}.union(*(_calls(sub) for sub in dependant.dependencies))


def _concrete(path: str, session_id: str = UNKNOWN) -> str:
    concrete = path.replace("{session_id}", session_id).replace("{name}", "stream.m3u8").replace("{sink}", "s3")
    return concrete.replace("{endpoint_id}", "ep_0000000000000000")


def test_every_v1_route_is_in_the_tenant_table_and_needs_a_key(tmp_path: Path) -> None:
    """A new /v1 route fails here until it is added to a table of tests/api/route_table.py, with its cross-tenant
    check (a bare name there is a test of this file)."""
    routes = _routes(Settings(home=tmp_path), "/v1")
    assert set(routes) == set(SESSION_ROUTES) | set(OTHER_ROUTES) | set(KEYLESS_ROUTES)
    for test in [*OTHER_ROUTES.values(), *KEYLESS_ROUTES.values()]:  # a test in this file, or "module:test"
        module, _, name = test.rpartition(":")
        assert callable(getattr(importlib.import_module(module), name) if module else globals().get(name)), test
    for (method, path), route in routes.items():
        if method != "WS" and (method, path) not in KEYLESS_ROUTES:  # the audio socket checks its key itself
            assert require_key in _calls(route.dependant), f"{method} {path} does not depend on require_key"


def test_another_tenants_delete_is_404_exactly_like_an_unknown_id(
    api_url: str, keys: dict[str, str], a_render: dict[str, Any]
) -> None:
    render_id = a_render["id"]
    for path in ("/v1/renders/{id}", "/v1/sessions/{id}"):
        unknown = _answer(_call(api_url, "DELETE", path.format(id=UNKNOWN), keys["tenant-b"]), UNKNOWN)
        assert unknown[0] == 404 and "not found" in unknown[1], (path, unknown)
        assert _answer(_call(api_url, "DELETE", path.format(id=render_id), keys["tenant-b"]), render_id) == unknown
    owner = _call(api_url, "GET", f"/v1/renders/{render_id}/video.mp4", keys["tenant-a"])
    assert owner.status_code == 200 and owner.content  # B's deletes touched nothing of A's


def test_another_tenants_render_is_404_on_every_route_exactly_like_an_unknown_id(
    api_url: str, keys: dict[str, str], a_render: dict[str, Any]
) -> None:
    render_id = a_render["id"]
    for (method, _), requests in SESSION_ROUTES.items():
        for path, expected in requests:
            unknown = _answer(_call(api_url, method, path.format(id=UNKNOWN), keys["tenant-b"]), UNKNOWN)
            assert unknown[0] == 404 and "not found" in unknown[1], (path, unknown)
            other = _answer(_call(api_url, method, path.format(id=render_id), keys["tenant-b"]), render_id)
            assert other == unknown, (method, path)
            owner = _call(api_url, method, path.format(id=render_id), keys["tenant-a"])
            assert owner.status_code == expected, (method, path, owner.text)
            assert _answer(owner, render_id) != unknown, (method, path)
    # B's attempts changed nothing: still A's, still completed.
    assert _call(api_url, "GET", f"/v1/renders/{render_id}", keys["tenant-a"]).json()["status"] == "completed"


def test_the_owner_gets_its_video_stream_and_events(
    api_url: str, keys: dict[str, str], a_render: dict[str, Any]
) -> None:
    base, key = f"/v1/renders/{a_render['id']}", keys["tenant-a"]
    assert _call(api_url, "GET", f"{base}/video.mp4", key).headers["content-type"] == "video/mp4"
    playlist = _call(api_url, "GET", f"{base}/stream.m3u8", key).text
    assert "seg-N00000.m4s" in playlist and playlist.rstrip().endswith("#EXT-X-ENDLIST")
    events = _call(api_url, "GET", f"{base}/events", key)
    assert events.headers["content-type"].startswith("text/event-stream")
    last = [line for line in events.text.splitlines() if line.startswith("data: ")][-1]
    assert json.loads(last.removeprefix("data: "))["status"] == "completed"


def test_lists_show_only_the_callers_sessions(
    stack: Stack, api_url: str, keys: dict[str, str], a_render: dict[str, Any]
) -> None:
    def listed(key: str | None, **params: Any) -> set[str]:
        response = _call(api_url, "GET", "/v1/renders", key, params={"limit": 200, **params})
        assert response.status_code == 200, response.text
        return {item["id"] for item in response.json()["items"]}

    assert a_render["id"] in listed(keys["tenant-a"]) and a_render["id"] in listed(keys["tenant-a"], status="completed")
    for other in (keys["tenant-b"], api_key(api_url)):  # another tenant, and the stack's own (tenant `local`)
        assert a_render["id"] not in listed(other) | listed(other, status="completed")
    assert listed(keys["tenant-a"]).isdisjoint(listed(api_key(api_url)))


def test_sessions_belong_to_the_tenant_that_starts_them(
    api_url: str, db: sessionmaker[Any], keys: dict[str, str], a_render: dict[str, Any], sample_portrait: bytes
) -> None:
    """A render (POST /v1/renders) and a live session (POST /v1/sessions) are their starter's tenant's."""
    created = _call(api_url, "POST", "/v1/sessions", keys["tenant-b"], files={"portrait": ("p.jpg", sample_portrait)})
    assert created.status_code == 201, created.text
    b_live = created.json()["id"]
    try:
        with db() as session:
            rows = [repo.get_session(session, session_id=sid) for sid in (a_render["id"], b_live)]
            assert [row and row.tenant for row in rows] == ["tenant-a", "tenant-b"]
        assert _call(api_url, "GET", f"/v1/sessions/{b_live}", keys["tenant-a"]).status_code == 404
        assert _call(api_url, "POST", f"/v1/renders/{b_live}/cancel", keys["tenant-a"]).status_code == 404
        b_ids = {item["id"] for item in _call(api_url, "GET", "/v1/renders", keys["tenant-b"]).json()["items"]}
        assert b_live in b_ids and a_render["id"] not in b_ids
    finally:
        cancelled = _call(api_url, "POST", f"/v1/renders/{b_live}/cancel", keys["tenant-b"])
    assert cancelled.status_code == 202, cancelled.text  # A's attempt did not cancel it; B's own does
    ended = poll(api_url, b_live, lambda s: s["status"] in TERMINAL, timeout_s=60, api_key=keys["tenant-b"])
    assert ended["status"] == "cancelled"


def test_a_live_session_and_its_audio_socket_are_its_tenants_alone(
    api_url: str, keys: dict[str, str], sample_portrait: bytes
) -> None:
    """B gets 404 on every route of A's running live session and close 4404 on its audio socket, as for an
    unknown id, and takes nothing from it: A's own socket then takes audio, and A's cancel stops it."""
    key_a, key_b = keys["tenant-a"], keys["tenant-b"]
    created = _call(api_url, "POST", "/v1/sessions", key_a, files={"portrait": ("p.jpg", sample_portrait)})
    assert created.status_code == 201, created.text
    live = created.json()
    for method, path in [
        ("GET", "/v1/sessions/{id}"),
        ("GET", "/v1/renders/{id}"),
        ("GET", "/v1/renders/{id}/events"),  # A's would stream until the session ends
        ("GET", "/v1/renders/{id}/stream.m3u8"),
        ("POST", "/v1/renders/{id}/cancel"),
        ("POST", "/v1/renders/{id}/resume"),
    ]:
        unknown = _answer(_call(api_url, method, path.format(id=UNKNOWN), key_b), UNKNOWN)
        assert _answer(_call(api_url, method, path.format(id=live["id"]), key_b), live["id"]) == unknown, path
    socket_url = live["links"]["audio"]
    unknown_socket = _socket_refusal(socket_url.replace(live["id"], UNKNOWN), auth(key_b))
    assert unknown_socket[0] == 4404
    code, message = _socket_refusal(socket_url, auth(key_b))
    assert (code, message.replace(live["id"], UNKNOWN)) == unknown_socket

    with connect(socket_url, additional_headers=auth(key_a)) as socket:  # B's attempts did not take the socket
        assert skip_ready(socket)["samples"] == 0
        socket.send(np.zeros(AUDIO_RATE, dtype="<i2").tobytes())
        assert json.loads(socket.recv(timeout=30))["type"] == "ack"
        owner = _call(api_url, "GET", f"/v1/sessions/{live['id']}", key_a)
        assert owner.status_code == 200 and owner.json()["kind"] == "live"
        cancelled = _call(api_url, "POST", f"/v1/renders/{live['id']}/cancel", key_a)
        assert cancelled.status_code == 202, cancelled.text
    session = poll(api_url, live["id"], lambda s: s["status"] in TERMINAL, timeout_s=60, api_key=key_a)
    assert session["status"] == "cancelled", session["error"]


def test_webhook_endpoints_and_deliveries_are_their_tenants_alone(
    api_url: str, keys: dict[str, str], a_render: dict[str, Any]
) -> None:
    """B sees none of A's endpoints or deliveries, and cannot delete A's endpoint (a 404, as for an unknown id)."""
    key_a, key_b = keys["tenant-a"], keys["tenant-b"]
    created = _call(api_url, "POST", "/v1/webhooks", key_a, json={"url": "http://127.0.0.1:9/a-hooks"})
    assert created.status_code == 201, created.text
    endpoint = created.json()["id"]
    assert [e["id"] for e in _call(api_url, "GET", "/v1/webhooks", key_a).json()["items"]] == [endpoint]
    assert _call(api_url, "GET", "/v1/webhooks", key_b).json()["items"] == []
    query = f"/v1/webhooks/deliveries?session_id={a_render['id']}"
    assert _call(api_url, "GET", query, key_b).json()["items"] == []
    unknown = _answer(_call(api_url, "DELETE", "/v1/webhooks/ep_0000000000000000", key_b), "ep_0000000000000000")
    assert unknown[0] == 404
    assert _answer(_call(api_url, "DELETE", f"/v1/webhooks/{endpoint}", key_b), endpoint) == unknown
    assert _call(api_url, "DELETE", f"/v1/webhooks/{endpoint}", key_a).status_code == 204
    assert _call(api_url, "GET", "/v1/webhooks", key_a).json()["items"] == []


def test_assets_are_their_tenants_alone(api_url: str, keys: dict[str, str], sample_portrait: bytes) -> None:
    """B can neither use A's asset in a create nor delete it: the same answers as for an id nobody has."""
    key_a, key_b = keys["tenant-a"], keys["tenant-b"]
    upload = {"data": {"kind": "portrait"}, "files": {"file": ("face.jpg", sample_portrait)}}
    asset = _call(api_url, "POST", "/v1/assets", key_a, **upload).json()["id"]
    unknown = "0" * 32

    def create(key: str, asset_id: str) -> tuple[int, str]:
        body = {"portrait": {"asset_id": asset_id}, "audio": {"url": "https://example.com/speech.wav"}}
        return _answer(_call(api_url, "POST", "/v1/renders", key, json=body), asset_id)

    assert create(key_b, asset) == create(key_b, unknown) and create(key_b, unknown)[0] == 422
    deleted_unknown = _answer(_call(api_url, "DELETE", f"/v1/assets/{unknown}", key_b), unknown)
    assert _answer(_call(api_url, "DELETE", f"/v1/assets/{asset}", key_b), asset) == deleted_unknown
    assert deleted_unknown[0] == 404
    assert _call(api_url, "DELETE", f"/v1/assets/{asset}", key_a).status_code == 204


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer", "Bearer not-a-key", "Basic dXNlcjpwYXNz", f"Bearer mk_deadbeef_{'a' * 32}", "revoked"],
    ids=["none", "empty", "garbage", "basic", "unknown-key", "revoked"],
)
def test_requests_without_a_valid_key_are_401_and_say_how_to_get_one(
    stack: Stack, api_url: str, db: sessionmaker[Any], authorization: str | None
) -> None:
    if authorization == "revoked":
        with db() as session:
            key_id, key = apikeys.create_key(session, tenant="tenant-revoked")
        assert _call(api_url, "GET", "/v1/renders", key).status_code == 200
        with db() as session:
            assert apikeys.revoke_key(session, key_id)
        authorization = f"Bearer {key}"
    headers = {"Authorization": authorization} if authorization else {}
    for method, path in _routes(stack.settings, "/v1"):
        if (method, path) in KEYLESS_ROUTES:  # a link, ticket or resource id instead of a key: their own tests
            continue
        if method == "WS":
            url = "ws" + api_url.removeprefix("http") + _concrete(path)
            code, message = _socket_refusal(url, headers)
            assert code == 4401 and HOW_TO_GET_A_KEY in message, (path, message)
            continue
        response = _call(api_url, method, _concrete(path), None, headers=headers)
        assert response.status_code == 401, (method, path, response.text)
        assert HOW_TO_GET_A_KEY in response.json()["detail"] and response.headers["www-authenticate"] == "Bearer"


def test_a_tenant_key_is_403_on_ops_and_the_stacks_ops_key_is_not(
    stack: Stack, api_url: str, keys: dict[str, str]
) -> None:
    routes = _routes(stack.settings, "/ops/api")
    assert routes
    for method, path in routes:
        response = _call(api_url, method, _concrete(path), keys["tenant-a"])
        assert response.status_code == 403 and "ops" in response.json()["detail"], (path, response.text)
    assert _call(api_url, "GET", "/ops/api/sessions", api_key(api_url)).status_code == 200


def test_a_tenant_at_its_session_limit_gets_429_and_nothing_is_stored(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    """The API in process, on the stack's database, Temporal and storage, with a limit of one session."""
    settings = stack.settings.model_copy(
        update={
            "limits": stack.settings.limits.model_copy(update={"max_sessions_per_tenant": 1}),
            # No Temporal SDK metrics port in this process: the shared stack's API process holds that one.
            "api": stack.settings.api.model_copy(update={"temporal_metrics_port": None}),
        }
    )
    with db() as session:
        key = auth(apikeys.create_key(session, tenant="tenant-limited")[1])
    root = stack.settings.storage.root
    assert root is not None
    with TestClient(create_app(settings), base_url=str(settings.api.public_url)) as client:
        first = client.post("/v1/sessions", files={"portrait": ("p.jpg", sample_portrait)}, headers=key)
        assert first.status_code == 201, first.text
        try:
            before = _stored(db, root), workflow_count(stack.settings)
            for path, files in [
                ("/v1/sessions", {"portrait": ("p.jpg", sample_portrait)}),
                ("/v1/renders", {"portrait": ("p.jpg", sample_portrait), "audio": ("s.wav", sample_speech)}),
            ]:
                refused = client.post(path, files=files, headers=key)
                assert refused.status_code == 429, refused.text
                assert "MONOLOGUE_LIMITS__MAX_SESSIONS_PER_TENANT" in refused.json()["detail"]
            assert (_stored(db, root), workflow_count(stack.settings)) == before
        finally:
            first_id = first.json()["id"]
            assert client.post(f"/v1/renders/{first_id}/cancel", headers=key).status_code == 202
            deadline = time.monotonic() + 60
            while client.get(f"/v1/renders/{first_id}", headers=key).json()["status"] not in TERMINAL:
                assert time.monotonic() < deadline, "the cancelled session did not end"
                time.sleep(0.2)


def _stored(db: sessionmaker[Any], root: Path) -> tuple[int, list[str]]:
    """Tenant-limited's sessions in the database, and every session's folder in storage."""
    with db() as session:
        rows = repo.list_sessions(session, limit=1000, offset=0, tenant="tenant-limited")
    return len(rows), sorted(path.name for path in (root / "sessions").iterdir())


def test_keys_commands_create_list_and_revoke_and_store_only_a_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "keys.db"
    monkeypatch.setenv("MONOLOGUE_HOME", str(tmp_path))
    monkeypatch.setenv("MONOLOGUE_DATABASE_URL", f"sqlite:///{database}")
    monkeypatch.delenv("MONOLOGUE_API_KEY", raising=False)
    get_settings.cache_clear()
    runner = CliRunner()
    try:
        created = runner.invoke(main, ["keys", "create", "--tenant", "acme", "--ops"])
        assert created.exit_code == 0, created.output
        key = created.output.split()[-1]
        key_id = key.split("_")[1]
        assert f"key {key_id} for tenant acme (ops)" in created.output

        listed = runner.invoke(main, ["keys", "list"]).output
        assert key_id in listed and "acme" in listed and "ops" in listed and "active" in listed
        assert key not in listed
        engine = make_engine(f"sqlite:///{database}")
        with make_sessionmaker(engine)() as session:
            row = session.get(ApiKeyRow, key_id)
            assert row is not None and row.key_hash == hashlib.sha256(key.encode()).hexdigest()
            assert apikeys.authenticate(session, key) is not None
        engine.dispose()
        # Not in any column, nor anywhere in the database's files (the WAL included).
        assert not any(key.encode() in path.read_bytes() for path in tmp_path.glob("keys.db*"))

        revoked = runner.invoke(main, ["keys", "revoke", key_id])
        assert revoked.exit_code == 0 and f"revoked {key_id}" in revoked.output
        again = runner.invoke(main, ["keys", "revoke", key_id])
        assert again.exit_code == 1 and f"no active key {key_id}" in again.output
        assert "revoked" in runner.invoke(main, ["keys", "list"]).output
        engine = make_engine(f"sqlite:///{database}")
        with make_sessionmaker(engine)() as session:
            assert apikeys.authenticate(session, key) is None
        engine.dispose()

        bad = runner.invoke(main, ["keys", "create", "--tenant", "Not A Tenant"])
        assert bad.exit_code == 2 and "lowercase" in bad.output

        scoped = runner.invoke(main, ["keys", "create", "--tenant", "acme", "--scope", "priority"])
        assert scoped.exit_code == 0 and "for tenant acme (priority)" in scoped.output, scoped.output
        engine = make_engine(f"sqlite:///{database}")
        with make_sessionmaker(engine)() as session:
            row = session.get(ApiKeyRow, scoped.output.split()[-1].split("_")[1])
            assert row is not None and row.scopes == ["priority"]
        engine.dispose()
        unknown = runner.invoke(main, ["keys", "create", "--tenant", "acme", "--scope", "everything"])
        assert unknown.exit_code == 2 and "unknown scopes" in unknown.output
    finally:
        get_settings.cache_clear()
