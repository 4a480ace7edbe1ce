"""Monologue's error types. Raised inside the project, translated only at the edges
(HTTP status codes in `api/`, `ApplicationError` in `activities/`).

    MonologueError
    ├── InputError        the caller's input cannot work; retrying will not help (HTTP 4xx, non-retryable)
    │   ├── NoFaceFound   the portrait has no detectable face
    │   ├── AddressRefused  a URL a caller gave leads where the operator allows no request (SSRF)
    │   └── InputTooLarge   a URL input is larger than the upload limit (HTTP 413)
    ├── NotFound          no such session or object (HTTP 404)
    └── TransientError    a dependency hiccuped; retrying may help
"""


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
