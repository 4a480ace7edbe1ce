"""A small HTTP client for the API, used by `monologue render`, `monologue renders …` and `monologue demo`.

Every call sends the API key (`auth`) and turns a refusal into RenderFailed with the API's own message, so
the CLI prints it without a traceback."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from monologue.contracts import TERMINAL, SessionStatus


class RenderFailed(RuntimeError):
    """The API refused a request, or a render ended without completing; the message says which and why."""


def auth(api_key: str | None) -> dict[str, str]:
    """The Authorization header for an API key (the embedded stack's is in <home>/api-key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def submit(
    api_url: str,
    portrait: Path,
    audio: Path,
    *,
    options: dict[str, Any] | None = None,
    timeout_s: float = 120.0,
    api_key: str | None = None,
) -> dict[str, Any]:
    """POST the files; returns the created render (raises RenderFailed with the API's message on 4xx)."""
    return create(
        f"{api_url}/v1/renders", {"portrait": portrait, "audio": audio}, options, api_key, timeout_s, "render"
    )


def create(
    url: str,
    files: dict[str, Path],
    options: dict[str, Any] | None,
    api_key: str | None,
    timeout_s: float,
    what: str,
) -> dict[str, Any]:
    """POST a multipart form that creates a session; its JSON, or RenderFailed with the API's message."""
    with contextlib.ExitStack() as opened:
        uploads = {field: (path.name, opened.enter_context(path.open("rb"))) for field, path in files.items()}
        response = httpx.post(
            url,
            files=uploads,
            data={name: _form_value(value) for name, value in (options or {}).items()},
            headers=auth(api_key),
            timeout=timeout_s,
        )
    if response.status_code != 201:
        raise RenderFailed(f"the API refused the {what} ({response.status_code}): {_detail(response)}")
    result: dict[str, Any] = response.json()
    return result


def get_render(api_url: str, session_id: str, *, api_key: str | None = None) -> dict[str, Any]:
    """The render (or live session) as the API shows it."""
    return _call("GET", f"{api_url}/v1/renders/{session_id}", api_key)


def list_renders(
    api_url: str, *, status: str | None = None, limit: int = 50, offset: int = 0, api_key: str | None = None
) -> list[dict[str, Any]]:
    """The key's renders, newest first; `status` keeps only those in that status."""
    params: dict[str, Any] = {"limit": limit, "offset": offset} | ({"status": status} if status else {})
    items: list[dict[str, Any]] = _call("GET", f"{api_url}/v1/renders", api_key, params=params)["items"]
    return items


def cancel(api_url: str, session_id: str, *, api_key: str | None = None) -> dict[str, Any]:
    """Ask the render to stop (it ends `cancelled` within a chunk); RenderFailed if it has already ended."""
    return _call("POST", f"{api_url}/v1/renders/{session_id}/cancel", api_key)


def resume(api_url: str, session_id: str, *, api_key: str | None = None) -> dict[str, Any]:
    """Start a failed or cancelled render again from its last checkpoint."""
    return _call("POST", f"{api_url}/v1/renders/{session_id}/resume", api_key)


def poll(
    api_url: str,
    session_id: str,
    until: Callable[[dict[str, Any]], bool],
    *,
    poll_s: float = 0.5,
    timeout_s: float = 3600.0,
    api_key: str | None = None,
) -> dict[str, Any]:
    """GET the render every `poll_s` until `until(render)` holds; returns that render."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        render = get_render(api_url, session_id, api_key=api_key)
        if until(render):
            return render
        time.sleep(poll_s)
    raise RenderFailed(f"render {session_id} did not get there within {timeout_s:.0f} s")


def wait(
    api_url: str,
    session_id: str,
    *,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 0.5,
    timeout_s: float = 3600.0,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Poll until the render ends; returns it if it completed, raises RenderFailed if it failed or was cancelled."""

    def ended(render: dict[str, Any]) -> bool:
        if on_progress is not None:
            on_progress(render)
        return render["status"] in TERMINAL

    render = poll(api_url, session_id, ended, poll_s=poll_s, timeout_s=timeout_s, api_key=api_key)
    if render["status"] == SessionStatus.FAILED:
        raise RenderFailed(f"render {session_id} failed: {render['error']}")
    if render["status"] == SessionStatus.CANCELLED:
        raise RenderFailed(f"render {session_id} was cancelled")
    return render


def download(api_url: str, session_id: str, output: Path, *, api_key: str | None = None) -> int:
    """Stream the finished MP4 to `output`; returns its size in bytes."""
    output.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    url = f"{api_url}/v1/renders/{session_id}/video.mp4"
    with httpx.stream("GET", url, headers=auth(api_key), timeout=60) as response:
        if response.status_code != 200:
            response.read()
            raise RenderFailed(f"download failed ({response.status_code}): {_detail(response)}")
        with output.open("wb") as out:
            for block in response.iter_bytes():
                out.write(block)
                size += len(block)
    return size


def _call(method: str, url: str, api_key: str | None, **kwargs: Any) -> dict[str, Any]:
    """One JSON request; RenderFailed with the API's message when it is refused."""
    response = httpx.request(method, url, headers=auth(api_key), timeout=30, **kwargs)
    if response.is_error:
        raise RenderFailed(f"{method} {url} was refused ({response.status_code}): {_detail(response)}")
    body: dict[str, Any] = response.json()
    return body


def _form_value(value: Any) -> str:
    """A form field as the API parses it: booleans as true/false (str() would send 'True')."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text
