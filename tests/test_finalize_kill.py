"""A node killed while it finalizes: every chunk is done, the final MP4 is stored, the session is not completed.
Another node repeats finalize and the video is the same, byte for byte.

Its own stack: two nodes whose finalize pauses (node.finalize_delay_s) once the final MP4 is stored, so a test
can kill the node inside finalize, and a graceful shutdown shorter than that pause, so a SIGTERM also hands
finalize over instead of letting the draining node finish it."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.stack import Stack, free_port
from monologue.plan import plan_chunks, timeline_order
from monologue.settings import ApiSettings, NodeSettings, RenderDefaults, Settings, TemporalSettings
from tests.helpers import get, node_of, register_api, submit, wait_done

pytestmark = pytest.mark.slow
NODES = ("node-a", "node-b")
PAUSE_LOGGED = "pausing finalize on purpose (node.finalize_delay_s)"


@pytest.fixture(scope="module")
def finalize_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("finalize"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id=NODES[0], lease_timeout_s=3.0, finalize_delay_s=4.0, graceful_shutdown_s=1.0),
        render=RenderDefaults(continue_as_new_every=2),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    stack.start_node(NODES[1])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def baseline_video(finalize_stack: Stack, sample_portrait: bytes, sample_speech: bytes) -> bytes:
    """The final MP4 of an uninterrupted render: what a render whose finalize was interrupted must equal."""
    url = str(finalize_stack.settings.api.public_url)
    render = wait_done(url, submit(url, sample_portrait, sample_speech).json()["id"], timeout_s=120)
    assert render["status"] == "completed", render["error"]
    return (_out(finalize_stack, render["id"]) / "final.mp4").read_bytes()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_node_killed_during_finalize_leaves_another_node_to_make_the_same_video(
    signum: signal.Signals,
    finalize_stack: Stack,
    baseline_video: bytes,
    sample_portrait: bytes,
    sample_speech: bytes,
) -> None:
    url = str(finalize_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    victim = _wait_for_finalize(finalize_stack, session_id)
    assert (_out(finalize_stack, session_id) / "final.mp4").exists()  # the victim stored it, then paused
    _node_process(finalize_stack, victim).send_signal(signum)
    try:
        render = wait_done(url, session_id, timeout_s=120)
    finally:
        _wait_exited(finalize_stack, victim)
        finalize_stack.start_node(victim)  # the next test has two nodes again
    assert render["status"] == "completed", render["error"]
    assert node_of(url, session_id) != victim  # finalize ran again, elsewhere
    assert render["links"]["video"] and (_out(finalize_stack, session_id) / "final.mp4").read_bytes() == baseline_video
    frames = render["progress"]["frames_total"]
    expected = [f"seg-{s.kind}{s.index:05d}.m4s" for s in timeline_order(plan_chunks(frames, n_frames=40, i_frames=4))]
    playlist = get(render["links"]["stream"], timeout=10).text
    listed = [line for line in playlist.splitlines() if line.startswith("seg-")]
    assert listed == expected and playlist.rstrip().endswith("#EXT-X-ENDLIST")  # each segment once, in order
    assert sorted(p.name for p in _out(finalize_stack, session_id).glob("seg-*.m4s")) == sorted(expected)


def _out(stack: Stack, session_id: str) -> Path:
    root = stack.settings.storage.root
    assert root is not None
    return root / "sessions" / session_id / "out"


def _wait_for_finalize(stack: Stack, session_id: str, timeout_s: float = 120) -> str:
    """The node whose finalize of `session_id` is paused (its log says so)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node_id in NODES:
            for line in (stack.log_dir / f"node-{node_id}.log").read_text().splitlines():
                if line.startswith("{") and PAUSE_LOGGED in line and json.loads(line).get("session_id") == session_id:
                    return node_id
        time.sleep(0.05)
    raise TimeoutError(f"session {session_id} never reached finalize")


def _node_process(stack: Stack, node_id: str) -> Any:
    return next(
        child.process for child in stack.children if child.name == f"node-{node_id}" and child.process.poll() is None
    )


def _wait_exited(stack: Stack, node_id: str) -> None:
    for child in stack.children:
        if child.name == f"node-{node_id}":
            child.process.wait(timeout=60)
