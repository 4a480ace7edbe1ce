"""The upload guard: a pure ASGI layer that checks a /v1 request's key and size before its body is read.

FastAPI parses a multipart form (Starlette spools its files to temporary files) before any dependency runs,
so without this layer a request with no key is read in full before it is answered 401, and nothing caps a
request's total size: anyone could fill the API's temporary disk. This layer answers from the request head
alone: a missing or invalid key is 401, a declared `Content-Length` over the limit is 413, and a body
without one (chunked) is counted as it arrives and cut off with 413 as soon as it passes the limit. Refusals
close the connection, so the server never reads (or discards) the rest of the body.

It must never read a body it is about to refuse, and never block the event loop (the key lookup is a
synchronous database query: it runs on a worker thread).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monologue.settings import LimitSettings

from . import outages
from .deps import Services, principal_from_headers
from .problems import problem_response, unavailable

GUARDED_PREFIX = "/v1/"
# WebRTC signalling (api/routes/live.py) is authorised by a playback link or an audio ticket, not a key, and reads at
# most api/webrtc.py's MAX_OFFER_BYTES of its body itself.
SIGNALLING_PREFIX = "/v1/live/"
PRINCIPAL_STATE = "principal"  # request.state.principal, read by api.deps.require_key


def _guarded(path: str) -> bool:
    return path.startswith(GUARDED_PREFIX) and not path.startswith(SIGNALLING_PREFIX)


class BodyTooLarge(Exception):
    """The body passed the limit while it was being read (raised from `receive`, caught by the guard)."""


class UploadGuard:
    """Refuse /v1 requests with a body before reading it: no valid key (401), too large (413)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _guarded(scope["path"]) or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        services: Services = scope["app"].state.services
        headers = Headers(scope=scope)
        try:
            principal = await run_in_threadpool(principal_from_headers, services, headers.get("authorization"))
        except HTTPException as refused:
            await _refuse(scope, receive, send, refused.status_code, refused.detail, refused.headers)
            return
        except outages.ERROR_TYPES as err:  # the key's lookup found the database down: 503, try again
            if (service := outages.which_service(err)) is None:
                raise
            answer = unavailable(service, err, instance=scope["path"], headers={"Connection": "close"})
            await answer(scope, receive, send)
            return
        limits = services.settings.limits
        declared = _content_length(headers)
        if declared is not None and declared > limits.max_body_bytes:
            await _refuse(scope, receive, send, 413, _too_large(limits, f"Content-Length is {declared} bytes"))
            return
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal  # spares require_key a second lookup
        await _CountedBody(self.app, limits)(scope, receive, send)


class _CountedBody:
    """Pass one request to the app, counting its body as the app reads it; past the limit, answer 413.

    A body without Content-Length has no size until it ends, so the count is the only check: `receive`
    raises `BodyTooLarge` once past the limit, whatever the app then sends is dropped, and the 413 goes
    out instead (unless the app had already started its own response)."""

    def __init__(self, app: ASGIApp, limits: LimitSettings) -> None:
        self.app = app
        self.limits = limits
        self.received = 0
        self.app_responded = False  # the app started a response before the body passed the limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.over:
                    raise BodyTooLarge
            return message

        async def unless_over(message: Message) -> None:
            if self.over and not self.app_responded:
                return  # the app's answer to a cut-off body (e.g. a 400 "error parsing the body"): ours goes instead
            self.app_responded = self.app_responded or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, unless_over)
        except Exception:
            if not self.over or self.app_responded:
                raise
            # Past the limit, whatever the app raised (BodyTooLarge, or an error built from it) ends with the 413.
        if self.over and not self.app_responded:
            size = f"the body passed {self.limits.max_body_bytes} bytes"
            await _refuse(scope, receive, send, 413, _too_large(self.limits, size))

    @property
    def over(self) -> bool:
        return self.received > self.limits.max_body_bytes


def _has_body(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


def _content_length(headers: Headers) -> int | None:
    """The declared body size; None when there is none (chunked) or it is not a number (then the count applies)."""
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None


def _too_large(limits: LimitSettings, size: str) -> str:
    return (
        f"the request is too large ({size}): a request may carry at most {limits.max_body_bytes} bytes, two uploads"
        f" of at most {limits.max_upload_bytes} bytes each (setting MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES) and the"
        " form's fields; send smaller files"
    )


async def _refuse(
    scope: Scope, receive: Receive, send: Send, status: int, detail: Any, headers: Mapping[str, str] | None = None
) -> None:
    """Answer like the HTTPException handler (problem details), and close the connection: the body stays unread."""
    response = problem_response(
        status, str(detail), instance=scope["path"], headers={**(headers or {}), "Connection": "close"}
    )
    await response(scope, receive, send)
