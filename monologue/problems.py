"""Every error the API answers, as RFC 9457 problem details: the stable machine-readable `ProblemCode`s, what each
means (`PROBLEMS`), the `type` URI made of a code, and the `Problem` body. The API's handlers (`api/problems.py`), its
guards and its OpenAPI schema read them here; so does the typed client (`ApiError.code`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class ProblemCode(StrEnum):
    """What went wrong, machine-readable: every problem's `code`, and the last segment of its `type` URI. Stable: a
    code is never renamed nor given another meaning (new ones may come); `PROBLEMS` says what each means."""

    BAD_REQUEST = "bad-request"
    HOST_NOT_ALLOWED = "host-not-allowed"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    CROSS_SITE_REQUEST = "cross-site-request"
    NOT_FOUND = "not-found"
    METHOD_NOT_ALLOWED = "method-not-allowed"
    CONFLICT = "conflict"
    GONE = "gone"
    TOO_LARGE = "too-large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported-media-type"
    INVALID_REQUEST = "invalid-request"
    IDEMPOTENCY_KEY_REUSED = "idempotency-key-reused"
    TOO_MANY_SESSIONS = "too-many-sessions"
    TOO_MANY_STREAMS = "too-many-streams"
    TOO_MANY_VIEWERS = "too-many-viewers"
    INTERNAL_ERROR = "internal-error"
    SERVICE_UNAVAILABLE = "service-unavailable"
    NO_NODE_AVAILABLE = "no-node-available"
    NODE_FAILED = "node-failed"


# Problem types are `PROBLEM_TYPE_BASE + code`: an identifier that stays the same whatever the deployment's own URL
# (so clients may compare it); the API also serves each code's page at `/problems/<code>`.
PROBLEM_TYPE_BASE = "https://monologue.dev/problems/"


def problem_type(code: ProblemCode) -> str:
    return f"{PROBLEM_TYPE_BASE}{code.value}"


@dataclass(frozen=True)
class ProblemKind:
    status: int
    summary: str


PROBLEMS: dict[ProblemCode, ProblemKind] = {
    ProblemCode.BAD_REQUEST: ProblemKind(
        400, "The request is malformed (a body that does not parse, a NUL in the URL)."
    ),
    ProblemCode.HOST_NOT_ALLOWED: ProblemKind(400, "The Host header names no host this API answers to."),
    ProblemCode.UNAUTHORIZED: ProblemKind(401, "No valid API key: send `Authorization: Bearer <key>`."),
    ProblemCode.FORBIDDEN: ProblemKind(
        403, "The key may not do this (a scope it lacks), or the playback link is not valid or has expired."
    ),
    ProblemCode.CROSS_SITE_REQUEST: ProblemKind(403, "A page of another site may not change anything here."),
    ProblemCode.NOT_FOUND: ProblemKind(404, "No such thing for this key's tenant (another tenant's ids do not leak)."),
    ProblemCode.METHOD_NOT_ALLOWED: ProblemKind(405, "The path does not take this method."),
    ProblemCode.CONFLICT: ProblemKind(409, "Not possible in the session's status (the detail says why)."),
    ProblemCode.GONE: ProblemKind(
        410, "The session, or the files asked for, were deleted (by a DELETE, or by the operator's retention)."
    ),
    ProblemCode.TOO_LARGE: ProblemKind(413, "An upload or the request is larger than the operator's limit."),
    ProblemCode.UNSUPPORTED_MEDIA_TYPE: ProblemKind(415, "The body's Content-Type is not one this route takes."),
    ProblemCode.INVALID_REQUEST: ProblemKind(
        422, "A field is missing or wrong; `detail` names each, and `errors` lists them when the schema caught them."
    ),
    ProblemCode.IDEMPOTENCY_KEY_REUSED: ProblemKind(422, "The Idempotency-Key was used with another request."),
    ProblemCode.TOO_MANY_SESSIONS: ProblemKind(
        429, "The tenant has its limit of sessions queued or running; retry after Retry-After."
    ),
    ProblemCode.TOO_MANY_STREAMS: ProblemKind(
        429, "The key (or the playback link's session) holds its limit of open streams; close one."
    ),
    ProblemCode.TOO_MANY_VIEWERS: ProblemKind(
        429, "The live session has its limit of WebRTC viewers (MONOLOGUE_NODE__MAX_VIEWERS_PER_SESSION); close one."
    ),
    ProblemCode.INTERNAL_ERROR: ProblemKind(500, "An unexpected error; it is logged on the server."),
    ProblemCode.SERVICE_UNAVAILABLE: ProblemKind(
        503, "A service beneath the API (Temporal, the database, storage) is down for now."
    ),
    ProblemCode.NO_NODE_AVAILABLE: ProblemKind(503, "No node checked the inputs or took the live session in time."),
    ProblemCode.NODE_FAILED: ProblemKind(502, "The node holding the live session answered with an error."),
}


class Problem(BaseModel):
    """An error, as RFC 9457 problem details (`application/problem+json`). `code` (and `type`, a URI ending in it)
    says what went wrong for programs; `detail` says it, and what to do, for people; a request FastAPI itself
    rejects (a missing field, a wrong type) lists each problem in `errors`."""

    type: str = Field(description=f"{PROBLEM_TYPE_BASE}<code>: stable, one per `code`.")
    code: ProblemCode = Field(description=ProblemCode.__doc__)
    title: str = Field(description="The HTTP status phrase.")
    status: int
    detail: str
    instance: str | None = Field(default=None, description="The request's path.")
    errors: list[dict[str, Any]] | None = Field(default=None, description="Validation errors: loc, msg, type.")
