"""Probes and metrics: `/healthz` (the process answers: liveness), `/readyz` (its database and Temporal answer:
readiness, 503 naming what is down) and `/metrics` (Prometheus). No key: kubelets and Prometheus scrape pod
addresses, so these three skip the Host check too (`api/origin.py`); they reveal no tenant's data."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from ..deps import ServicesDep
from .renders import operation_id

router = APIRouter(tags=["ops"], generate_unique_id_function=operation_id)
PROBE_TIMEOUT_S = 3.0  # a check slower than this counts as down: a probe must answer within its own timeout


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Alive: the process serves requests (it checks nothing else, so a database outage restarts no pod)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the database or Temporal does not answer"}})
async def readyz(services: ServicesDep) -> JSONResponse:
    """Ready for traffic: the database answers `SELECT 1` and Temporal's frontend its health check."""
    problems: dict[str, str] = {}

    def database() -> None:
        with services.sessions() as db:
            db.execute(text("SELECT 1"))

    try:
        await asyncio.wait_for(asyncio.to_thread(database), PROBE_TIMEOUT_S)
    except (SQLAlchemyError, TimeoutError) as err:
        problems["database"] = _first_line(err) or "no answer within the probe timeout"
    try:
        timeout = timedelta(seconds=PROBE_TIMEOUT_S)
        if not await services.temporal.service_client.check_health(timeout=timeout):
            problems["temporal"] = "the frontend reports itself not serving"
    except Exception as err:  # any RPC failure, a lazy client's failed connect included: not reachable
        problems["temporal"] = _first_line(err) or type(err).__name__
    checks = {name: name not in problems for name in ("database", "temporal")}
    body = {"status": "not ready" if problems else "ready", "checks": checks, "problems": problems}
    return JSONResponse(body, status_code=503 if problems else 200)


@router.get("/metrics", response_class=Response, include_in_schema=False)  # Prometheus text, not an API
def prometheus_metrics(request: Request) -> Response:
    """This process's metrics, and the sessions by kind and status from the database."""
    sessions: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(REGISTRY) + generate_latest(sessions), media_type=CONTENT_TYPE_LATEST)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]
