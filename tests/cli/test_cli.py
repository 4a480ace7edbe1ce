"""The command line as users run it: `monologue up` stops everything it started, `monologue render`
shows progress and writes a playable MP4, `render` and `live` take every session option, `renders …` manages
sessions over the API, and every log line carries the ids it should."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import click
import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import SESSION_OPTIONS, main
from cli.options import given_options, model_options
from cli.stack import Stack, free_port, http_ok
from monologue import __version__, contracts as c, options as options_
from monologue.client import Client
from monologue.schemas import RenderPublic
from tests.conftest import SAMPLES
from tests.helpers import api_key, decode_video, submit, wav_bytes
from tests.local_server import Answer, LocalServer

pytestmark = pytest.mark.slow
MONOLOGUE = [sys.executable, "-m", "cli"]


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
        # A stopping node exits within this plus node.worker.SHUTDOWN_MARGIN_S, whatever its workers do.
        "MONOLOGUE_NODE__GRACEFUL_SHUTDOWN_S": "5",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
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
    deadline = time.monotonic() + 30  # SIGKILL: the children get SIGTERM from the kernel and shut down (≤ 15 s)
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
    # The bars (on stderr; off a TTY only their labels): the chunks rendered, then the bytes downloaded.
    assert "chunks" in completed.stderr and "download" in completed.stderr and "wrote" in completed.stdout
    frames, video_seconds, audio_seconds = decode_video(output.read_bytes())
    assert len(frames) == 172 and abs(video_seconds - audio_seconds) < 0.04


def test_render_command_reports_bad_input_without_a_traceback(api_url: str, tmp_path: Path) -> None:
    not_audio = tmp_path / "notes.txt"
    not_audio.write_text("this is not speech")
    completed = subprocess.run(
        [sys.executable, "-m", "cli", "render", str(SAMPLES / "portrait.jpg"), str(not_audio), "--api", api_url],
        capture_output=True,
        text=True,
        timeout=60,
        env=_with_key(api_url),
    )
    assert completed.returncode == 1
    assert "422" in completed.stderr and "audio" in completed.stderr and "Traceback" not in completed.stderr


def test_render_no_wait_json_takes_url_inputs_and_prints_the_session_at_once(
    api_url: str, sample_portrait: bytes, tmp_path: Path
) -> None:
    """`render URL FILE --no-wait --json`: stdout is the session as made (JSON) and nothing is downloaded; the API
    fetched the portrait from its URL, and the session completes from it. A URL the API refuses is one line."""
    audio, output = tmp_path / "speech.wav", tmp_path / "out.mp4"
    audio.write_bytes(wav_bytes(np.zeros(8_000)))
    runner = CliRunner(env={"MONOLOGUE_API_KEY": api_key(api_url) or ""})
    rest = [str(audio), "--no-wait", "--json", "-o", str(output), "--api", api_url]
    with LocalServer("127.0.0.1") as server:
        server.routes["/face.jpg"] = Answer(body=sample_portrait)
        result = runner.invoke(main, ["render", server.url("/face.jpg"), *rest])
        fetched = [request.path for request in server.received]
    assert result.exit_code == 0, result.output
    session = RenderPublic.model_validate_json(result.stdout)
    assert session.status not in c.TERMINAL and f"render {session.id} started" in result.stderr
    assert fetched == ["/face.jpg"] and not output.exists()
    with Client(api_url, api_key=api_key(api_url)) as client:
        assert client.wait(session.id).status == c.SessionStatus.COMPLETED
    refused = runner.invoke(main, ["render", "http://127.0.0.2:9/face.jpg", *rest])  # not an allowed address
    # A SystemExit: the CLI's one-line error; any other exception would be a traceback in a terminal.
    assert refused.exit_code == 1 and isinstance(refused.exception, SystemExit)
    assert "422" in refused.stderr and "127.0.0.2 is not an allowed destination" in refused.stderr


def test_log_lines_carry_session_workflow_and_chunk_ids(stack: Stack, api_url: str, tmp_path: Path) -> None:
    test_render_command_shows_progress_and_writes_the_video(stack, api_url, tmp_path)
    node_log = (stack.log_dir / "node-test-node.log").read_text().splitlines()
    # Temporal's core writes its own (non-JSON) warnings too, e.g. for heartbeats of a cancelled session.
    node_lines = [json.loads(line) for line in node_log if line.startswith("{")]
    activity_lines = [line for line in node_lines if "activity" in line]
    assert activity_lines
    # Every line names its workflow and what it works on: a session, or an avatar (`prepare_avatar`, when a test
    # on the same stack made one).
    assert all({"workflow_id", "run_id"} <= line.keys() for line in activity_lines)
    assert all(line.keys() & {"session_id", "avatar_id"} for line in activity_lines)
    chunk_lines = [line for line in activity_lines if line["event"] == "chunk done"]
    assert chunk_lines and all(
        {"chunk", "node_id", "context_ms", "audio_to_video_ms", "super_resolution_ms", "encode_ms"} <= line.keys()
        for line in chunk_lines
    )
    api_lines = [json.loads(line) for line in (stack.log_dir / "api.log").read_text().splitlines()]
    started = [line for line in api_lines if line["event"] == "render started"]
    assert started and all({"session_id", "workflow_id", "path"} <= line.keys() for line in started)


def _cli(*args: str, api_url: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A `monologue` command against the test stack's API, with its key."""
    command = [*MONOLOGUE, *args, "--api", api_url]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_with_key(api_url))


def test_version_prints_the_package_version() -> None:
    completed = subprocess.run([*MONOLOGUE, "--version"], capture_output=True, text=True, timeout=30)
    assert completed.returncode == 0 and completed.stdout.strip() == f"monologue, version {__version__}"


def test_an_option_added_to_the_session_model_reaches_render_and_live() -> None:
    """Options are derived from the model's fields: a test-only field appears, typed and bounded, in both."""

    @dataclasses.dataclass(frozen=True)
    class WithExtra(c.RenderOptions):
        mouth_scale: Annotated[float, c.Bounds("Test-only: how wide the mouth opens.", ge=0.5, le=2.0)] = 1.0

    model = options_.request_model(WithExtra)

    @click.command()
    @model_options(model)
    def command(**options: Any) -> None:
        click.echo(json.dumps(given_options(options, model)))

    runner = CliRunner()
    given = runner.invoke(command, ["--mouth-scale", "1.5", "--fps", "30", "--no-preview", "--resolution", "512"])
    assert json.loads(given.output) == {"mouth_scale": 1.5, "fps": 30, "preview": False, "resolution": "512"}
    assert runner.invoke(command, ["--mouth-scale", "3"]).exit_code == 2  # out of the field's bounds
    assert json.loads(runner.invoke(command, []).output) == {}  # nothing given: the server's defaults
    for name in ("render", "live"):
        help_text = runner.invoke(main, [name, "--help"]).output
        assert all(f"--{field.replace('_', '-')}" in help_text for field in SESSION_OPTIONS.model_fields), name


def test_render_command_sends_the_options_it_is_given(stack: Stack, api_url: str, tmp_path: Path) -> None:
    output = tmp_path / "out.mp4"
    given = ["--fps", "20", "--chunk-frames", "20", "--i-frames", "2", "--seed", "7", "--resolution", "512"]
    given += ["--metadata", '{"order": "A-17"}']  # not an option: sent beside them
    audio, portrait = str(SAMPLES / "speech.wav"), str(SAMPLES / "portrait.jpg")
    completed = _cli("render", portrait, audio, "-o", str(output), *given, api_url=api_url, timeout=240)
    assert completed.returncode == 0, completed.stderr
    session_id = completed.stdout.split()[1]  # "render <id> started (…)"
    shown = json.loads(_cli("renders", "show", session_id, api_url=api_url).stdout)
    assert {name: shown["options"][name] for name in ("fps", "chunk_frames", "i_frames", "seed", "resolution")} == {
        "fps": 20,
        "chunk_frames": 20,
        "i_frames": 2,
        "seed": 7,
        "resolution": "512",
    }
    assert shown["status"] == "completed" and (shown["width"], shown["height"]) != (None, None)
    assert shown["metadata"] == {"order": "A-17"}


def test_renders_commands_list_cancel_watch_and_resume_a_session(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    """`watch` (the event stream) ends with status 1 once the session is cancelled; a second cancel is refused
    with the API's message and no traceback."""
    created = submit(api_url, sample_portrait, wav_bytes(np.zeros(16_000 * 120, dtype=np.float32)))
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    listed = _cli("renders", "list", api_url=api_url)
    assert listed.returncode == 0 and session_id in listed.stdout
    cancelled = _cli("renders", "cancel", session_id, api_url=api_url)
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled.stderr
    watched = _cli("renders", "watch", session_id, api_url=api_url)  # follows the event stream
    assert watched.returncode == 1 and "was cancelled" in watched.stderr and "Traceback" not in watched.stderr
    again = _cli("renders", "cancel", session_id, api_url=api_url)
    assert again.returncode == 1 and "409" in again.stderr and "already cancelled" in again.stderr
    as_json = json.loads(_cli("renders", "list", "--status", "cancelled", "--json", api_url=api_url).stdout)
    assert session_id in [render["id"] for render in as_json]
    resumed = _cli("renders", "resume", session_id, api_url=api_url)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
    assert _cli("renders", "cancel", session_id, api_url=api_url).returncode == 0
    assert _cli("renders", "watch", session_id, api_url=api_url).returncode == 1
    missing = _cli("renders", "show", "no-such-session", api_url=api_url)
    assert missing.returncode == 1 and "404" in missing.stderr and "Traceback" not in missing.stderr


def test_migrate_never_prints_the_database_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """`monologue migrate` runs as a Kubernetes Job whose log anyone with read access to the namespace sees."""
    from sqlalchemy.engine import make_url

    from monologue.settings import get_settings
    from tests.helpers import postgres_database

    with postgres_database() as url:
        with_password = make_url(url).set(password="not-for-logs").render_as_string(hide_password=False)
        monkeypatch.setenv("MONOLOGUE_DATABASE_URL", with_password)  # trust auth: the password is not checked
        get_settings.cache_clear()
        try:
            result = CliRunner().invoke(main, ["migrate"])
        finally:
            get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "not-for-logs" not in result.output and "***" in result.output
