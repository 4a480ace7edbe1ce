"""Long-lived streams cannot hold a node or the API forever: live sessions end after the idle timeout (only
real audio counts) and at their lifetime, audio sockets close when their session ends elsewhere or their key
is revoked, event streams close on revocation, and a key holds a limited number of streams at once.

Each test runs the real API (uvicorn, in a thread) with short limits, on the stack's database, Temporal,
storage and node."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import sessionmaker
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from api.submit import TERMINAL
from cli.stack import Stack
from monologue import apikeys, repo
from monologue.client import auth
from monologue.db import make_engine, make_sessionmaker
from monologue.media import AUDIO_RATE
from tests.helpers import serve_api, skip_ready

pytestmark = pytest.mark.slow
# The idle timeout of the idle tests: it runs from when the node holds the session (about when the create
# answers), so it leaves the client time to open its socket on a loaded machine.
IDLE_S = 6.0
SECOND = np.zeros(AUDIO_RATE, dtype="<i2").tobytes()  # one second of (silent) speech, 16 kHz mono s16le


@pytest.fixture(scope="module")
def db(stack: Stack) -> Iterator[sessionmaker[Any]]:
    engine = make_engine(stack.settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@contextmanager
def serve(stack: Stack, *, api: dict[str, Any] | None = None, **groups: dict[str, Any]) -> Iterator[str]:
    """The API in this process with some settings changed (`api={...}`, `limits={...}`, `render={...}`), on the
    stack's database, Temporal and storage; yields its URL."""
    base = stack.settings
    changes = {group: getattr(base, group).model_copy(update=update) for group, update in groups.items()}
    with serve_api(base, api=api, **changes) as (url, _app):
        yield url


def _key(db: sessionmaker[Any], tenant: str) -> tuple[str, str]:
    """A fresh key of its own tenant (each test's sessions stay clear of the tenant session limit): (id, key)."""
    with db() as session:
        return apikeys.create_key(session, tenant=tenant)


def _revoke(db: sessionmaker[Any], key_id: str) -> None:
    with db() as session:
        assert apikeys.revoke_key(session, key_id)


def _live_session(url: str, key: str, portrait: bytes) -> dict[str, Any]:
    created = httpx.post(f"{url}/v1/sessions", files={"portrait": ("p.jpg", portrait)}, headers=auth(key), timeout=60)
    assert created.status_code == 201, created.text
    session: dict[str, Any] = created.json()
    return session


def _status(db: sessionmaker[Any], session_id: str) -> str:
    with db() as session:
        row = repo.get_session(session, session_id=session_id)
        assert row is not None
        return row.status


def _wait_ended(url: str, key: str, session_id: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        session: dict[str, Any] = httpx.get(f"{url}/v1/renders/{session_id}", headers=auth(key), timeout=10).json()
        if session["status"] in TERMINAL:
            return session
        assert time.monotonic() < deadline, f"session {session_id} still {session['status']}"
        time.sleep(0.2)


def _socket(session: dict[str, Any], key: str) -> ClientConnection:
    return connect(session["links"]["audio"], additional_headers=auth(key), open_timeout=30)


def _until_closed(socket: ClientConnection, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The server's messages until it closes the socket (a generous bound: it must close by itself)."""
    messages: list[dict[str, Any]] = []
    try:
        while True:
            messages.append(json.loads(socket.recv(timeout=timeout_s)))
    except ConnectionClosed:
        return messages


def _cancel(url: str, key: str, session_id: str) -> None:
    httpx.post(f"{url}/v1/renders/{session_id}/cancel", headers=auth(key), timeout=30)
    _wait_ended(url, key, session_id)


def test_an_idle_live_session_is_freed_despite_empty_frames(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes
) -> None:
    """After one second of audio the client sends only empty binary frames: they are acknowledged but are no
    audio, so the idle timeout ends the session, which completes with that second and frees its node."""
    _, key = _key(db, "idle-frames")
    with serve(stack, render={"live_idle_timeout_s": IDLE_S}, api={"key_recheck_s": 0.5}) as url:
        session = _live_session(url, key, sample_portrait)
        with _socket(session, key) as socket:
            skip_ready(socket)
            socket.send(SECOND)
            assert json.loads(socket.recv(timeout=30))["samples"] == AUDIO_RATE
            messages: list[dict[str, Any]] = []
            while not messages or messages[-1]["type"] == "ack":
                try:
                    socket.send(b"")
                    messages.append(json.loads(socket.recv(timeout=30)))
                except ConnectionClosed:
                    break
                time.sleep(0.1)
            messages += _until_closed(socket)
        assert socket.close_code == 1000
        assert len(messages) > 1 and {message["type"] for message in messages[:-1]} == {"ack"}  # empty frames
        ended = messages[-1]
        assert ended["type"] == "ended" and f"no audio for {IDLE_S:g} s" in ended["message"]
        assert ended["samples"] == AUDIO_RATE
        done = _wait_ended(url, key, session["id"])
    assert done["status"] == "completed" and done["progress"]["frames_total"] == 25


def test_start_messages_do_not_keep_an_idle_live_session(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes
) -> None:
    """`start` messages are no audio either: a session that gets only those ends (with no audio: it fails)."""
    _, key = _key(db, "idle-starts")
    start = json.dumps({"type": "start", "sample_rate": AUDIO_RATE, "channels": 1, "format": "s16le"})
    with serve(stack, render={"live_idle_timeout_s": IDLE_S}, api={"key_recheck_s": 0.5}) as url:
        session = _live_session(url, key, sample_portrait)
        sent = 0
        with _socket(session, key) as socket:
            skip_ready(socket)
            try:
                while sent < 600:  # a minute of `start` messages at most; the server ends it long before
                    socket.send(start)
                    sent += 1
                    time.sleep(0.1)
            except ConnectionClosed:
                pass
            messages = _until_closed(socket)
        assert socket.close_code == 1000 and sent > 1
        assert messages[-1]["type"] == "ended" and f"no audio for {IDLE_S:g} s" in messages[-1]["message"]
        done = _wait_ended(url, key, session["id"])
    assert done["status"] == "failed" and "no audio" in done["error"]


def test_a_live_session_ends_at_its_lifetime_although_audio_keeps_coming(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes
) -> None:
    _, key = _key(db, "lifetime")
    with serve(stack, limits={"max_live_seconds": 3.0}, render={"live_idle_timeout_s": 30.0}) as url:
        session = _live_session(url, key, sample_portrait)
        tenth = SECOND[: len(SECOND) // 10]
        messages: list[dict[str, Any]] = []
        with _socket(session, key) as socket:
            skip_ready(socket)
            for _ in range(600):  # a minute of audio in real time at most; the lifetime ends it after 3 s
                try:
                    socket.send(tenth)
                    messages.append(json.loads(socket.recv(timeout=30)))
                except ConnectionClosed:
                    break
                if messages[-1]["type"] != "ack":
                    break
                time.sleep(0.1)
            messages += _until_closed(socket)
        assert socket.close_code == 1000
        ended = messages[-1]
        assert ended["type"] == "ended" and "MONOLOGUE_LIMITS__MAX_LIVE_SECONDS" in ended["message"]
        done = _wait_ended(url, key, session["id"])
    assert done["status"] == "completed", done["error"]
    assert 0 < done["progress"]["frames_total"] <= 3 * 25


def test_a_live_sessions_audio_stops_at_the_lifetime_however_fast_it_comes(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes
) -> None:
    """Five seconds of audio sent at once to a session with a 3 s lifetime: 3 s are kept, then it ends."""
    _, key = _key(db, "audio-cap")
    with serve(stack, limits={"max_live_seconds": 3.0}) as url:
        session = _live_session(url, key, sample_portrait)
        with _socket(session, key) as socket:
            skip_ready(socket)
            for _ in range(5):
                try:
                    socket.send(SECOND)
                except ConnectionClosed:
                    break
            messages = _until_closed(socket)
        assert socket.close_code == 1000
        assert [message["type"] for message in messages] == ["ack", "ack", "ended"]  # nothing after the third second
        ended = messages[-1]
        assert ended["samples"] == 3 * AUDIO_RATE
        assert "audio reached" in ended["message"] and "MONOLOGUE_LIMITS__MAX_LIVE_SECONDS" in ended["message"]
        done = _wait_ended(url, key, session["id"])
    assert done["status"] == "completed" and done["progress"]["frames_total"] == 75


def test_the_audio_socket_closes_when_its_session_is_cancelled(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes
) -> None:
    """The client sends nothing more after a cancel: it still sees the socket close, with the reason."""
    _, key = _key(db, "cancelled")
    with serve(stack, api={"key_recheck_s": 0.3}, render={"live_idle_timeout_s": 60.0}) as url:
        session = _live_session(url, key, sample_portrait)
        with _socket(session, key) as socket:
            skip_ready(socket)
            socket.send(SECOND)
            assert json.loads(socket.recv(timeout=30))["type"] == "ack"
            cancelled = httpx.post(f"{url}/v1/renders/{session['id']}/cancel", headers=auth(key), timeout=30)
            assert cancelled.status_code == 202, cancelled.text
            messages = _until_closed(socket)
        assert socket.close_code == 4409
        assert messages[-1]["type"] == "error" and "is cancelled" in messages[-1]["message"]
        assert _wait_ended(url, key, session["id"])["status"] == "cancelled"


def test_a_revoked_keys_audio_socket_is_closed_with_4401(
    stack: Stack, db: sessionmaker[Any], sample_portrait: bytes
) -> None:
    key_id, key = _key(db, "revoked-socket")
    with serve(stack, api={"key_recheck_s": 0.3}, render={"live_idle_timeout_s": 60.0}) as url:
        session = _live_session(url, key, sample_portrait)
        with _socket(session, key) as socket:
            skip_ready(socket)
            socket.send(SECOND)
            assert json.loads(socket.recv(timeout=30))["type"] == "ack"
            _revoke(db, key_id)
            messages = _until_closed(socket)
        assert socket.close_code == 4401
        assert messages[-1]["type"] == "error" and "revoked" in messages[-1]["message"]
        # The closed socket ended the session with the audio it had (the database: the key is gone).
        deadline = time.monotonic() + 120
        while (status := _status(db, session["id"])) not in TERMINAL:
            assert time.monotonic() < deadline, f"session {session['id']} still {status}"
            time.sleep(0.2)
    assert status == "completed"


def test_a_revoked_keys_event_stream_is_closed(stack: Stack, db: sessionmaker[Any], sample_portrait: bytes) -> None:
    key_id, key = _key(db, "revoked-events")
    api = {"key_recheck_s": 0.3, "events_poll_s": 0.2}
    with serve(stack, api=api, render={"live_idle_timeout_s": 120.0}) as url:
        session = _live_session(url, key, sample_portrait)
        try:
            lines: list[str] = []
            events_url = f"{url}/v1/renders/{session['id']}/events"
            with httpx.stream("GET", events_url, headers=auth(key), timeout=60) as events:
                assert events.status_code == 200
                for line in events.iter_lines():  # ends only when the server closes the stream
                    lines.append(line)
                    if line.startswith("data: ") and sum(seen.startswith("data: ") for seen in lines) == 1:
                        _revoke(db, key_id)  # the first progress event: revoke now
            assert "event: error" in lines and lines.index("event: progress") < lines.index("event: error")
            assert "revoked" in json.loads(lines[lines.index("event: error") + 1].removeprefix("data: "))["detail"]
            statuses = [json.loads(line.removeprefix("data: "))["status"] for line in lines if "status" in line]
            assert statuses and not set(statuses) & set(TERMINAL)  # the stream did not end with the session
        finally:
            ops = auth(stack.api_key)
            httpx.post(f"{url}/ops/api/sessions/{session['id']}/cancel", headers=ops, timeout=30)


def test_a_key_holds_a_limited_number_of_streams(stack: Stack, db: sessionmaker[Any], sample_portrait: bytes) -> None:
    """With two streams per key: a third event stream gets 429 and an audio socket 4429, both naming the
    setting; once one stream is closed, a new one is taken."""
    (_, key), (_, same_tenant) = _key(db, "stream-cap"), _key(db, "stream-cap")
    limits, render = {"max_streams_per_key": 2}, {"live_idle_timeout_s": 120.0}
    with serve(stack, limits=limits, render=render, api={"events_poll_s": 0.2}) as url:
        session = _live_session(url, key, sample_portrait)
        events_url = f"{url}/v1/renders/{session['id']}/events"
        try:
            with ExitStack() as open_streams:
                held = [open_streams.enter_context(httpx.stream("GET", events_url, headers=auth(key), timeout=30))]
                with httpx.stream("GET", events_url, headers=auth(key), timeout=30) as second:
                    assert [second.status_code, held[0].status_code] == [200, 200]
                    third = httpx.get(events_url, headers=auth(key), timeout=30)
                    assert third.status_code == 429
                    assert "MONOLOGUE_LIMITS__MAX_STREAMS_PER_KEY" in third.json()["detail"]
                    with _socket(session, key) as socket:
                        messages = _until_closed(socket)
                    assert socket.close_code == 4429 and "MAX_STREAMS_PER_KEY" in messages[-1]["message"]
                    with httpx.stream("GET", events_url, headers=auth(same_tenant), timeout=30) as another_keys:
                        assert another_keys.status_code == 200  # the limit is per key
                # The second stream is closed: its slot comes back once the server sees the client gone.
                deadline = time.monotonic() + 30
                while True:
                    with httpx.stream("GET", events_url, headers=auth(key), timeout=30) as again:
                        if again.status_code == 200:
                            break
                    assert time.monotonic() < deadline, "the closed stream's slot never came back"
                    time.sleep(0.1)
        finally:
            _cancel(url, key, session["id"])
