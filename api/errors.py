"""The API's own error types, each answered as problem details with its code, status and, where the same request may
pass later, `Retry-After` (`api/problems.py`).

    Exception
    └── Refusal                    a request refused with a problem code (`monologue.problems.ProblemCode`)
        ├── TooManySessions        the tenant is at its limit of concurrent sessions (429)
        ├── TooManyStreams         the key, or a playback link's session, holds its limit of open streams (429)
        ├── ValidationUnavailable  no node checked a new session's inputs in time (503)
        ├── NoNodeForLive          a new live session found no node in time (503)
        └── IdempotencyConflict    an Idempotency-Key came back with another request (422)

Routes raise FastAPI's HTTPException for everything else (its status picks the code: `api.problems.CODE_OF_STATUS`);
`monologue.errors.InputError` from below becomes a 422 where a route calls into it."""

from __future__ import annotations

from typing import ClassVar

from monologue.problems import PROBLEMS, ProblemCode


class Refusal(Exception):
    """A refusal with its problem code; the status is the code's (`PROBLEMS`). `retry_after_s`: what Retry-After
    says (codes that retry only; None: the handler works it out)."""

    code: ClassVar[ProblemCode]

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return PROBLEMS[self.code].status


class TooManySessions(Refusal):
    """The tenant is at its limit of concurrent sessions (→ 429, with a Retry-After estimated for `tenant`: the
    caller's tenant when not given)."""

    code = ProblemCode.TOO_MANY_SESSIONS

    def __init__(self, message: str, *, tenant: str | None = None) -> None:
        super().__init__(message)
        self.tenant = tenant


class TooManyStreams(Refusal):
    """The key already holds as many open streams as it may (→ 429, or close 4429 on a socket)."""

    code = ProblemCode.TOO_MANY_STREAMS
    # A stream frees when its client closes it, which nothing here can foresee: a short wait, then ask again.
    RETRY_AFTER_S = 10

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=self.RETRY_AFTER_S)


class TooManyViewers(Refusal):
    """The live session has as many WebRTC viewers as it may (→ 429; its node counts them: node/webrtc/peers.py)."""

    code = ProblemCode.TOO_MANY_VIEWERS
    RETRY_AFTER_S = 10  # a viewer leaves when its page closes, which nothing here can foresee

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=self.RETRY_AFTER_S)


class NodeFailed(Refusal):
    """The node holding the session answered a forwarded request with an error of its own (→ 502)."""

    code = ProblemCode.NODE_FAILED


class ValidationUnavailable(Refusal):
    """No worker checked the uploads in time (→ 503): no node is polling the shared queue, or all are busy."""

    code = ProblemCode.NO_NODE_AVAILABLE
    RETRY_AFTER_S = 10

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=self.RETRY_AFTER_S)


class NoNodeForLive(Refusal):
    """A new live session got no node within MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S (→ 503 with Retry-After); nothing
    of it is left behind."""

    code = ProblemCode.NO_NODE_AVAILABLE

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class IdempotencyConflict(Refusal):
    """The Idempotency-Key was used before with a different request (→ 422; the message says so)."""

    code = ProblemCode.IDEMPOTENCY_KEY_REUSED
