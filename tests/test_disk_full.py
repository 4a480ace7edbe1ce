"""A node's disk fills up mid-session (issue 28, item 4), through the real stack: Temporal's dev server, PostgreSQL,
SeaweedFS, an API process and two nodes (cli/cluster.py). Node n1's scratch folder is a tmpfs of 128 KiB, smaller
than the render's final MP4 (about 150 KiB), so its finalize runs out of room: the activity fails with NodeDiskFull
naming the disk, n1 takes no session while its disk has no more room than then (its /readyz says why), and the session
moves to n2, where it completes with a clean render's frames, each segment listed once and the final video whole,
while the API answers it normally throughout. Once n1's disk grows, n1 is ready again.

n1 is the cluster's only node when the session starts, so the session goes there; n2 joins once n1's disk is full.
States are awaited with deadlines, never guessed with sleeps."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from cli.benches.cluster import hashes, playlist_problems, speech, submit
from cli.cluster import Cluster, Shape, cluster
from cli.seaweed import seaweed_process
from cli.stack import free_port
from monologue import SAMPLES, contracts as c, keys
from monologue.settings import Settings
from tests.helpers import grow_tmpfs, node_of, poll, postgres_database, tmpfs

SHAPE = Shape(apis=1, nodes=1, capacity=1)
SPEECH_S = 2.0  # its final MP4 is about 150 KiB
SCRATCH_SIZE = "128k"
MIN_FREE_MB = "0.05"  # n1 starts ready (128 KiB free), the failed write's room aside
DEADLINE_S = 120.0  # what any awaited state may take on a loaded two-core machine
TERMINAL = {str(status) for status in c.TERMINAL}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_whose_disk_fills_up_in_finalize_hands_the_session_to_another_node(tmp_path: Path) -> None:
    scratch = tmp_path / "n1-scratch"

    def small_scratch(settings: Settings, node_id: str) -> dict[str, str]:
        return {"MONOLOGUE_NODE__SCRATCH_DIR": str(scratch), "MONOLOGUE_NODE__MIN_FREE_SCRATCH_MB": MIN_FREE_MB}

    with (
        tmpfs(scratch, SCRATCH_SIZE),
        seaweed_process(tmp_path / "s3") as weed,
        postgres_database() as database_url,
        cluster(tmp_path / "cluster", database_url, weed.server, SHAPE, node_env=small_scratch) as running,
    ):
        audio = speech(tmp_path, SPEECH_S)
        session_id = submit(running, 0, SAMPLES / "portrait.jpg", audio)
        full = _node_event(running, "disk full", session_id)
        assert full["node_id"] == "n1" and full["error"].endswith(": finalize"), full
        assert f"node n1: no space left on {scratch} (scratch, " in full["error"], full
        status, body = _readyz(running, "n1")
        assert status == 503 and f"scratch {scratch} filled up" in body["problems"]["disk"], body
        _join(running, "n2")
        done = poll(running.api_urls[0], session_id, _ended, timeout_s=DEADLINE_S, api_key=running.api_key)
        assert (done["status"], done["error"]) == ("completed", None), done
        assert node_of(running.api_urls[0], session_id, api_key=running.api_key) == "n2"
        reference = submit(running, 0, SAMPLES / "portrait.jpg", audio)  # n1 still takes none: on n2
        clean = poll(running.api_urls[0], reference, _ended, timeout_s=DEADLINE_S, api_key=running.api_key)
        assert clean["status"] == "completed", clean
        _check_session(running, session_id, hashes(running, reference))
        failures = asyncio.run(_activity_failures(running, session_id))
        assert [(kind, error_type) for kind, error_type, _ in failures] == [(c.FINALIZE, c.NODE_DISK_FULL)], failures
        assert f"no space left on {scratch}" in failures[0][2]
        assert _acquired(running) == [("n1", session_id), ("n2", session_id), ("n2", reference)]
        grow_tmpfs(scratch, "1m")
        _until(lambda: _readyz(running, "n1")[0] == 200, "n1 ready again once its disk grew")


def _ended(session: dict[str, Any]) -> bool:
    return session["status"] in TERMINAL


def _check_session(running: Cluster, session_id: str, reference: list[str]) -> None:
    """The clean render's frames, each stored segment listed once, the final video whole."""
    assert hashes(running, session_id) == reference, "frames differ from the clean render"
    assert playlist_problems(running, session_id) == []
    listed = [line for line in running.object(keys.playlist(session_id)).decode().splitlines() if line[:4] == "seg-"]
    segments = b"".join(running.object(keys.output(session_id, name)) for name in listed)
    assert running.object(keys.final_video(session_id)) == running.object(keys.init_segment(session_id)) + segments


def _node_event(running: Cluster, event: str, session_id: str) -> dict[str, Any]:
    """The first line a node logged as `event` for the session, once there is one."""

    def logged() -> list[dict[str, Any]]:
        return [entry for entry in running.node_events(event) if entry.get("session_id") == session_id]

    _until(lambda: bool(logged()), f"a node logging {event!r} for {session_id}")
    return logged()[0]


def _acquired(running: Cluster) -> list[tuple[str, str]]:
    """(node, session) of every lease a node took, in order."""
    return [(e["node_id"], e["session_id"]) for e in running.lease_events() if e["event"] == "node acquired"]


def _readyz(running: Cluster, node_id: str) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(f"http://127.0.0.1:{running.node_ports[node_id]}/readyz", timeout=5)
    return answer.status_code, answer.json()


def _join(running: Cluster, node_id: str) -> None:
    """Start another node (its scratch on the system's disk) and wait until it is ready."""
    port = free_port()
    running.stack.start_node(node_id, env={"MONOLOGUE_NODE__HTTP_PORT": str(port)})
    running.node_ports[node_id] = port
    _until(lambda: running.ready(f"node-{node_id}"), f"{node_id} ready")


async def _activity_failures(running: Cluster, session_id: str) -> list[tuple[str, str, str]]:
    """(activity, error type, message) of every activity attempt of the session's workflow that failed."""
    client = await Client.connect(running.settings.temporal.address)
    handle = client.get_workflow_handle(c.render_workflow_id(session_id))
    scheduled: dict[int, str] = {}
    failures = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            attributes = event.activity_task_failed_event_attributes
            failure = attributes.failure
            kind = failure.application_failure_info.type
            failures.append((scheduled[attributes.scheduled_event_id], kind, failure.message))
    return failures


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {DEADLINE_S:.0f} s")
