"""`DELETE /v1/renders/{id}` and `/v1/sessions/{id}` on the embedded stack (SQLite, local storage): only the key's
tenant may delete; a finished render and a running live session (cancelled first) lose every file, their ids answer
410 afterwards and a second DELETE 204 again. The same removal on PostgreSQL and S3:
tests/monologue/test_lifecycle.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from temporalio.client import WorkflowExecutionStatus

from cli.stack import Stack
from monologue import apikeys, contracts as c
from monologue.db import make_engine, make_sessionmaker
from monologue.temporal_client import connect
from tests.helpers import api_headers, get, post, submit, wait_done


def delete(url: str) -> httpx.Response:
    return httpx.delete(url, headers=api_headers(url), timeout=60)


def _files(stack: Stack, session_id: str) -> list[Path]:
    root = stack.settings.storage.root
    assert root is not None
    return sorted(path for path in (root / "sessions" / session_id).rglob("*") if path.is_file())


def _other_tenants_key(stack: Stack) -> str:
    engine = make_engine(stack.settings.db_url)
    try:
        with make_sessionmaker(engine)() as db:
            return apikeys.create_key(db, tenant="someone-else")[1]
    finally:
        engine.dispose()


def test_a_deleted_render_loses_its_files_answers_410_and_deletes_again(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    created = submit(api_url, sample_portrait, sample_speech)
    assert created.status_code == 201, created.text
    render = wait_done(api_url, created.json()["id"])
    session_id = render["id"]
    assert render["status"] == "completed" and _files(stack, session_id)

    other = {"Authorization": f"Bearer {_other_tenants_key(stack)}"}
    assert httpx.delete(f"{api_url}/v1/renders/{session_id}", headers=other, timeout=30).status_code == 404
    assert _files(stack, session_id)  # another tenant's DELETE touched nothing

    assert delete(f"{api_url}/v1/renders/{session_id}").status_code == 204
    assert _files(stack, session_id) == []
    gone = get(f"{api_url}/v1/renders/{session_id}", timeout=10)
    assert gone.status_code == 410 and "was deleted" in gone.json()["detail"]
    assert get(f"{api_url}/v1/renders/{session_id}/video.mp4", timeout=10).status_code == 410
    listed = get(f"{api_url}/v1/renders", params={"limit": 200}, timeout=10).json()["items"]
    assert session_id not in {item["id"] for item in listed}
    assert delete(f"{api_url}/v1/renders/{session_id}").status_code == 204  # idempotent


def test_deleting_a_running_live_session_cancels_it_before_removing_its_files(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    created = post(f"{api_url}/v1/sessions", files={"portrait": ("p.jpg", sample_portrait)}, timeout=150)
    assert created.status_code == 201, created.text
    session = created.json()
    assert session["status"] == "running" and _files(stack, session["id"])  # a node holds it, waiting for audio

    assert delete(f"{api_url}/v1/sessions/{session['id']}").status_code == 204

    assert _files(stack, session["id"]) == []
    assert get(f"{api_url}/v1/sessions/{session['id']}", timeout=10).status_code == 410
    # Cancelled through its workflow (which closed before anything was removed), not terminated.
    assert asyncio.run(_workflow_status(stack, session["id"])) == WorkflowExecutionStatus.CANCELED


async def _workflow_status(stack: Stack, session_id: str) -> WorkflowExecutionStatus | None:
    client = await connect(stack.settings.temporal)
    return (await client.get_workflow_handle(c.render_workflow_id(session_id)).describe()).status
