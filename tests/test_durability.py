"""Sessions survive lost nodes, and can be cancelled and resumed: real processes, real SIGKILLs.

A separate stack with two nodes, a 3-second lease timeout (so a lost node is noticed quickly) and a
small delay in every chunk (so a node can be killed in the middle of one)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.live_stream import start_session, stream_live
from cli.stack import Stack, free_port
from monologue import contracts as c
from monologue.plan import plan_chunks, timeline_order
from monologue.settings import ApiSettings, NodeSettings, RenderDefaults, Settings, TemporalSettings
from tests.conftest import SAMPLES
from tests.helpers import api_key, get, node_of, post, register_api, stream, submit, wait_done, ws_connect

pytestmark = pytest.mark.slow
NODES = ("node-a", "node-b")


@pytest.fixture(scope="module")
def durable_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("durable"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id=NODES[0], lease_timeout_s=3.0, chunk_delay_s=0.4, graceful_shutdown_s=10.0),
        # Continue-as-new every two chunks, so every test here also crosses workflow runs.
        render=RenderDefaults(continue_as_new_every=2, live_idle_timeout_s=3.0),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    stack.start_node(NODES[1])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def baseline(durable_stack: Stack, sample_portrait: bytes, sample_speech: bytes) -> dict[str, Any]:
    """An uninterrupted render: what every interrupted one must reproduce, frame for frame."""
    url = str(durable_stack.settings.api.public_url)
    render = wait_done(url, submit(url, sample_portrait, sample_speech).json()["id"])
    assert render["status"] == "completed", render["error"]
    assert render["options"]["lip_sync"] == "visemes"  # so every kill, resume and live test here covers visemes
    return {"render": render, "hashes": _hashes(durable_stack, render["id"])}


def _out(stack: Stack, session_id: str) -> Path:
    root = stack.settings.storage.root
    assert root is not None
    return root / "sessions" / session_id / "out"


def _hashes(stack: Stack, session_id: str) -> list[str]:
    return [json.loads(line)["sha256"] for line in (_out(stack, session_id) / "frames.jsonl").read_text().splitlines()]


def _node_process(stack: Stack, node_id: str) -> Any:
    return next(
        child.process for child in stack.children if child.name == f"node-{node_id}" and child.process.poll() is None
    )


def _wait_for(url: str, session_id: str, condition: Any, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        render: dict[str, Any] = get(f"{url}/v1/renders/{session_id}", timeout=10).json()
        render["node_id"] = node_of(url, session_id)  # the operator's view: tenants' answers do not name nodes
        if condition(render):
            return render
        time.sleep(0.05)
    raise TimeoutError(f"render {session_id} never reached the condition")


@pytest.mark.parametrize("position", [0, 1, 2, 4], ids=["first-N0", "N1", "I0", "last-I1"])
def test_node_killed_mid_chunk_another_node_finishes_with_identical_frames(
    position: int, durable_stack: Stack, baseline: dict[str, Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    # Chunk `position` (in generation order N0 N1 I0 N2 I1) is running once `position` chunks are done.
    # (">=": if a slow poll misses the exact moment, the kill still lands in a later chunk, never after the end.)
    running = _wait_for(url, session_id, lambda r: r["node_id"] and _running_from(r, position))
    victim = running["node_id"]
    _node_process(durable_stack, victim).send_signal(signal.SIGKILL)
    try:
        render = wait_done(url, session_id, timeout_s=120)
    finally:
        durable_stack.start_node(victim)  # the next test has two nodes again
    assert render["status"] == "completed", render["error"]
    assert node_of(url, session_id) != victim
    assert _hashes(durable_stack, session_id) == baseline["hashes"]
    frames = render["progress"]["frames_total"]
    expected = {f"seg-{s.kind}{s.index:05d}.m4s" for s in timeline_order(plan_chunks(frames, n_frames=40, i_frames=4))}
    assert {p.name for p in _out(durable_stack, session_id).glob("seg-*.m4s")} == expected  # none missing, none extra


def test_cancel_stops_the_render_and_keeps_what_was_published(
    durable_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    # N0 is done (the first chunk in generation order): a cancel closes the stream with every chunk already made,
    # however far the workflow had heard (tests/activities/test_record_status.py), so N0 is in it.
    _wait_for(url, session_id, lambda r: r["progress"]["chunks_done"] >= 1)
    response = post(f"{url}/v1/renders/{session_id}/cancel", timeout=10)
    assert response.status_code == 202
    render = _wait_for(url, session_id, lambda r: r["status"] in ("cancelled", "completed", "failed"), timeout_s=30)
    assert render["status"] == "cancelled"
    assert render["progress"]["chunks_done"] < render["progress"]["chunks_total"]
    playlist = get(render["links"]["stream"], timeout=10).text
    assert playlist.rstrip().endswith("#EXT-X-ENDLIST") and "seg-N00000.m4s" in playlist
    assert post(f"{url}/v1/renders/{session_id}/cancel", timeout=10).status_code == 409


def test_a_cancelled_render_resumes_from_its_checkpoint_to_the_same_frames(
    durable_stack: Stack, baseline: dict[str, Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    _wait_for(url, session_id, lambda r: r["progress"]["chunks_done"] >= 2)
    post(f"{url}/v1/renders/{session_id}/cancel", timeout=10)
    cancelled = _wait_for(url, session_id, lambda r: r["status"] == "cancelled", timeout_s=30)
    done_before = cancelled["progress"]["chunks_done"]
    assert post(f"{url}/v1/renders/{session_id}/resume", timeout=10).status_code == 202
    render = wait_done(url, session_id, timeout_s=120)
    assert render["status"] == "completed", render["error"]
    assert _hashes(durable_stack, session_id) == baseline["hashes"]
    assert render["progress"]["chunks_done"] == render["progress"]["chunks_total"] > done_before
    assert post(f"{url}/v1/renders/{session_id}/resume", timeout=10).status_code == 409


def test_events_stream_progress_until_the_render_ends(
    durable_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    seen: list[dict[str, Any]] = []
    with stream("GET", f"{url}/v1/renders/{session_id}/events", timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line.removeprefix("data: ")))
    assert seen[-1]["status"] == "completed"
    done = [event["progress"]["chunks_done"] for event in seen]
    assert done == sorted(done) and len(set(done)) >= 3  # progress arrived step by step
    assert node_of(url, session_id) in NODES and "node_id" not in seen[-1]


def test_a_node_told_to_stop_hands_its_session_over(
    durable_stack: Stack, baseline: dict[str, Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    """SIGTERM (a deploy): the node ends its lease with NodeDraining at once, so the session moves without
    waiting for the lease to time out, and the frames are still the same."""
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    running = _wait_for(url, session_id, lambda r: r["node_id"] and _running_from(r, 1))
    node_id = running["node_id"]
    _node_process(durable_stack, node_id).send_signal(signal.SIGTERM)
    try:
        render = wait_done(url, session_id, timeout_s=120)
    finally:
        _node_process_wait(durable_stack, node_id)
        durable_stack.start_node(node_id)
    assert render["status"] == "completed" and node_of(url, session_id) != node_id
    assert _hashes(durable_stack, session_id) == baseline["hashes"]
    log = (durable_stack.log_dir / f"node-{node_id}.log").read_text()
    assert "node draining: handing the session back" in log


def test_sessions_beyond_capacity_wait_and_never_share_a_node(
    durable_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(durable_stack.settings.api.public_url)
    ids = [submit(url, sample_portrait, sample_speech).json()["id"] for _ in range(3)]
    renders = [wait_done(url, session_id, timeout_s=180) for session_id in ids]
    assert [render["status"] for render in renders] == ["completed"] * 3
    # From the nodes' lease logs: each node (capacity 1) held at most one of these sessions at any moment.
    # (Sessions here continue as new every two chunks and take a lease again each time, possibly elsewhere.)
    acquired: set[str] = set()
    for node_id in NODES:
        held: set[str] = set()
        for line in (durable_stack.log_dir / f"node-{node_id}.log").read_text().splitlines():
            if not line.startswith("{"):  # Temporal's core writes its own (non-JSON) warnings too
                continue
            event = json.loads(line)
            if event.get("session_id") not in ids or event.get("logger", "lease") != "lease":
                continue
            if event["event"] == "node acquired":
                held.add(event["session_id"])
                acquired.add(event["session_id"])
                assert len(held) <= 1, f"{node_id} held {held} at once"
            elif event["event"] in ("node released", "node draining: handing the session back"):
                held.discard(event["session_id"])
    # The check above read every session's leases (an empty or renamed log would pass it unread).
    assert acquired == set(ids)


@pytest.mark.parametrize("service", ["temporal", "api"])
def test_a_session_survives_a_restart_of(
    service: str, durable_stack: Stack, baseline: dict[str, Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    _wait_for(url, session_id, lambda r: r["progress"]["chunks_done"] >= 1)
    durable_stack.restart(service)  # Temporal keeps its state in its SQLite file
    render = wait_done(url, session_id, timeout_s=120)
    assert render["status"] == "completed", render["error"]
    assert _hashes(durable_stack, session_id) == baseline["hashes"]


async def test_recorded_histories_replay_deterministically(durable_stack: Stack, baseline: dict[str, Any]) -> None:
    """Every finished session's history replays against today's workflow code without a nondeterminism error."""
    from temporalio.client import Client
    from temporalio.worker import Replayer

    from workflows.render import RenderWorkflow

    client = await Client.connect(durable_stack.settings.temporal.address)
    histories = client.list_workflows("WorkflowType = 'RenderWorkflow' AND ExecutionStatus != 'Running'")
    replayer = Replayer(workflows=[RenderWorkflow])
    results = await replayer.replay_workflows(histories.map_histories(), raise_on_replay_failure=False)
    assert results.replay_failures == {}
    assert len([history async for history in client.list_workflows("WorkflowType = 'RenderWorkflow'")]) >= 1


async def test_every_run_has_the_short_workflow_task_timeout(durable_stack: Stack, baseline: dict[str, Any]) -> None:
    """A session's workflow runs, first and continued (every 2 chunks here), give a task lost to a Temporal restart
    to a node again after c.WORKFLOW_TASK_TIMEOUT_S, not the server's 10 s."""
    from temporalio.client import Client

    client = await Client.connect(durable_stack.settings.temporal.address)
    runs = client.list_workflows("WorkflowType = 'RenderWorkflow'")
    started = [history.events[0].workflow_execution_started_event_attributes async for history in runs.map_histories()]
    assert any(run.continued_execution_run_id for run in started)  # continued runs are among them
    assert {run.workflow_task_timeout.ToTimedelta().total_seconds() for run in started} == {c.WORKFLOW_TASK_TIMEOUT_S}


def _running_from(render: dict[str, Any], position: int) -> bool:
    """At least `position` chunks done and the render not finished: chunk `position` or a later one runs."""
    progress = render["progress"]
    return render["status"] == "running" and position <= progress["chunks_done"] < (progress["chunks_total"] or 0)


def _node_process_wait(stack: Stack, node_id: str) -> None:
    for child in stack.children:
        if child.name == f"node-{node_id}":
            child.process.wait(timeout=60)


def test_continue_as_new_changes_no_frame(
    durable_stack: Stack, stack: Stack, baseline: dict[str, Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    """The durable stack continues as new every 2 chunks, the default stack every 500: same frames."""
    url = str(stack.settings.api.public_url)
    render = wait_done(url, submit(url, sample_portrait, sample_speech).json()["id"])
    assert render["status"] == "completed"
    assert _hashes(stack, render["id"]) == baseline["hashes"]


async def test_sessions_are_findable_by_status_node_and_tenant(durable_stack: Stack, baseline: dict[str, Any]) -> None:
    from temporalio.client import Client

    client = await Client.connect(durable_stack.settings.temporal.address)
    node = node_of(str(durable_stack.settings.api.public_url), baseline["render"]["id"])
    query = f"MonologueStatus = 'completed' AND MonologueNode = '{node}' AND MonologueTenant = 'local'"
    found = {execution.id async for execution in client.list_workflows(query)}
    assert f"render-{baseline['render']['id']}" in found


def test_a_failed_render_resumes_from_its_last_checkpoint(
    durable_stack: Stack, baseline: dict[str, Any], sample_portrait: bytes, sample_speech: bytes
) -> None:
    """Storage loses the audio mid-render: chunks retry with backoff, run out of attempts, and the render
    fails with the reason. Once the audio is back, resume finishes it with the same frames."""
    url = str(durable_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    _wait_for(url, session_id, lambda r: r["progress"]["chunks_done"] >= 2)
    audio = _out(durable_stack, session_id).parent / "input" / "audio.wav"
    kept = audio.read_bytes()
    audio.unlink()
    failed = _wait_for(url, session_id, lambda r: r["status"] in ("failed", "completed"), timeout_s=120)
    assert failed["status"] == "failed" and "audio.wav" in failed["error"]
    done_before = failed["progress"]["chunks_done"]
    audio.write_bytes(kept)
    assert post(f"{url}/v1/renders/{session_id}/resume", timeout=10).status_code == 202
    render = wait_done(url, session_id, timeout_s=120)
    assert render["status"] == "completed", render["error"]
    assert render["progress"]["chunks_done"] > done_before
    assert _hashes(durable_stack, session_id) == baseline["hashes"]


def test_a_live_session_survives_its_node_being_killed_with_identical_frames(
    durable_stack: Stack, baseline: dict[str, Any]
) -> None:
    """Speech streamed in real time; the node holding the session is SIGKILLed mid-stream; the other node
    takes over from the checkpoint and the stored audio pieces, and the frames match the render's."""
    url = str(durable_stack.settings.api.public_url)
    reports: list[Any] = []
    streamer = threading.Thread(
        target=lambda: reports.append(
            stream_live(
                url,
                SAMPLES / "portrait.jpg",
                SAMPLES / "speech.wav",
                options={"first_chunk_frames": 40},
                api_key=api_key(url),
            )
        )
    )
    streamer.start()
    session_id = _wait_for_live_session(url)
    running = _wait_for(url, session_id, lambda r: r["node_id"] and r["progress"]["chunks_done"] >= 2)
    victim = running["node_id"]
    _node_process(durable_stack, victim).send_signal(signal.SIGKILL)
    try:
        streamer.join(timeout=180)
    finally:
        durable_stack.start_node(victim)
    (report,) = reports
    session = report.session
    assert session["status"] == "completed", session["error"]
    assert node_of(url, session_id) != victim and not report.errors
    assert _hashes(durable_stack, session_id) == baseline["hashes"]


def test_a_live_session_with_no_audio_for_the_idle_timeout_ends_with_what_it_has(durable_stack: Stack) -> None:
    url = str(durable_stack.settings.api.public_url)
    session = start_session(url, SAMPLES / "portrait.jpg", api_key=api_key(url))
    pcm = np.zeros(16_000, dtype="<i2")  # one second, then silence on the wire
    with ws_connect(session["links"]["audio"]) as socket:
        socket.send(pcm.tobytes())
        messages = [json.loads(m) for m in socket]  # the server ends the stream after 3 s without audio
    assert messages[-1]["type"] == "ended" and "no audio for 3 s" in messages[-1]["message"]
    render = wait_done(url, session["id"], timeout_s=60)
    assert render["status"] == "completed" and render["progress"]["frames_total"] == 25


def _wait_for_live_session(url: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = get(f"{url}/v1/renders", timeout=10).json()["items"]
        live = [item for item in items if item["kind"] == "live" and item["status"] not in ("completed", "failed")]
        if live:
            return str(live[0]["id"])
        time.sleep(0.05)
    raise TimeoutError("no live session started")


def test_a_cancelled_live_session_resumes_to_a_video_of_the_audio_it_received(
    durable_stack: Stack, baseline: dict[str, Any]
) -> None:
    """Cancel a live session mid-stream: the socket is closed with a clear error, what arrived is kept; a
    resume turns exactly that audio into a complete video whose frames are the render's (a prefix)."""
    url = str(durable_stack.settings.api.public_url)
    session = start_session(url, SAMPLES / "portrait.jpg", options={"first_chunk_frames": 40}, api_key=api_key(url))
    pcm = np.frombuffer((SAMPLES / "speech.wav").read_bytes()[44:], dtype="<i2")
    from websockets.exceptions import ConnectionClosed

    messages: list[dict[str, Any]] = []
    with ws_connect(session["links"]["audio"]) as socket:
        try:
            for offset in range(0, len(pcm), 1600):  # 0.1 s messages in real time until the cancel lands
                socket.send(pcm[offset : offset + 1600].tobytes())
                messages.append(json.loads(socket.recv(timeout=5)))
                if offset == 16_000 * 3:
                    assert post(f"{url}/v1/renders/{session['id']}/cancel", timeout=10).status_code == 202
                time.sleep(0.1)
            # All audio sent before the refusal: it must still come (the socket re-checks its session every
            # MONOLOGUE_API__KEY_RECHECK_S), and a socket left open fails here with TimeoutError.
            while True:
                messages.append(json.loads(socket.recv(timeout=15)))
        except ConnectionClosed:  # the server closed the socket; what it sent before is still queued
            while True:
                try:
                    messages.append(json.loads(socket.recv(timeout=5)))
                except ConnectionClosed:
                    break
    # The refusal of a cancelled session, not a crash (1011) or a normal end (1000).
    assert socket.close_code == 4409, (socket.close_code, messages[-3:])
    refusal = messages[-1]
    assert refusal["type"] == "error", messages[-3:]
    assert f"{session['id']} is cancelled" in refusal["message"] or "no longer running" in refusal["message"]
    cancelled = _wait_for(url, session["id"], lambda r: r["status"] in ("cancelled", "failed", "completed"))
    assert cancelled["status"] == "cancelled"
    assert post(f"{url}/v1/renders/{session['id']}/resume", timeout=10).status_code == 202
    resumed = wait_done(url, session["id"], timeout_s=120)
    assert resumed["status"] == "completed", resumed["error"]
    frames = resumed["progress"]["frames_total"]
    assert 75 <= frames < len(baseline["hashes"])  # at least the 3 s sent before the cancel, not all 6.9 s
    hashes = _hashes(durable_stack, session["id"])
    # The final seam and N chunk are shorter than the render's (the audio ends sooner); every frame before
    # them is the render's.
    timeline = timeline_order(plan_chunks(frames, n_frames=40, i_frames=4))
    same_until = timeline[-2].first_frame if timeline[-2].kind == "I" else timeline[-1].first_frame
    assert same_until >= 40 and hashes[:same_until] == baseline["hashes"][:same_until]


def test_an_interrupted_live_session_survives_its_node_being_killed_with_identical_frames(
    durable_stack: Stack,
) -> None:
    """Barge-in is recorded with the audio (a stored cut): a session interrupted mid-utterance whose node is SIGKILLed
    after the interrupt makes, on the other node, the frames of the same session left alone."""
    from monologue.client import Client
    from monologue.media import normalise_audio
    from tests.test_live_interrupt import _loud, _signals

    url = str(durable_stack.settings.api.public_url)
    wav = normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav
    speech = np.frombuffer(wav[44:], dtype="<i2")[: 3 * 16_000]
    hashes, victims = [], []
    for kill in (False, True):
        with Client(url, api_key=api_key(url)) as client:
            session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc"})
            options = c.render_options(session.options.model_dump(mode="json"))
            pairs = [(stored, at) for stored, at in _signals(options, 2 * 16_000) if _loud(speech, at)]
            stored, _ = max(pairs, key=lambda pair: pair[0] - pair[1])
            report = client.stream_audio(session, speech.tobytes(), speed=0, interrupt_at_s=stored / 16_000)
            assert report.interrupted is not None and report.interrupted["dropped"] > 0
            if kill:
                running = _wait_for(url, session.id, lambda r: r["node_id"] and r["progress"]["chunks_done"] >= 2)
                victims.append(running["node_id"])
                _node_process(durable_stack, running["node_id"]).send_signal(signal.SIGKILL)
            try:
                done = client.wait(session.id, timeout_s=180)
            finally:
                if kill:
                    durable_stack.start_node(victims[0])
        assert done.status == "completed", done.error
        hashes.append(_hashes(durable_stack, session.id))
    assert node_of(url, session.id) != victims[0]
    assert hashes[0] == hashes[1]
