"""`DELETE /v1/renders/{id}` and `DELETE /v1/sessions/{id}`: a session (render or live: one table, one deletion) and
every object it has, keeping a tombstone (`api/deletion.py`). Its own module beside `renders.py` and `sessions.py`,
whose other routes answer 410 Gone for a deleted session (`api.views.find`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from fastapi.routing import APIRoute

from monologue.errors import SinkObjectsKept

from .. import deletion
from ..deps import ServicesDep, TenantDep, with_db
from ..views import owned

STOPPING_RETRY_AFTER_S = 5  # a DELETE that found the session still stopping: about a chunk's cancellation


def operation_id(route: APIRoute) -> str:
    return route.name


router = APIRouter(generate_unique_id_function=operation_id)
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}}
ANSWERS: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such session for this key's tenant."},
    409: {
        "description": "The session is still stopping (its cancellation was asked): DELETE again after Retry-After.",
        "headers": RETRY_AFTER,
    },
    503: {"description": "Storage, Temporal or an S3 sink's bucket failed: DELETE again; nothing is lost by it."},
}


@router.delete("/v1/renders/{session_id}", status_code=status.HTTP_204_NO_CONTENT, tags=["renders"], responses=ANSWERS)
async def delete_render(session_id: str, services: ServicesDep, principal: TenantDep) -> Response:
    """Delete the session and its data: a running one is cancelled first (and this waits, up to about 30 s, for it
    to stop); then its inputs (portrait, speech), outputs (stream, video), checkpoints and what its S3 sinks wrote
    under their prefix are removed. A tombstone stays (id, tenant, kind, status, times, sizes), so the session then
    answers 410 Gone, and a second DELETE 204 again. Kinesis Video streams are not touched."""
    row = await with_db(services, owned, session_id, principal)
    try:
        await deletion.delete(services, row)
    except deletion.StillStopping as err:
        raise HTTPException(409, str(err), headers={"Retry-After": str(STOPPING_RETRY_AFTER_S)}) from None
    except SinkObjectsKept as err:
        raise HTTPException(503, f"{err}; the rest is deleted, DELETE again once the sink's bucket allows it") from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete(
    "/v1/sessions/{session_id}", status_code=status.HTTP_204_NO_CONTENT, tags=["live sessions"], responses=ANSWERS
)
async def delete_session(session_id: str, services: ServicesDep, principal: TenantDep) -> Response:
    """Delete the live session and its data, as `DELETE /v1/renders/{id}` does (its audio socket closes)."""
    return await delete_render(session_id, services, principal)
