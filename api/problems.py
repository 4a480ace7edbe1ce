"""Every error as RFC 9457 problem details (`application/problem+json`), and the public OpenAPI schema that says so.

`install(app)` registers the handlers (HTTPException, FastAPI's own validation errors, the submit errors, anything
unexpected) and replaces the app's schema with the public one: the `/v1` and playback routes (the operator's `/ops`
routes have their own schema, `ops_schema`), every error response a `Problem` under `application/problem+json`,
and FastAPI's validation-error models gone. The ASGI layers in front of the routes (`guard.py`, `origin.py`) answer
with `problem_response` too. `detail` stays a sentence saying what to fix, as before; `errors` lists FastAPI's
validation problems one by one."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import RouteContext, iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from monologue.schemas import Problem

from . import outages, queue
from .errors import IdempotencyConflict, NoNodeForLive, TooManySessions, ValidationUnavailable

PROBLEM_JSON = "application/problem+json"
OPS_PREFIX = "/ops"
log = structlog.get_logger("api.problems")


def problem_response(
    status: int, detail: str, *, instance: str | None = None, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """One problem: `status` with its phrase as the title and `detail` naming what to fix."""
    problem = Problem(title=HTTPStatus(status).phrase, status=status, detail=detail, instance=instance, **extra)
    body = problem.model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}), media_type=PROBLEM_JSON)


def unavailable(
    service: str, err: BaseException, *, instance: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The answer while `service` (`outages.which_service`) is down: 503 with Retry-After, the error logged."""
    log.warning("service unavailable", service=service, error=(str(err).splitlines() or [""])[0][:300])
    detail = f"{service} is unavailable right now; try again in a few seconds"
    retry = {**(headers or {}), "Retry-After": str(outages.RETRY_AFTER_S)}
    return problem_response(503, detail, instance=instance, headers=retry)


def describe_errors(errors: Sequence[Any]) -> str:
    """Validation errors as one sentence: 'body.portrait: Field required; query.limit: …'; an error about the
    whole request (no location, e.g. sizes that do not fit together) is its message alone."""
    return "; ".join(_describe_error(error) for error in errors)


def _describe_error(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return f"{where}: {message}" if where else message


def install(app: FastAPI) -> None:
    """Problem details for every error, and the public OpenAPI schema."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return problem_response(err.status_code, str(err.detail), instance=request.url.path, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in err.errors()]
        return problem_response(422, describe_errors(errors), instance=request.url.path, errors=errors)

    @app.exception_handler(TooManySessions)
    async def too_many(request: Request, err: TooManySessions) -> JSONResponse:
        services = request.app.state.services
        seconds = await run_in_threadpool(queue.retry_after_s, services, err.tenant or _caller_tenant(request))
        return problem_response(429, str(err), instance=request.url.path, headers={"Retry-After": str(seconds)})

    @app.exception_handler(IdempotencyConflict)
    async def reused_key(request: Request, err: IdempotencyConflict) -> JSONResponse:
        return problem_response(422, str(err), instance=request.url.path)

    @app.exception_handler(ValidationUnavailable)
    async def no_validator(request: Request, err: ValidationUnavailable) -> JSONResponse:
        return problem_response(503, str(err), instance=request.url.path, headers={"Retry-After": "10"})

    @app.exception_handler(NoNodeForLive)
    async def no_node(request: Request, err: NoNodeForLive) -> JSONResponse:
        retry = str(max(1, math.ceil(err.retry_after_s)))
        return problem_response(503, str(err), instance=request.url.path, headers={"Retry-After": retry})

    async def maybe_outage(request: Request, err: Exception) -> JSONResponse:
        """A service beneath is down for now (restarting, failing over): 503, and the client tries again. Handled
        by type, so the server keeps the connection (the catch-all below ends it, as an ASGI error does)."""
        service = outages.which_service(err)
        if service is None:
            return await unexpected(request, err)
        return unavailable(service, err, instance=request.url.path)

    for error_type in outages.ERROR_TYPES:
        app.add_exception_handler(error_type, maybe_outage)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error", error=str(err))
        return problem_response(500, "an unexpected error; it is logged on the server", instance=request.url.path)

    def public_schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            routes = [
                route for route in iter_route_contexts(app.routes) if not (route.path or "").startswith(OPS_PREFIX)
            ]
            app.openapi_schema = schema_for(app, routes)
        return app.openapi_schema

    app.openapi = public_schema  # type: ignore[method-assign]


def _caller_tenant(request: Request) -> str:
    """The tenant of the key that sent a /v1 request with a body (the upload guard checked it), as the create
    routes name it."""
    principal = getattr(request.state, "principal", None)
    return (principal.tenant if principal is not None else None) or "local"


def schema_for(app: FastAPI, routes: Sequence[BaseRoute | RouteContext], *, title: str | None = None) -> dict[str, Any]:
    """The OpenAPI schema of `routes`, every error response a Problem under application/problem+json."""
    schema = get_openapi(
        title=title or app.title, version=app.version, description=app.description, routes=list(routes)
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for model in ("HTTPValidationError", "ValidationError"):
        components.pop(model, None)
    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for code, response in responses.items():
                if code == "default" or int(code) >= 400:
                    response["content"] = problem
            if path.startswith("/v1/") and "401" not in responses:
                responses["401"] = {"description": "No valid API key.", "content": problem}
            responses.setdefault("default", {"description": "An error (problem details).", "content": problem})
    return schema


def ops_routes(app: FastAPI) -> list[RouteContext]:
    """The operator's JSON routes (`/ops/api`), for their own schema."""
    return [route for route in iter_route_contexts(app.routes) if (route.path or "").startswith(f"{OPS_PREFIX}/api")]
