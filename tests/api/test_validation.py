"""Uploads are decoded and checked on a node (`validate_inputs`), not in the API: the API stages the raw files,
waits for the check, and keeps only the normalised inputs; with no node to check them it answers 503 and
keeps nothing."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from cli.stack import Stack
from tests.helpers import api_headers, get, post, submit, workflow_count

pytestmark = pytest.mark.slow


def _session_folders(stack: Stack) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    return sorted(path.name for path in (root / "sessions").iterdir()) if (root / "sessions").exists() else []


def _session_ids(api_url: str) -> list[str]:
    """The sessions there are (ids only: earlier tests' sessions may still be changing status meanwhile)."""
    return [item["id"] for item in get(f"{api_url}/v1/renders", params={"limit": 200}).json()["items"]]


@pytest.mark.parametrize("path", ["/v1/renders", "/v1/sessions"])
def test_uploads_no_node_checks_in_time_are_503_and_leave_nothing(
    path: str, stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    """The API in process, on the stack's database, storage and Temporal, but a task queue no node polls."""
    settings = stack.settings.model_copy(
        update={
            "temporal": stack.settings.temporal.model_copy(update={"task_queue": f"unpolled-{uuid.uuid4().hex}"}),
            # No Temporal SDK metrics port in this process: the shared stack's API process holds that one.
            "api": stack.settings.api.model_copy(update={"validate_timeout_s": 1.5, "temporal_metrics_port": None}),
        }
    )
    files = {"portrait": ("p.jpg", sample_portrait)}
    if path == "/v1/renders":
        files["audio"] = ("s.wav", sample_speech)
    before = _session_folders(stack), _session_ids(api_url)
    renders = workflow_count(stack.settings)
    with TestClient(create_app(settings), base_url=str(settings.api.public_url)) as client:
        response = client.post(path, files=files, headers=api_headers(api_url))
    assert response.status_code == 503, response.text
    assert "MONOLOGUE_API__VALIDATE_TIMEOUT_S" in response.json()["detail"] and response.headers["retry-after"]
    assert (_session_folders(stack), _session_ids(api_url)) == before
    assert workflow_count(stack.settings) == renders


def test_a_checked_session_keeps_only_its_normalised_inputs(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    """The raw uploads (a photo's metadata included) are gone once the node has stored their normalised forms."""
    created = submit(api_url, sample_portrait, sample_speech)
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    post(f"{api_url}/v1/renders/{session_id}/cancel", timeout=30)
    root = stack.settings.storage.root
    assert root is not None
    folder = root / "sessions" / session_id
    assert (folder / "input" / "portrait.png").exists() and (folder / "input" / "audio.wav").exists()
    assert not (folder / "upload").exists()
    assert created.json()["width"] and created.json()["audio_seconds"] == pytest.approx(6.87, abs=0.01)
