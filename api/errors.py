"""The API's own error types, each answered with its status as problem details (`api/problems.py`).

    Exception
    ├── TooManySessions        the tenant is at its limit of concurrent sessions (429)
    ├── ValidationUnavailable  no node checked a new session's inputs in time (503)
    ├── NoNodeForLive          a new live session found no node in time (503)
    └── IdempotencyConflict    an Idempotency-Key came back with another request (422)

Routes raise FastAPI's HTTPException for everything else; `monologue.errors.InputError` from below becomes a 422
where a route calls into it."""


class TooManySessions(Exception):
    """The tenant is at its limit of concurrent sessions (→ 429, with a Retry-After estimated for `tenant`: the
    caller's tenant when not given)."""

    def __init__(self, message: str, *, tenant: str | None = None) -> None:
        super().__init__(message)
        self.tenant = tenant


class ValidationUnavailable(Exception):
    """No worker checked the uploads in time (→ 503): no node is polling the shared queue, or all are busy."""


class NoNodeForLive(Exception):
    """A new live session got no node within MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S (→ 503 with Retry-After); nothing
    of it is left behind."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different request (→ 422; the message says so)."""
