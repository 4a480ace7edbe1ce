"""Probes and metrics: `/healthz` (the process answers: liveness), `/readyz` (its database answers with the
migrated schema: readiness, 503 naming what is wrong; Temporal reported too) and `/metrics` (Prometheus). No key:
kubelets and Prometheus scrape pod addresses, so these three skip the Host check too (`api/origin.py`); they reveal
no tenant's data."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from monologue.db import schema_problem

from .. import outages
from ..deps import ServicesDep
from .renders import operation_id

router = APIRouter(tags=["ops"], generate_unique_id_function=operation_id)
PROBE_TIMEOUT_S = 3.0  # a check slower than this counts as down: a probe must answer within its own timeout


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Alive: the process serves requests (it checks nothing else, so a database outage restarts no pod)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the database does not answer, or its schema is not migrated"}})
async def readyz(services: ServicesDep) -> JSONResponse:
    """Ready for traffic: the database answers and its schema is this code's (`monologue migrate` has run). Temporal
    is checked and reported too, but does not make the API unready: a Temporal blip would take every replica out
    of the Service at once, while a ready API answers what the database knows and 503 with Retry-After to what
    needs Temporal (api/outages.py)."""
    problems: dict[str, str] = {}

    def database() -> str | None:
        with services.sessions() as db:
            return schema_problem(db.connection())

    try:
        if (schema := await asyncio.wait_for(asyncio.to_thread(database), PROBE_TIMEOUT_S)) is not None:
            problems["schema"] = schema
    except (SQLAlchemyError, TimeoutError) as err:
        problems["database"] = _first_line(err) or "no answer within the probe timeout"
    try:
        timeout = timedelta(seconds=PROBE_TIMEOUT_S)
        if not await services.temporal.service_client.check_health(timeout=timeout):
            problems["temporal"] = "the frontend reports itself not serving"
    except Exception as err:  # any RPC failure, a lazy client's failed connect included: not reachable
        problems["temporal"] = _first_line(err) or type(err).__name__
    checks = {name: name not in problems for name in ("database", "schema", "temporal")}
    ready = checks["database"] and checks["schema"]
    status = "ready" if not problems else "ready, without Temporal" if ready else "not ready"
    body = {"status": status, "checks": checks, "problems": problems}
    if ready:
        return JSONResponse(body)
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(outages.RETRY_AFTER_S)})


@router.get("/metrics", response_class=Response, include_in_schema=False)  # Prometheus text, not an API
def prometheus_metrics(request: Request) -> Response:
    """This process's metrics, its HTTP requests, and (from one replica per cluster) the sessions still going."""
    app_metrics: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(REGISTRY) + generate_latest(app_metrics), media_type=CONTENT_TYPE_LATEST)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]
