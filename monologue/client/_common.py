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
import tenacity
from pydantic import BaseModel

from monologue.captions import PUBLISHED_CAPTIONS, CaptionFormat
from monologue.contracts import TERMINAL, SessionStatus
from monologue.errors import ApiError, ClientError, SessionEnded
from monologue.schemas import AssetKind, AssetPublic, AvatarPublic, RenderPublic, VideoLayout

Model = TypeVar("Model", bound=BaseModel)
# A file to upload (a path, or its bytes), or an asset uploaded before (`upload_asset`); a URL goes in *_url.
Input = Path | bytes | AssetPublic | None
Progress = Callable[[RenderPublic], None]
DownloadProgress = Callable[[int, int | None], None]  # bytes written so far, of the total (None: not known)
# A create is sent again (tenacity, with the same Idempotency-Key: one session whatever happens) after a lost
# connection or a refusal for now, up to this many times in all; every request's connection that failed to open is
# opened again by httpx's transport (nothing was sent, so any request may be).
CREATE_ATTEMPTS = 4
CONNECT_RETRIES = 2
RETRY_STATUSES = frozenset({429, 503})  # refusals for now: the API says when to come back (Retry-After)
# A refusal that asks for a longer wait is raised at once (ApiError.retry_after_s): the caller decides whether to.
LONGEST_RETRY_AFTER_S = 30.0
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
    *,
    metadata: Mapping[str, Any] | None = None,
    callback_url: str | None = None,
    avatar: AvatarPublic | str | None = None,
) -> Call:
    """A create (render or live session): each input as a file or as its URL, the options (and the `metadata`,
    `callback_url` and `avatar_id`, sent beside them) as form fields, and an Idempotency-Key (made here when none is
    given) so that a retry after a network error makes no second session. With an uploaded asset among the inputs it
    is a JSON body instead (`json_create_call`)."""
    options = {
        **(options or {}),
        "metadata": None if metadata is None else dict(metadata),
        "callback_url": callback_url,
        "avatar_id": avatar.id if isinstance(avatar, AvatarPublic) else avatar,
    }
    call = Call("POST", path, headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
    for name, (given, url) in inputs.items():
        if given is not None and url is not None:
            raise ValueError(f"{name}: give the file or {name}_url, not both")
    if any(isinstance(given, AssetPublic) for given, _url in inputs.values()):
        return json_create_call(call, inputs, options)
    for name, (given, url) in inputs.items():
        if url is not None:
            call.data[f"{name}_url"] = url
        elif isinstance(given, Path):
            call.files[name] = (given.name, given.read_bytes())
        elif isinstance(given, bytes):
            call.files[name] = (name, given)
    call.data |= {name: form_value(value) for name, value in (options or {}).items() if value is not None}
    return call


def json_create_call(
    call: Call, inputs: Mapping[str, tuple[Input, str | None]], options: Mapping[str, Any] | None
) -> Call:
    """The create as JSON: each input `{"asset_id": …}` or `{"url": …}` beside the options (a file cannot ride in
    JSON: upload it first with `upload_asset`)."""
    body: dict[str, Any] = {name: value for name, value in (options or {}).items() if value is not None}
    for name, (given, url) in inputs.items():
        if isinstance(given, AssetPublic):
            body[name] = {"asset_id": given.id}
        elif url is not None:
            body[name] = {"url": url}
        elif given is not None:
            raise ValueError(
                f"{name}: with an asset among the inputs, upload this file too (upload_asset) or give its URL"
            )
    call.json = body
    return call


def asset_call(file: Path | bytes, kind: AssetKind) -> Call:
    """An asset upload: the file and its kind (portrait or audio)."""
    name, data = (file.name, file.read_bytes()) if isinstance(file, Path) else (kind.value, file)
    return Call("POST", "/v1/assets", data={"kind": kind.value}, files={"file": (name, data)})


def avatar_call(portrait: Input, portrait_url: str | None) -> Call:
    """An avatar from a portrait: the file, an uploaded asset or a URL (the last two as JSON)."""
    if (portrait is None) == (portrait_url is None):
        raise ValueError("portrait: give the portrait (a file, its bytes or an asset) or portrait_url, one of them")
    if isinstance(portrait, AssetPublic):
        return Call("POST", "/v1/avatars", json={"portrait": {"asset_id": portrait.id}})
    if portrait_url is not None:
        return Call("POST", "/v1/avatars", json={"portrait": {"url": portrait_url}})
    name, data = (portrait.name, portrait.read_bytes()) if isinstance(portrait, Path) else ("portrait", portrait)
    return Call("POST", "/v1/avatars", files={"portrait": (name, data or b"")})


def captions_call(session_id: str, fmt: CaptionFormat | str) -> Call:
    """A session's captions file (`captions` option): WebVTT or SRT."""
    fmt = CaptionFormat(fmt)
    if fmt not in PUBLISHED_CAPTIONS:
        raise ClientError(f"captions come as {', '.join(PUBLISHED_CAPTIONS)}, not {fmt}")
    return Call("GET", f"/v1/renders/{session_id}/{fmt.file_name}")


def captions_text(response: httpx.Response) -> str:
    raise_for(response)
    return response.content.decode("utf-8")


def retried(error: BaseException) -> bool:
    """Whether a create that failed with `error` may be sent again: the connection was lost or timed out (the
    request may have arrived: the Idempotency-Key makes that safe), or the API refused it for now (429, 503) and
    asked for a wait of at most LONGEST_RETRY_AFTER_S."""
    if isinstance(error, httpx.NetworkError | httpx.TimeoutException | httpx.RemoteProtocolError):
        return True
    return (
        isinstance(error, ApiError)
        and error.status in RETRY_STATUSES
        and (error.retry_after_s or 0.0) <= LONGEST_RETRY_AFTER_S
    )


_backoff = tenacity.wait_random_exponential(multiplier=0.5, max=8.0)  # "full jitter": clients spread out


def _retry_wait(state: tenacity.RetryCallState) -> float:
    """The wait the API asked for (Retry-After), else exponential back-off with full jitter."""
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, ApiError) and error.retry_after_s is not None:
        return error.retry_after_s
    return _backoff(state)


def create_retries(attempts: int) -> dict[str, Any]:
    """tenacity's arguments for a create, for `Retrying` (Client) and `AsyncRetrying` (AsyncClient): up to
    `attempts` in all, the last error raised as it was (an ApiError or an httpx error, never tenacity's
    RetryError)."""
    if attempts < 1:
        raise ValueError(f"create_attempts={attempts}: a create is sent at least once")
    return {
        "retry": tenacity.retry_if_exception(retried),
        "wait": _retry_wait,
        "stop": tenacity.stop_after_attempt(attempts),
        "reraise": True,
    }


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


def content_length(response: httpx.Response) -> int | None:
    """The body's size as the answer states it; None when it does not (a chunked answer) or it is compressed (the
    blocks read are then not the bytes counted)."""
    value = response.headers.get("Content-Length")
    if value is None or not value.isdigit() or response.headers.get("Content-Encoding"):
        return None
    return int(value)


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
