"""What the sync and async clients share: how each call becomes a request, how an answer becomes a typed model or
an `ApiError`, and how a server-sent event stream is read. No I/O here: `Client` and `AsyncClient` send."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from monologue.contracts import TERMINAL, SessionStatus
from monologue.errors import ApiError, SessionEnded
from monologue.schemas import RenderPublic, VideoLayout

Model = TypeVar("Model", bound=BaseModel)
Input = Path | bytes | None  # a file to upload (a path, or its bytes); its URL goes in the *_url argument
Progress = Callable[[RenderPublic], None]
RETRIES = 3  # tries of a create that hit a network error (the same Idempotency-Key: one session whatever happens)
# An event stream sends a keep-alive at least every MONOLOGUE_API__EVENTS_KEEPALIVE_S (15 s): silence this long means
# the connection is gone, and the client reconnects.
STREAM_TIMEOUT = httpx.Timeout(30.0, read=60.0)
Layout = VideoLayout  # the client's name for the API's `layout` query: fragmented or progressive MP4


def auth(api_key: str | None) -> dict[str, str]:
    """The Authorization header for an API key (the embedded stack's is in <home>/api-key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass
class Call:
    """One request, ready for either client's `request`."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    data: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"params": self.params, "headers": self.headers}
        if self.json is not None:
            arguments["json"] = self.json
        if self.files:
            arguments["files"] = self.files
        if self.data:
            arguments["data"] = self.data
        return arguments


def create_call(
    path: str,
    inputs: Mapping[str, tuple[Input, str | None]],
    options: Mapping[str, Any] | None,
    idempotency_key: str | None,
) -> Call:
    """A create (render or live session): each input as a file or as its URL, the options as form fields, and an
    Idempotency-Key (made here when none is given) so that a retry after a network error makes no second session."""
    call = Call("POST", path, headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
    for name, (given, url) in inputs.items():
        if given is not None and url is not None:
            raise ValueError(f"{name}: give the file or {name}_url, not both")
        if url is not None:
            call.data[f"{name}_url"] = url
        elif isinstance(given, Path):
            call.files[name] = (given.name, given.read_bytes())
        elif given is not None:
            call.files[name] = (name, given)
    call.data |= {name: form_value(value) for name, value in (options or {}).items() if value is not None}
    return call


def form_value(value: Any) -> str:
    """A form field as the API parses it: booleans as true/false (str() would send 'True'), lists as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def parse(response: httpx.Response, model: type[Model]) -> Model:
    """The answer as `model`, or ApiError with the API's problem details."""
    raise_for(response)
    return model.model_validate(response.json())


def raise_for(response: httpx.Response) -> None:
    if response.is_error:
        problem = _problem(response)
        detail = problem.get("detail") or response.text or response.reason_phrase
        request = response.request
        raise ApiError(
            f"{request.method} {request.url.path} was refused ({response.status_code}): {detail}",
            status=response.status_code,
            problem=problem,
            retry_after_s=_retry_after(response),
        )


def _retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds (the form the API sends; an HTTP date from elsewhere is ignored)."""
    value = response.headers.get("Retry-After", "")
    try:
        return float(value)
    except ValueError:
        return None


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def ended(session: RenderPublic) -> bool:
    return session.status in TERMINAL


def finished(session: RenderPublic) -> RenderPublic:
    """A session that ended: returned if it completed; SessionEnded if it failed or was cancelled."""
    if session.status == SessionStatus.FAILED:
        raise SessionEnded(f"session {session.id} failed: {session.error}", session=session)
    if session.status == SessionStatus.CANCELLED:
        raise SessionEnded(f"session {session.id} was cancelled", session=session)
    return session


@dataclass
class ServerEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None


class EventReader:
    """Server-sent events from the lines of a `text/event-stream` (the WHATWG parsing rules we need: comments,
    event, data, id; multi-line data joined)."""

    def __init__(self) -> None:
        self._event = ServerEvent()
        self._data: list[str] = []
        self.last_id: str | None = None

    def feed(self, line: str) -> Iterator[ServerEvent]:
        if not line:
            if self._data:
                self._event.data = "\n".join(self._data)
                yield self._event
            self._event, self._data = ServerEvent(id=self.last_id), []
            return
        if line.startswith(":"):
            return  # a comment: keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event.event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_id = self._event.id = value


def progress_event(event: ServerEvent) -> RenderPublic | None:
    """A `progress` event's session; ApiError for an `error` event (a revoked key, an expired link)."""
    if event.event == "error":
        detail = json.loads(event.data).get("detail", event.data)
        raise ApiError(f"the event stream ended: {detail}", status=403, problem={"detail": detail})
    if event.event != "progress":
        return None
    return RenderPublic.model_validate_json(event.data)
