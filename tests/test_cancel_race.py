"""A cancel racing a session's completion: the workflow decides how the session ends and the database follows,
so the status, Temporal's workflow status and the video link always agree. Real processes: a stack whose node
pauses inside finalize (with the final MP4 stored, the session not yet completed), so a cancel can land there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from cli.stack import Stack, free_port
from monologue import contracts as c
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from tests.helpers import get, post, register_api, submit

pytestmark = pytest.mark.slow
FINALIZE_PAUSE_S = 3.0

# How each way a session can end shows on the three sides.
AGREEING = {
    c.SessionStatus.COMPLETED: (WorkflowExecutionStatus.COMPLETED, 200),
    c.SessionStatus.CANCELLED: (WorkflowExecutionStatus.CANCELED, 409),
}


@pytest.fixture(scope="module")
def race_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("cancel-race"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id="race-node", finalize_delay_s=FINALIZE_PAUSE_S),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


def test_cancel_while_finalize_runs_leaves_the_session_completed(
    race_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    """Finalize has stored the video when the cancel comes: it finishes, and the session is completed."""
    url = str(race_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    _wait_for_final_video(race_stack, url, session_id)
    assert _status(url, session_id) == c.SessionStatus.RUNNING, "finalize had already finished: no race"
    response = post(f"{url}/v1/renders/{session_id}/cancel", timeout=10)
    assert response.status_code == 202, response.text
    assert _ended_agreeing(race_stack, session_id) == c.SessionStatus.COMPLETED


def test_cancel_just_after_finalize_leaves_the_session_completed(
    race_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    """The cancel reaches Temporal the moment finalize has recorded the video (the API would refuse it by
    then, so it goes to Temporal directly): a finished video is never shown as cancelled."""
    url = str(race_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    _wait_for_final_video(race_stack, url, session_id)
    _wait_until(lambda: _status(url, session_id) == c.SessionStatus.COMPLETED, "finalize records completion", 0.01)
    asyncio.run(_cancel_in_temporal(race_stack.settings, session_id))
    assert _ended_agreeing(race_stack, session_id) == c.SessionStatus.COMPLETED
    assert post(f"{url}/v1/renders/{session_id}/cancel", timeout=10).status_code == 409


def _ended_agreeing(stack: Stack, session_id: str) -> c.SessionStatus:
    """Once the session and its workflow have ended: how, after checking the database, Temporal and the
    video link tell the same story."""
    url = str(stack.settings.api.public_url)
    _wait_until(lambda: _status(url, session_id) in c.TERMINAL, "the session ends")
    workflow_status = asyncio.run(_closed_workflow_status(stack.settings, session_id))
    status = _status(url, session_id)  # read again: the workflow has closed, nothing may change it now
    video = get(f"{url}/v1/renders/{session_id}/video.mp4", timeout=30)
    assert status in AGREEING, status
    assert (workflow_status, video.status_code) == AGREEING[status], (status, workflow_status, video.status_code)
    if status == c.SessionStatus.COMPLETED:
        assert video.content[4:8] == b"ftyp", "the link serves the MP4"
    return status


async def _cancel_in_temporal(settings: Settings, session_id: str) -> None:
    client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace)
    # RPCError: the workflow had already completed, so the cancel came too late: a fine outcome too
    with contextlib.suppress(RPCError):
        await client.get_workflow_handle(c.render_workflow_id(session_id)).cancel()


async def _closed_workflow_status(settings: Settings, session_id: str, timeout_s: float = 60) -> Any:
    client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace)
    handle = client.get_workflow_handle(c.render_workflow_id(session_id))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = (await handle.describe()).status
        if status != WorkflowExecutionStatus.RUNNING:
            return status
        await asyncio.sleep(0.1)
    raise TimeoutError(f"workflow of {session_id} still running after {timeout_s} s")


def _status(url: str, session_id: str) -> str:
    status: str = get(f"{url}/v1/renders/{session_id}", timeout=10).json()["status"]
    return status


def _final_video(stack: Stack, session_id: str) -> Path:
    root = stack.settings.storage.root
    assert root is not None
    return root / "sessions" / session_id / "out" / "final.mp4"


def _wait_for_final_video(stack: Stack, url: str, session_id: str) -> None:
    """Until finalize has stored the video; a session that ended first fails the test with its status and error,
    and a wait that runs out says where the session was (and the node's last log lines)."""
    _wait_until(
        lambda: _final_video(stack, session_id).exists() or _status(url, session_id) in c.TERMINAL,
        "the final MP4 is stored",
        explain=lambda: f"{get(f'{url}/v1/renders/{session_id}', timeout=10).text}\n{_node_log_tail(stack)}",
    )
    assert _final_video(stack, session_id).exists(), get(f"{url}/v1/renders/{session_id}", timeout=10).text


def _node_log_tail(stack: Stack, lines: int = 30) -> str:
    log = stack.log_dir / "node-race-node.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no node log)"


def _wait_until(
    condition: Any, what: str, poll_s: float = 0.05, timeout_s: float = 240, explain: Any = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"waited {timeout_s} s for: {what}\n{explain()}")
