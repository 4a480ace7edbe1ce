"""S3's errors as ours, and the retries that ride out an outage of object storage (issue 28): what `S3Store`
(monologue/storage.py) wraps every call in.

A call is retried, with backoff, while S3 is unreachable or throttling (5xx, 429, SlowDown, dropped connections),
for up to its retry time (MONOLOGUE_STORAGE__RETRY_FOR_S on nodes, __REQUEST_RETRY_FOR_S in the API), then raises
`StorageUnavailable`, whose message names object storage: an activity then fails and Temporal retries it, the API
answers 503. A thread that must not look hung while it waits (an activity with a heartbeat timeout) sets `on_retry`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import botocore.exceptions as bce
import structlog
from boto3.exceptions import RetriesExceededError, S3UploadFailedError

from monologue.errors import NotFound, StorageUnavailable, StorageUnreachable, TransientError

RETRY_FIRST_WAIT_S = 0.25  # S3Store's first pause after a transient failure; doubled (with jitter) up to ...
RETRY_MAX_WAIT_S = 2.0  # ... this while it throttles or errs (a polite back-off) ...
RETRY_MAX_WAIT_DOWN_S = 1.0  # ... or this while it does not answer at all, so a store that is back is used within 1 s

Result = TypeVar("Result")
# Called with what is being retried before each pause (a node's activity heartbeats from it); see `on_retry`.
_ON_RETRY: ContextVar[Callable[[str], object] | None] = ContextVar("storage_on_retry", default=None)
_RETRY_FOR_S: ContextVar[float | None] = ContextVar("storage_retry_for_s", default=None)
log = structlog.get_logger("storage")


@contextmanager
def on_retry(report: Callable[[str], object]) -> Iterator[None]:
    """While the block runs, S3 calls of this thread call `report` before each pause of their retries: an activity
    that is waiting for storage is not hung, and says so with a heartbeat (bounded by the retry time)."""
    token = _ON_RETRY.set(report)
    try:
        yield
    finally:
        _ON_RETRY.reset(token)


@contextmanager
def retrying_for(seconds: float) -> Iterator[None]:
    """While the block runs, S3 calls of this thread retry for `seconds` instead of their store's own time (the API's
    live audio waits out an outage like a node; its other requests answer 503 sooner)."""
    token = _RETRY_FOR_S.set(seconds)
    try:
        yield
    finally:
        _RETRY_FOR_S.reset(token)


def retrying(key: str, action: Callable[[], Result], retry_for_s: float) -> Result:
    """`action` (whole: a read includes its body), retried with backoff while storage fails transiently for
    `retry_for_s` (or the thread's `retrying_for`); StorageUnavailable once that is spent. NotFound and other errors
    are raised at once."""
    override = _RETRY_FOR_S.get()
    retry_for_s = retry_for_s if override is None else override
    started = time.monotonic()
    wait_s, tries = RETRY_FIRST_WAIT_S, 0
    while True:
        tries += 1
        try:
            with s3_errors(key):
                result = action()
            if tries > 1:  # one line per call that had to wait, not per failure: throttling would flood the log
                log.info("object storage answered after retries", key=key, tries=tries, waited_s=_since(started))
            return result
        except TransientError as err:
            left_s = started + retry_for_s - time.monotonic()
            if left_s <= 0:
                raise StorageUnavailable(
                    f"object storage unavailable ({tries} tries in {_since(started):.0f} s,"
                    f" retrying for {retry_for_s:g} s): {err}"
                ) from err
            if (report := _ON_RETRY.get()) is not None:
                report(f"storage retry {tries}: {key}")
            cap = RETRY_MAX_WAIT_DOWN_S if isinstance(err, StorageUnreachable) else RETRY_MAX_WAIT_S
            wait_s = min(wait_s, cap)
            time.sleep(min(wait_s * random.uniform(0.5, 1.0), left_s))
            wait_s = min(wait_s * 2, cap)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 1)


def translate(exc: BaseException, key: str) -> BaseException:
    """Map a boto error to NotFound / TransientError; anything else (auth, bad bucket) passes through."""
    if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None:
        return translate(exc.__context__, key)  # boto3 wraps the ClientError in a plain message
    if isinstance(exc, RetriesExceededError) and isinstance(exc.last_exception, BaseException):
        return translate(exc.last_exception, key)
    if isinstance(exc, bce.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if code in ("404", "NoSuchKey", "NotFound"):
            return NotFound(f"no object {key!r}")
        # NoSuchUpload: a multipart upload whose completion went through but whose answer was lost; uploading again
        # makes the same object.
        if status >= 500 or status == 429 or code in ("SlowDown", "RequestTimeout", "NoSuchUpload"):
            return TransientError(f"object storage error on {key!r}: {code or status}: {exc}")
    if isinstance(exc, bce.ConnectionError | bce.HTTPClientError):
        return StorageUnreachable(f"object storage unreachable ({key!r}): {exc}")
    return exc


@contextmanager
def s3_errors(key: str) -> Iterator[None]:
    """boto3's errors inside the block as NotFound or TransientError (others unchanged)."""
    try:
        yield
    except (bce.BotoCoreError, bce.ClientError, S3UploadFailedError, RetriesExceededError) as exc:
        mapped = translate(exc, key)
        if mapped is exc:
            raise
        raise mapped from exc
