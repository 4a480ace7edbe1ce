"""The FastAPI application: `create_app(settings)` wires the services once per process."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry

from monologue import __version__, temporal_client, tracing
from monologue.db import make_engine, make_sessionmaker
from monologue.exporter_lock import ExporterLock
from monologue.logs import configure_logging, redact_query_strings
from monologue.metrics import HttpMetrics, LeaseBacklogCollector, SessionsCollector
from monologue.settings import Settings, get_settings
from monologue.storage import open_store

from . import links, openapi, problems
from .backlog import BacklogPoller
from .deps import Services
from .guard import UploadGuard
from .http_metrics import HttpMetricsMiddleware
from .origin import HostPolicy, RequestGuard, browser_access
from .routes import (
    assets,
    avatars,
    deletes,
    health,
    live,
    ops,
    playback,
    problems as problem_pages,
    renders,
    sessions,
    webhooks,
)

log = structlog.get_logger("api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    redact_query_strings()  # audio tickets ride in WebSocket URLs: never into a log line

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.db_url, settings.database_pool)
        # Lazy: the API starts (and /readyz says why it is not ready) while Temporal is still coming up.
        temporal = await temporal_client.connect(
            settings.temporal, metrics_address=_temporal_metrics(settings), lazy=True
        )
        sessions_ = make_sessionmaker(engine)
        # A request gives storage a short while, then answers 503 (live audio waits longer: api/live_socket.py).
        store = open_store(settings.storage, retry_for_s=settings.storage.request_retry_for_s)
        app.state.services = Services(settings=settings, store=store, sessions=sessions_, temporal=temporal)
        exporter = ExporterLock(engine)  # the sessions gauge from one replica per cluster
        # The lease queue's backlog for the node autoscaler: polled in the background, never on a request's path.
        backlog = BacklogPoller.for_settings(temporal, settings)
        collectors = [SessionsCollector(sessions_, exporter), LeaseBacklogCollector(backlog.figures)]
        for collector in collectors:
            registry.register(collector)
        backlog.start()
        if (problem := links.unshared_key(settings, os.environ)) is not None:
            log.error("playback links will fail across replicas", problem=problem)
        log.info("api ready", temporal=settings.temporal.address)
        yield
        await backlog.stop()
        for collector in collectors:  # the app may start again (tests): its registry outlives this run
            registry.unregister(collector)
        exporter.close()  # another replica exports from its next scrape
        engine.dispose()

    app = FastAPI(
        title="Monologue",
        version=__version__,
        lifespan=lifespan,
        description="Turn a portrait and speech into a talking-avatar video.",
    )
    registry = app.state.metrics_registry = CollectorRegistry(auto_describe=True)  # this app's, beside REGISTRY
    app.include_router(health.router)
    app.include_router(renders.router)
    app.include_router(sessions.router)
    app.include_router(live.router)
    app.include_router(deletes.router)
    app.include_router(playback.router)
    app.include_router(webhooks.router)
    app.include_router(assets.router)
    app.include_router(avatars.router)
    app.include_router(problem_pages.router)
    app.include_router(ops.router)
    problems.install(app)  # every error as problem+json, with its code
    openapi.install(app)  # the public OpenAPI schema (no /ops)
    # A /v1 body's key and size are checked before any of it is read (added first: runs after the Host checks).
    app.add_middleware(UploadGuard)
    # Host, URL and same-origin checks before any route; a conflicting setting stops the API here, at its start.
    policy = HostPolicy.from_settings(settings.api, ticket_origins=settings.links.cors_origins)
    app.add_middleware(RequestGuard, policy=policy)
    browser_access(app, settings.links.cors_origins)  # outermost: CORS for playback links (GET only)

    @app.middleware("http")
    async def bind_request(request: Request, call_next):  # type: ignore[no-untyped-def]
        with structlog.contextvars.bound_contextvars(method=request.method, path=request.url.path):
            response: Response = await call_next(request)
            return response

    # Every request by route template, those the guards refuse included (they answer before any route matches).
    app.add_middleware(HttpMetricsMiddleware, metrics=HttpMetrics.on(registry))
    tracing.instrument_app(app)  # outermost: the server span covers the guards and CORS too
    return app


def _temporal_metrics(settings: Settings) -> str | None:
    port = settings.api.temporal_metrics_port
    return None if port is None else f"{settings.api.host}:{port}"


def app_factory() -> FastAPI:
    """Entry point for uvicorn (`--factory`): settings from the environment."""
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    tracing.configure(settings.tracing, "monologue-api")
    return create_app(settings)
