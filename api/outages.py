"""What the API does while a service beneath it is down (issue 28): Temporal restarting, PostgreSQL failing over.

A request that needs the service answers 503 with Retry-After (`api/problems.py` maps `is_outage` errors), never a
500 or a hang: the Temporal client gives up after its own retries (about 10 s), the database pool after its
`timeout_s`, and a connection the database dropped is replaced (`pool_pre_ping`). Errors that mean the request
itself is wrong (a workflow that is gone, a row that breaks a constraint) are not outages and keep their answers."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError, TimeoutError as PoolTimeout
from temporalio.service import RPCError, RPCStatusCode

from monologue.errors import StorageUnavailable

RETRY_AFTER_S = 5  # what a client is told to wait when a service is down: about a restart's length

# Temporal answers these when it (or the network to it) is down or overloaded: the call may pass later. Every other
# status (NOT_FOUND: the workflow ended; INVALID_ARGUMENT; ALREADY_EXISTS; …) is about the request itself.
TRANSIENT_TEMPORAL = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNKNOWN,
        RPCStatusCode.INTERNAL,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.ABORTED,
    }
)


# The error types an outage shows up as (`which_service` says which of them are one).
ERROR_TYPES: tuple[type[Exception], ...] = (RPCError, DBAPIError, PoolTimeout, StorageUnavailable)


def temporal_down(err: BaseException) -> bool:
    """Temporal could not answer now (restarting, overloaded, unreachable)."""
    return isinstance(err, RPCError) and err.status in TRANSIENT_TEMPORAL


def database_down(err: BaseException) -> bool:
    """The database could not answer now: no connection (refused, dropped mid-query, the server shutting down) or
    none free in the pool in time. A constraint or a bad query is not an outage."""
    if isinstance(err, PoolTimeout):
        return True
    return isinstance(err, OperationalError) or (isinstance(err, DBAPIError) and err.connection_invalidated)


def which_service(err: BaseException) -> str | None:
    """'Temporal', 'the database' or 'object storage' when `err` says that service is down; None for any other
    error."""
    if temporal_down(err):
        return "Temporal"
    if database_down(err):
        return "the database"
    if isinstance(err, StorageUnavailable):  # S3 failed for MONOLOGUE_STORAGE__REQUEST_RETRY_FOR_S (monologue.storage)
        return "object storage"
    return None
