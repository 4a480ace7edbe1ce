"""Live clients that vanish without `end`: the session still ends, with a video of the audio that arrived.

Two ways to vanish: the client's TCP connection drops (the API sees the socket close and waits for a reconnect,
which never comes: the workflow's idle timeout ends the audio), and the API itself crashes mid-stream (nothing is
left to end the audio: the workflow's own idle timeout does). Its own stack, with a 3-second idle timeout so either
end comes quickly. (A client that does reconnect continues the same session: tests/test_live.py.)"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.live_stream import start_session
from cli.stack import Stack, free_port
from monologue.live_audio import stored_live_audio
from monologue.settings import ApiSettings, NodeSettings, RenderDefaults, Settings, TemporalSettings
from monologue.storage import LocalStore
from tests.conftest import SAMPLES
from tests.helpers import api_key, get, register_api, skip_ready, wait_done, ws_connect

pytestmark = pytest.mark.slow
IDLE_TIMEOUT_S = 3.0
SENT_S = 3  # seconds of speech each client sends before it vanishes
FPS = 25
WORKFLOW_IDLE_LOGGED = "live session idle: ending it"  # workflows/planning.py's IDLE


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("live-drop"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id="node-a", lease_timeout_s=3.0),
        render=RenderDefaults(continue_as_new_every=2, live_idle_timeout_s=IDLE_TIMEOUT_S),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


def test_a_live_client_that_drops_its_connection_gets_a_video_of_the_audio_it_sent(live_stack: Stack) -> None:
    url = str(live_stack.settings.api.public_url)
    session = _send_speech_then_vanish(url, drop=_drop_tcp)
    render = wait_done(url, session["id"], timeout_s=120)
    _assert_ended_with_what_was_sent(live_stack, render)
    assert _workflow_idled_out(live_stack, session["id"])  # no reconnect came within the idle timeout


def test_a_live_session_whose_api_crashes_mid_stream_ends_on_the_workflow_idle_timeout(live_stack: Stack) -> None:
    """SIGKILL the API with the socket open: no API code runs to end the audio, and the restarted API has no
    socket for the session; only the workflow's idle timer can end it, and the stream is closed."""
    url = str(live_stack.settings.api.public_url)
    session = _send_speech_then_vanish(url, drop=lambda _: live_stack.restart("api", crash=True))
    render = wait_done(url, session["id"], timeout_s=120)
    assert render["status"] == "completed", render["error"]
    assert _workflow_idled_out(live_stack, session["id"])
    frames = render["progress"]["frames_total"]
    assert 0 < frames <= SENT_S * FPS
    assert len((_out(live_stack, render["id"]) / "frames.jsonl").read_text().splitlines()) == frames
    assert get(render["links"]["stream"], timeout=10).text.rstrip().endswith("#EXT-X-ENDLIST")


def test_a_live_session_whose_api_crashes_keeps_every_acknowledged_second(live_stack: Stack) -> None:
    """The API signals the workflow about once a chunk but acknowledges each 0.1 s once stored: the workflow's
    idle timeout plans from what storage holds, so no acknowledged audio is lost (63 of 75 frames before)."""
    url = str(live_stack.settings.api.public_url)
    session = _send_speech_then_vanish(url, drop=lambda _: live_stack.restart("api", crash=True))
    _assert_ended_with_what_was_sent(live_stack, wait_done(url, session["id"], timeout_s=120))
    root = live_stack.settings.storage.root
    assert root is not None
    # ended in storage too (by the workflow: no API did), so a late API or a resume finds it closed at 3 s
    assert stored_live_audio(LocalStore(root), session["id"]) == (SENT_S * 16_000, True)


def _send_speech_then_vanish(url: str, drop: Any) -> dict[str, Any]:
    """Start a live session, send SENT_S seconds of speech (each 0.1 s message acknowledged, so all of it is
    stored), then call `drop(socket)` instead of sending `end`."""
    session = start_session(url, SAMPLES / "portrait.jpg", api_key=api_key(url))
    pcm = np.frombuffer((SAMPLES / "speech.wav").read_bytes()[44:], dtype="<i2")[: 16_000 * SENT_S]
    with ws_connect(session["links"]["audio"]) as audio:
        skip_ready(audio)
        for offset in range(0, len(pcm), 1600):
            audio.send(pcm[offset : offset + 1600].tobytes())
            assert json.loads(audio.recv(timeout=10))["type"] == "ack"
        drop(audio)  # leaving the block then finds the connection already gone: no close frame is sent
    return session


def _drop_tcp(audio: Any) -> None:
    """Close the TCP connection under the WebSocket: no close frame, no `end`, as a client that lost its
    network or was killed."""
    raw: socket.socket = audio.socket
    raw.shutdown(socket.SHUT_RDWR)
    raw.close()


def _assert_ended_with_what_was_sent(stack: Stack, render: dict[str, Any]) -> None:
    assert render["status"] == "completed", render["error"]
    assert render["progress"]["frames_total"] == SENT_S * FPS
    frames = (_out(stack, render["id"]) / "frames.jsonl").read_text().splitlines()
    assert len(frames) == SENT_S * FPS
    playlist = get(render["links"]["stream"], timeout=10).text
    assert playlist.rstrip().endswith("#EXT-X-ENDLIST")


def _workflow_idled_out(stack: Stack, session_id: str) -> bool:
    for line in (stack.log_dir / "node-node-a.log").read_text().splitlines():
        if line.startswith("{") and WORKFLOW_IDLE_LOGGED in line and session_id in line:
            return True
    return False


def _out(stack: Stack, session_id: str) -> Path:
    root = stack.settings.storage.root
    assert root is not None
    return root / "sessions" / session_id / "out"
