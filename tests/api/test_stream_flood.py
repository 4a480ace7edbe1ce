"""Open streams and waiting requests cannot take the API from other tenants: an event stream or a download holds
no database connection while it is open, and no request waits for one on the event loop.

Each test runs the real API (uvicorn, in a thread) on a fresh database (SQLite and PostgreSQL) with a pool of
three connections and a short pool timeout, beside the shared stack's Temporal: a request that had to wait for
a connection held by a stream fails (500, or 503 on /readyz) rather than merely being slow, so the tests need no
clock. Run with `-s` to see each request's latency under the flood (docs/benchmarks.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Connection

from api import links
from cli.stack import Stack
from monologue import apikeys, contracts as c, keys, options as options_, repo
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.settings import DatabasePoolSettings
from monologue.storage import ObjectStore, open_store
from tests.helpers import postgres_database, serve_api

pytestmark = pytest.mark.slow
POOL = DatabasePoolSettings(size=2, max_overflow=1, timeout_s=2.0)
STREAMS = (
    2  # per kind of stream (5 kinds: events and downloads, keyless and keyed): 10 in all, over three times the pool
)
VIDEO = bytes(32 << 20)  # larger than what socket buffers take in, so a download that is not read stays open


@dataclass(frozen=True)
class Tenant:
    key: str
    session_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    with ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 'flood.db'}"
            if request.param == "sqlite"
            else stack.enter_context(postgres_database())
        )
        migrate(url)
        yield url


def _seed(url: str, name: str, store: ObjectStore | None = None) -> Tenant:
    """A key and a queued session of tenant `name` (no workflow: the streams only read the row); with `store`, also
    a completed session whose video is VIDEO, `<name>-video`."""
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as db:
            _, key = apikeys.create_key(db, tenant=name)
            for session_id in [f"{name}-session"] + ([f"{name}-video"] if store else []):
                repo.create_session(
                    db,
                    session_id=session_id,
                    tenant=name,
                    options=options_.stored(c.RenderOptions()),
                    workflow_id=c.render_workflow_id(session_id),
                    audio_seconds=2.0,
                    width=64,
                    height=64,
                )
            if store is not None:
                store.put(keys.output(f"{name}-video", "video.mp4"), VIDEO)
                repo.mark_completed(
                    db,
                    session_id=f"{name}-video",
                    video_key=keys.output(f"{name}-video", "video.mp4"),
                    frames=1,
                    chunks=1,
                )
    finally:
        engine.dispose()
    return Tenant(key, f"{name}-session")


@contextmanager
def flood_api(stack: Stack, url: str, **changes: Any) -> Iterator[tuple[str, FastAPI]]:
    with serve_api(stack.settings, database_url=url, database_pool=POOL, **changes) as served:
        yield served


def _open_download(client: httpx.Client, streams: ExitStack, url: str, headers: dict[str, str]) -> None:
    """Start a download and read none of its body: a slow client."""
    response = streams.enter_context(client.stream("GET", url, headers=headers))
    assert response.status_code == 200, response.read()


def _open_events(client: httpx.Client, streams: ExitStack, url: str, headers: dict[str, str]) -> None:
    """Open an event stream and read it up to its first `progress` event (the server has read the session)."""
    response = streams.enter_context(client.stream("GET", url, headers=headers))
    assert response.status_code == 200, response.read()
    for line in response.iter_lines():
        if line == "event: progress":
            return
    raise AssertionError(f"{url} ended before its first progress event")


def _probes(api: str, tenant: Tenant) -> list[tuple[str, str, dict[str, str]]]:
    """Requests of every kind another tenant makes: sync and async routes, a download refused, the probes."""
    session = f"{api}/v1/renders/{tenant.session_id}"
    return [
        ("GET", f"{api}/healthz", {}),
        ("GET", f"{api}/readyz", {}),
        ("GET", session, tenant.headers),
        ("GET", f"{api}/v1/renders", tenant.headers),
        ("GET", f"{session}/video.mp4", tenant.headers),  # 409: not completed
        ("POST", f"{session}/cancel", tenant.headers),  # 409: its workflow does not run (an async route)
        ("GET", f"{api}/v1/webhooks", tenant.headers),
    ]


def test_streams_beyond_the_pool_leave_other_tenants_answered(stack: Stack, database_url: str) -> None:
    """Ten open streams on a three-connection pool (event streams and unread downloads, through keyless playback
    links and with A's key, and B's own event streams): B's requests, the probes and a cancel all answer, none with
    a 5xx."""
    a = _seed(database_url, "flood-a", open_store(stack.settings.storage))
    b = _seed(database_url, "flood-b")
    with flood_api(stack, database_url) as (api, app), ExitStack() as streams:
        sign = partial(links.sign, links.link_key(app.state.services.settings), expires=int(time.time()) + 600)
        events, video = sign(a.session_id), sign("flood-a-video")
        client = streams.enter_context(httpx.Client(timeout=30, limits=httpx.Limits(max_connections=None)))
        for _ in range(STREAMS):
            _open_events(client, streams, f"{api}/play/{events}/events", {})
            _open_events(client, streams, f"{api}/v1/renders/{a.session_id}/events", a.headers)
            _open_events(client, streams, f"{api}/v1/renders/{b.session_id}/events", b.headers)
            _open_download(client, streams, f"{api}/play/{video}/video.mp4", {})
            _open_download(client, streams, f"{api}/v1/renders/flood-a-video/video.mp4", a.headers)
        answers = []
        for method, url, headers in _probes(api, b) * 3:
            started = time.perf_counter()
            answer = httpx.request(method, url, headers=headers, timeout=30)
            answers.append((method, url.removeprefix(api), answer.status_code, time.perf_counter() - started))
        print("\n".join(f"{m} {path}: {status} in {seconds * 1000:.0f} ms" for m, path, status, seconds in answers))
        failed = [(m, path, status) for m, path, status, _ in answers if status >= 500]
        assert not failed, f"requests failed while {5 * STREAMS} streams were open: {failed}"
        assert {status for m, path, status, _ in answers if path == f"/v1/renders/{b.session_id}"} == {200}


def _hold_pool(app: FastAPI) -> list[Connection]:
    """Every connection of the app's pool, checked out by the test."""
    engine = app.state.services.sessions.kw["bind"]
    return [engine.connect() for _ in range(POOL.size + POOL.max_overflow)]


def test_requests_waiting_for_the_database_leave_the_event_loop_free(stack: Stack, database_url: str) -> None:
    """With every connection taken, twenty concurrent webhook creates wait for one on the thread pool: /healthz
    still answers (it would wait behind them if they waited on the event loop). Once the pool is free again they
    all finish, ten endpoints made (the limit) and ten refused."""
    b = _seed(database_url, "flood-b")
    pool = DatabasePoolSettings(size=POOL.size, max_overflow=POOL.max_overflow, timeout_s=60.0)
    with serve_api(stack.settings, database_url=database_url, database_pool=pool) as (api, app):
        held = _hold_pool(app)
        started = threading.Event()

        def create(number: int) -> int:
            started.set()
            body = {"url": f"http://127.0.0.1:9/hook-{number}"}
            return httpx.post(f"{api}/v1/webhooks", json=body, headers=b.headers, timeout=120).status_code

        with ThreadPoolExecutor(20) as creates:
            statuses = creates.map(create, range(20))
            started.wait()
            try:
                # Answered while every connection is still held: none of the creates blocks the event loop. A
                # failure here is a timeout of this one request, not a measurement.
                assert httpx.get(f"{api}/healthz", timeout=20).status_code == 200
            finally:
                for connection in held:
                    connection.close()
            found = sorted(statuses)
    assert found == [201] * 10 + [422] * 10, found
