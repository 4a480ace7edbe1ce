"""Monologue's error types. Raised inside the project, translated only at the edges
(HTTP status codes in `api/`, `ApplicationError` in `activities/`).

    MonologueError
    ├── InputError        the caller's input cannot work; retrying will not help (HTTP 4xx, non-retryable)
    │   ├── NoFaceFound   the portrait has no detectable face
    │   ├── AddressRefused  a URL a caller gave leads where the operator allows no request (SSRF)
    │   └── InputTooLarge   a URL input is larger than the upload limit (HTTP 413)
    ├── NotFound          no such session or object (HTTP 404)
    ├── TransientError    a dependency hiccuped; retrying may help
    │   ├── StorageUnavailable  object storage kept failing for as long as the caller may wait (HTTP 503)
    │   └── SinkObjectsKept     a delete could not remove what a session's S3 sink wrote (HTTP 503; DELETE again)
    ├── LeaseFenced       a node's write under a lease older than the session's newest (it was cut off and came back)
    └── ClientError       what `monologue.client` raises
        ├── ApiError      the API refused a request: its status and problem details
        └── SessionEnded  a session waited on ended failed or cancelled
"""

from typing import Any


class MonologueError(Exception):
    """Base of every error Monologue raises on purpose."""


class InputError(MonologueError):
    """The caller's input is unusable; the message says what to fix."""


class NoFaceFound(InputError):
    """The portrait has no face the detector can find."""


class AddressRefused(InputError):
    """A URL (an input, a webhook) names, resolves or redirects to an address or scheme no request may go to."""


class InputTooLarge(InputError):
    """A URL input is larger than MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES."""


class NotFound(MonologueError):
    """The session or object does not exist."""


class TransientError(MonologueError):
    """A temporary failure (storage, database, network); safe to retry."""


class StorageUnreachable(TransientError):
    """Object storage did not answer at all (a refused or dropped connection): it is down, not throttling."""


class StorageUnavailable(TransientError):
    """Object storage was unreachable or throttling for the whole time this call may retry
    (MONOLOGUE_STORAGE__RETRY_FOR_S); a later call may pass."""


class SinkObjectsKept(TransientError):
    """A session being deleted has objects in an S3 sink's bucket that the bucket would not delete (credentials
    without s3:DeleteObject, the bucket unreachable); the message names the sink, the place and why."""


class LeaseFenced(MonologueError):
    """A node wrote for a session under a lease older than the one that holds the session now: the node was cut off
    long enough for its lease to time out and the session to move, and came back. The write is refused whole."""

    def __init__(self, message: str, newest: int) -> None:
        super().__init__(message)
        self.newest = newest  # the session's newest lease: a workflow that numbered its leases too low counts on


class ClientError(MonologueError):
    """A call through `monologue.client` did not give what was asked; the message says why."""


class ApiError(ClientError):
    """The API answered with an error: `status` and its problem details (`problem`, RFC 9457) when it sent them, its
    machine-readable `code` (a `monologue.problems.ProblemCode` value, e.g. "too-many-sessions"), and for a refusal
    that may pass (429, 503) how long to wait before trying again (`retry_after_s`, from Retry-After)."""

    def __init__(
        self, message: str, *, status: int, problem: dict[str, Any] | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem or {}
        self.code: str | None = self.problem.get("code")
        self.retry_after_s = retry_after_s


class SessionEnded(ClientError):
    """A session that was waited on ended without a video (failed or cancelled); `session` is its last state."""

    def __init__(self, message: str, *, session: Any) -> None:
        super().__init__(message)
        self.session = session
