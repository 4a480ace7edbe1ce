"""The command line as users run it: `monologue up` stops everything it started, `monologue render`
shows progress and writes a playable MP4, and every log line carries the ids it should."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monologue.stack import Stack, free_port, http_ok
from tests.conftest import SAMPLES
from tests.helpers import api_key, decode_video

pytestmark = pytest.mark.slow
MONOLOGUE = [sys.executable, "-m", "monologue"]


def _children(pid: int) -> set[int]:
    """All descendants of `pid`, from /proc."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def _with_key(api_url: str) -> dict[str, str]:
    """The environment for a CLI command against the test stack: its key, as a user would export it."""
    return {**os.environ, "MONOLOGUE_API_KEY": api_key(api_url) or ""}


def _up(tmp_path: Path) -> subprocess.Popen[bytes]:
    """`monologue up` as a user starts it, configured only through the environment."""
    api_port = free_port()
    env = {
        **os.environ,
        "MONOLOGUE_HOME": str(tmp_path / "home"),
        "MONOLOGUE_TEMPORAL__ADDRESS": f"127.0.0.1:{free_port()}",
        "MONOLOGUE_TEMPORAL__UI_PORT": str(free_port()),
        "MONOLOGUE_API__PORT": str(api_port),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "monologue", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 120
    while not http_ok(f"http://127.0.0.1:{api_port}/healthz"):
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        assert time.monotonic() < deadline, "monologue up did not come up"
        time.sleep(0.3)
    return process


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGKILL])
def test_up_leaves_no_orphans_when_stopped(tmp_path: Path, stop_signal: signal.Signals) -> None:
    process = _up(tmp_path)
    children = _children(process.pid)
    assert len(children) >= 3, "temporal, the API and a node"
    process.send_signal(stop_signal)
    process.wait(timeout=60)
    deadline = time.monotonic() + 30  # SIGKILL: the children get SIGTERM from the kernel and shut down
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in children if _alive(pid)]


def test_render_command_shows_progress_and_writes_the_video(stack: Stack, api_url: str, tmp_path: Path) -> None:
    output = tmp_path / "out.mp4"
    completed = subprocess.run(
        [
            *MONOLOGUE,
            "render",
            str(SAMPLES / "portrait.jpg"),
            str(SAMPLES / "speech.wav"),
            "-o",
            str(output),
            "--api",
            api_url,
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=_with_key(api_url),
    )
    assert completed.returncode == 0, completed.stderr
    assert "chunks" in completed.stderr and "wrote" in completed.stdout
    frames, video_seconds, audio_seconds = decode_video(output.read_bytes())
    assert len(frames) == 172 and abs(video_seconds - audio_seconds) < 0.04


def test_render_command_reports_bad_input_without_a_traceback(api_url: str, tmp_path: Path) -> None:
    not_audio = tmp_path / "notes.txt"
    not_audio.write_text("this is not speech")
    completed = subprocess.run(
        [sys.executable, "-m", "monologue", "render", str(SAMPLES / "portrait.jpg"), str(not_audio), "--api", api_url],
        capture_output=True,
        text=True,
        timeout=60,
        env=_with_key(api_url),
    )
    assert completed.returncode == 1
    assert "422" in completed.stderr and "audio" in completed.stderr and "Traceback" not in completed.stderr


def test_log_lines_carry_session_workflow_and_chunk_ids(stack: Stack, api_url: str, tmp_path: Path) -> None:
    test_render_command_shows_progress_and_writes_the_video(stack, api_url, tmp_path)
    node_log = (stack.log_dir / "node-test-node.log").read_text().splitlines()
    # Temporal's core writes its own (non-JSON) warnings too, e.g. for heartbeats of a cancelled session.
    node_lines = [json.loads(line) for line in node_log if line.startswith("{")]
    activity_lines = [line for line in node_lines if "activity" in line]
    assert activity_lines
    assert all({"session_id", "workflow_id", "run_id"} <= line.keys() for line in activity_lines)
    chunk_lines = [line for line in activity_lines if line["event"] == "chunk done"]
    assert chunk_lines and all(
        {"chunk", "node_id", "context_ms", "audio_to_video_ms", "super_resolution_ms", "encode_ms"} <= line.keys()
        for line in chunk_lines
    )
    api_lines = [json.loads(line) for line in (stack.log_dir / "api.log").read_text().splitlines()]
    started = [line for line in api_lines if line["event"] == "render started"]
    assert started and all({"session_id", "workflow_id", "path"} <= line.keys() for line in started)
