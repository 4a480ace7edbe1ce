"""Two API processes on one PostgreSQL database (and one Temporal): the stack's own API under uvicorn and a second
in this process. Requests racing each other across them must still keep the per-tenant session limit, resume a
session once, and migrate a fresh database once at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier
from typing import Any

import httpx
import pytest
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.app import create_app
from api.submit import TERMINAL
from cli.stack import Stack, free_port
from monologue.client import auth
from monologue.db import alembic_config, make_engine
from monologue.settings import ApiSettings, LimitSettings, NodeSettings, Settings, TemporalSettings
from tests.helpers import poll, postgres_database

pytestmark = pytest.mark.slow
CREATES = 6  # concurrent creates, split between the two APIs


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Temporal, one node and the first API on a fresh PostgreSQL database; each tenant may hold one session."""
    with postgres_database() as database_url:
        settings = Settings(
            home=tmp_path_factory.mktemp("two-apis"),
            database_url=database_url,
            log_format="json",
            temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
            api=ApiSettings(port=free_port()),
            node=NodeSettings(id="two-apis-node"),
            limits=LimitSettings(max_sessions_per_tenant=1),
        )
        with Stack(settings) as stack:
            yield stack


Send = Callable[..., httpx.Response]


@pytest.fixture(scope="module")
def apis(pg_stack: Stack) -> Iterator[tuple[Send, Send]]:
    """`post`-like callables, one per API process (paths relative to the API's root, the stack's key sent)."""
    settings = pg_stack.settings
    key = auth(pg_stack.api_key)
    url = str(settings.api.public_url).rstrip("/")
    with TestClient(create_app(settings), base_url=url) as second, httpx.Client(base_url=url, timeout=60) as first:

        def via_first(path: str, **kwargs: Any) -> httpx.Response:
            return first.post(path, headers=key | kwargs.pop("headers", {}), **kwargs)

        def via_second(path: str, **kwargs: Any) -> httpx.Response:
            return second.post(path, headers=key | kwargs.pop("headers", {}), **kwargs)

        yield via_first, via_second


def _at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run `calls` on threads released together, so their requests overlap."""
    barrier = Barrier(len(calls))

    def run(call: Callable[[], httpx.Response]) -> httpx.Response:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _end(pg_stack: Stack, post: Send, session_id: str) -> None:
    """Cancel a session and wait until it has ended (so the tenant's place is free again)."""
    post(f"/v1/renders/{session_id}/cancel")
    url = str(pg_stack.settings.api.public_url)
    ended = poll(url, session_id, lambda s: s["status"] in TERMINAL, timeout_s=60, api_key=pg_stack.api_key)
    assert ended["status"] in TERMINAL


def test_concurrent_creates_across_two_apis_start_exactly_one_session(
    pg_stack: Stack, apis: tuple[Send, Send], sample_portrait: bytes
) -> None:
    """Against a limit of one, every create but one gets 429, and only one session row exists."""
    files = {"portrait": ("p.jpg", sample_portrait)}
    calls = [lambda post=apis[i % 2]: post("/v1/sessions", files=files) for i in range(CREATES)]
    responses = _at_once(calls)
    codes = sorted(response.status_code for response in responses)
    created = [response.json()["id"] for response in responses if response.status_code == 201]
    try:
        assert codes == [201] + [429] * (CREATES - 1), [response.text for response in responses]
        with make_engine(pg_stack.settings.db_url).connect() as connection:
            assert connection.scalar(text("SELECT count(*) FROM sessions WHERE tenant = 'local'")) == 1
    finally:
        for session_id in created:
            _end(pg_stack, apis[0], session_id)


def test_duplicates_with_one_idempotency_key_across_two_apis_make_one_session(
    pg_stack: Stack, apis: tuple[Send, Send], sample_portrait: bytes
) -> None:
    """The same create with one Idempotency-Key through both APIs at once, on PostgreSQL: one session, every answer
    names it (the key's primary key decides, in the database)."""
    files = {"portrait": ("p.jpg", sample_portrait)}
    headers = {"Idempotency-Key": "two-apis-1"}
    calls = [lambda post=apis[i % 2]: post("/v1/sessions", files=files, headers=headers) for i in range(CREATES)]
    responses = _at_once(calls)
    ids = {response.json().get("id") for response in responses}
    try:
        assert [response.status_code for response in responses] == [201] * CREATES, [r.text for r in responses]
        assert len(ids) == 1
        with make_engine(pg_stack.settings.db_url).connect() as connection:
            count = connection.scalar(text("SELECT count(*) FROM sessions WHERE id = :id"), {"id": next(iter(ids))})
            assert count == 1
    finally:
        for session_id in ids - {None}:
            _end(pg_stack, apis[0], str(session_id))


def test_concurrent_resumes_across_two_apis_resume_once(
    pg_stack: Stack, apis: tuple[Send, Send], sample_portrait: bytes, sample_speech: bytes
) -> None:
    """A cancelled render resumed through both APIs at once: one 202, one 409."""
    first, second = apis
    files = {"portrait": ("p.jpg", sample_portrait), "audio": ("s.wav", sample_speech)}
    response = first("/v1/renders", files=files)
    assert response.status_code == 201, response.text
    session_id = response.json()["id"]
    _end(pg_stack, second, session_id)
    try:
        responses = _at_once([lambda post=post: post(f"/v1/renders/{session_id}/resume") for post in apis])
        assert sorted(r.status_code for r in responses) == [202, 409], [r.text for r in responses]
    finally:
        _end(pg_stack, first, session_id)


def test_two_processes_migrating_a_fresh_database_at_once_both_succeed() -> None:
    """Both processes start migrating at the same moment; each exits 0 and the schema is at head once."""
    start_at = time.time() + 5  # after both interpreters have imported everything
    script = (
        "import sys, time; from monologue.db import migrate;"
        " time.sleep(max(0.0, float(sys.argv[2]) - time.time())); migrate(sys.argv[1])"
    )
    with postgres_database() as url:
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", script, url, str(start_at)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=os.environ.copy(),
            )
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=120)[0].decode() for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs
        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        engine = make_engine(url)
        with engine.connect() as connection:
            assert list(connection.scalars(text("SELECT version_num FROM alembic_version"))) == [head]
        engine.dispose()
