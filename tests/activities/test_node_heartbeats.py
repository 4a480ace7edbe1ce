"""The node's pinned activities heartbeat from the pipeline's progress, and only from it: a chunk that stops
advancing stops heartbeating (so its session moves), and so do the chunks queued behind it. The one exception, a
known long step (a load), beats from a helper thread, up to its limit. Real storage, a real database and the real
warp family, in Temporal's ActivityEnvironment (which records the heartbeats)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import ChunkHeartbeat, long_step
from activities.node import NodeActivities
from activities.pipelines import Pipelines, PipelineSlot
from monologue import contracts as c
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.storage import LocalStore
from tests.helpers import stored_session

OPTIONS = c.RenderOptions(chunk_frames=8, i_frames=2)


def _run(fn: Any, *args: Any) -> tuple[Any, list[str]]:
    """Run `fn` as an activity; its result and the details of every heartbeat it sent."""
    beats: list[str] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(str(details[0]))
    return env.run(fn, *args), beats


@pytest.fixture
def node(tmp_path: Path) -> NodeActivities:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    sessions = make_sessionmaker(make_engine(url))
    store = LocalStore(tmp_path / "objects")
    stored_session(sessions, store)
    return NodeActivities(store=store, sessions=sessions, node_id="n")


def test_a_chunk_heartbeats_from_every_stage_while_it_runs(node: NodeActivities) -> None:
    _, setting_up = _run(node.init_session, c.InitSessionInput(session_id="s", node_id="n", options=OPTIONS))
    assert setting_up[0] == "loading the warp family" and setting_up[-1] == "init_session encoding the reference"
    request = c.GenerateChunkInput(session_id="s", node_id="n", options=OPTIONS, chunk=c.Chunk(c.ChunkKind.N, 0, 0, 8))
    result, beats = _run(node.generate_chunk, request)
    assert result.frames == 8
    assert beats == [
        "N0 context",
        "N0 audio_to_video",
        "N0 super_resolution",
        "N0 decode_publish",
        "N0 checkpoint",
        "N0 encoding",
        "N0 storing",
    ]


def test_chunks_queued_behind_a_hung_chunk_stop_heartbeating_with_it() -> None:
    """A waiter beats while the chunk holding the pipeline advances; once that one hangs, so does the waiter's
    heartbeat, and both time out (a timer would keep the waiter, and its session, looking alive)."""
    slot = PipelineSlot()
    held, counts = threading.Event(), {}
    beats: list[str] = []

    def hung_holder() -> None:
        with slot.hold("N0"):
            held.set()
            for _ in range(3):  # progress, then a hang
                slot.touch()
                time.sleep(0.1)
            time.sleep(0.3)  # the waiter has seen the last report
            counts["at_hang"] = len(beats)
            time.sleep(1.5)  # hung: several of the waiter's polls
            counts["after"] = len(beats)

    holder = threading.Thread(target=hung_holder)
    holder.start()
    held.wait(timeout=5)
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(str(details[0]))

    def wait_for_the_slot() -> None:
        with slot.hold("N1"):
            pass

    env.run(wait_for_the_slot)
    holder.join()
    assert counts["at_hang"] >= 2  # it beat while the holder advanced
    assert counts["after"] == counts["at_hang"]  # and not while it hung
    assert set(beats) == {"N1: waiting for N0"}


def test_loading_a_family_heartbeats_until_it_is_loaded() -> None:
    def slow_factory(family: str) -> Any:
        time.sleep(1.5)  # weights from disk: one long call with no steps to report
        return object()

    pipelines = Pipelines(slow_factory)
    _, beats = _run(pipelines.get, "toy")
    assert len(beats) >= 2 and set(beats) == {"loading the toy family"}
    assert _run(pipelines.get, "toy")[1] == []  # built once


def test_a_known_long_step_beats_and_tells_the_slot_until_it_ends() -> None:
    """A load with nothing to report (here one that only waits) beats from a helper thread and tells the pipeline
    slot of each beat, so the chunks queued behind it stay alive too; the beats end with the step."""
    reports: list[int] = []
    heartbeat = ChunkHeartbeat("N3", on_report=lambda: reports.append(1))

    def stalled_load() -> int:
        with heartbeat.long_step("loading checkpoints", limit_s=600):
            _wait_for(lambda: len(reports) >= 3)
        return len(reports)

    reported_in_step, beats = _run(stalled_load)
    assert set(beats) == {"N3 loading checkpoints"} and len(beats) >= 3
    assert len(reports) == reported_in_step  # nothing beat after the step


def test_a_known_long_step_past_its_limit_beats_no_more() -> None:
    """A load that hangs is still caught: past its limit the helper stops and the heartbeat timeout does the rest."""

    def hung_load() -> None:
        with long_step("loading the toy family", limit_s=0.0):
            _wait_for(lambda: not any(thread.name == "long-step" for thread in threading.enumerate()))

    assert _run(hung_load)[1] == ["loading the toy family"]


def _wait_for(condition: Any, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {deadline_s} s")
        time.sleep(0.02)


def test_a_chunk_of_an_unknown_kind_is_refused_not_guessed() -> None:
    """The one chunk type takes N or I only (anything else was silently made an N chunk before)."""
    with pytest.raises(ValueError, match="'X' is not a valid ChunkKind"):
        c.Chunk("X", 0, 0, 8)  # type: ignore[arg-type]
    assert c.Chunk("I", 0, 40, 4).kind is c.ChunkKind.I  # type: ignore[arg-type]
