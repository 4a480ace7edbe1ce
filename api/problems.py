"""Every error as RFC 9457 problem details (`application/problem+json`) with a stable machine-readable `code`
(`monologue.problems.ProblemCode`) and its `type` URI.

`install(app)` registers the handlers (HTTPException, FastAPI's own validation errors, the API's `Refusal`s,
outages, anything unexpected). The ASGI layers in front of the routes (`guard.py`, `origin.py`) answer with
`problem_response` too. An HTTPException's code is its status's (`CODE_OF_STATUS`); a `Refusal` names its own.
Every 429 and 503 carries Retry-After. `detail` stays a sentence saying what to fix; `errors` lists FastAPI's
validation problems one by one. The OpenAPI schema that documents all this is `api/openapi.py`'s."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from monologue.problems import PROBLEMS, Problem, ProblemCode, problem_type

from . import outages, queue
from .errors import Refusal, TooManySessions

PROBLEM_JSON = "application/problem+json"
# An HTTPException's code: the first code of its status in `PROBLEMS` (the general one; a Refusal names a narrower).
CODE_OF_STATUS: dict[int, ProblemCode] = {kind.status: code for code, kind in reversed(PROBLEMS.items())}
RETRY_STATUSES = frozenset({429, 503})  # the same request may pass later: always with Retry-After
log = structlog.get_logger("api.problems")


def code_of(status: int) -> ProblemCode:
    """The code of a plain HTTP error; a status no code names (none the API raises) gets its class's."""
    fallback = ProblemCode.INTERNAL_ERROR if status >= 500 else ProblemCode.BAD_REQUEST
    return CODE_OF_STATUS.get(status, fallback)


def problem_response(
    status: int,
    detail: str,
    *,
    code: ProblemCode | None = None,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """One problem: `status` with its phrase as the title, its `code` (the status's when not given) and `detail`
    naming what to fix. A 429 or 503 without Retry-After gets the outage's (a client must always learn when)."""
    code = code or code_of(status)
    problem = Problem(
        type=problem_type(code),
        code=code,
        title=HTTPStatus(status).phrase,
        status=status,
        detail=detail,
        instance=instance,
        **extra,
    )
    body = problem.model_dump(mode="json", exclude_none=True)
    answer_headers = dict(headers or {})
    if status in RETRY_STATUSES and not any(name.lower() == "retry-after" for name in answer_headers):
        answer_headers["Retry-After"] = str(outages.RETRY_AFTER_S)
    return JSONResponse(body, status_code=status, headers=answer_headers, media_type=PROBLEM_JSON)


def unavailable(
    service: str, err: BaseException, *, instance: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The answer while `service` (`outages.which_service`) is down: 503 with Retry-After, the error logged."""
    log.warning("service unavailable", service=service, error=(str(err).splitlines() or [""])[0][:300])
    detail = f"{service} is unavailable right now; try again in a few seconds"
    retry = {**(headers or {}), "Retry-After": str(outages.RETRY_AFTER_S)}
    return problem_response(503, detail, code=ProblemCode.SERVICE_UNAVAILABLE, instance=instance, headers=retry)


def describe_errors(errors: Sequence[Any]) -> str:
    """Validation errors as one sentence: 'body.portrait: Field required; query.limit: …'; an error about the
    whole request (no location, e.g. sizes that do not fit together) is its message alone."""
    return "; ".join(_describe_error(error) for error in errors)


def _describe_error(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return f"{where}: {message}" if where else message


def install(app: FastAPI) -> None:
    """Problem details for every error."""

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
        return _refused(request, err, {"Retry-After": str(seconds)})

    @app.exception_handler(Refusal)
    async def refused(request: Request, err: Refusal) -> JSONResponse:
        retry = {} if err.retry_after_s is None else {"Retry-After": str(max(1, math.ceil(err.retry_after_s)))}
        return _refused(request, err, retry)

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


def _refused(request: Request, err: Refusal, headers: Mapping[str, str]) -> JSONResponse:
    return problem_response(err.status, str(err), code=err.code, instance=request.url.path, headers=headers)


def _caller_tenant(request: Request) -> str:
    """The tenant of the key that sent a /v1 request with a body (the upload guard checked it), as the create
    routes name it."""
    principal = getattr(request.state, "principal", None)
    return (principal.tenant if principal is not None else None) or "local"
