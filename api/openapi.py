"""The OpenAPI schemas: the public one (`/openapi.json`) and the operator's (`/ops/api/openapi.json`).

The public schema has the `/v1` and playback routes (the operator's `/ops` routes have their own, `schema_for` over
`ops_routes`); every error response a `Problem` under `application/problem+json`, listing the codes its status may
carry (`x-problem-codes`) and, for 429 and 503, `Retry-After`; FastAPI's validation-error models gone; the bearer
scheme on the routes that take a key (from their dependency, `api.deps.BEARER`); the JSON create bodies beside
multipart (a route's `openapi_extra`, from `json_body`); and a top-level `webhooks` section with one message per
`WebhookEvent`, its payload and its Standard Webhooks headers. Nothing here is listed by hand that a model, an enum
or a route already says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import RouteContext, iter_route_contexts
from pydantic import BaseModel, Field, create_model
from starlette.routing import BaseRoute

from monologue import webhooks
from monologue.problems import PROBLEMS, Problem
from monologue.schemas import WebhookEvent, WebhookMessage

from .problems import PROBLEM_JSON, RETRY_STATUSES

OPS_PREFIX = "/ops"
REF = "#/components/schemas/{model}"
RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer", "minimum": 1}}
}


def install(app: FastAPI) -> None:
    """The app's `/openapi.json`: the public schema (made once, on first use)."""

    def public_schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            routes = [
                route for route in iter_route_contexts(app.routes) if not (route.path or "").startswith(OPS_PREFIX)
            ]
            app.openapi_schema = schema_for(app, routes, with_webhooks=True)
        return app.openapi_schema

    app.openapi = public_schema  # type: ignore[method-assign]


def ops_routes(app: FastAPI) -> list[RouteContext]:
    """The operator's JSON routes (`/ops/api`), for their own schema."""
    return [route for route in iter_route_contexts(app.routes) if (route.path or "").startswith(f"{OPS_PREFIX}/api")]


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: `model` as an `application/json` request body beside the form FastAPI documents
    (its nested models go to the components when the schema is made)."""
    return {"requestBody": {"content": {"application/json": {"schema": model.model_json_schema(ref_template=REF)}}}}


def schema_for(
    app: FastAPI, routes: Sequence[BaseRoute | RouteContext], *, title: str | None = None, with_webhooks: bool = False
) -> dict[str, Any]:
    """The OpenAPI schema of `routes`, every error response a Problem under application/problem+json."""
    schema = get_openapi(
        title=title or app.title,
        version=app.version,
        description=app.description,
        routes=list(routes),
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    _add_model(components, Problem)
    for model in ("HTTPValidationError", "ValidationError"):
        components.pop(model, None)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            _document_errors(operation)
            for content in operation.get("requestBody", {}).get("content", {}).values():
                _hoist_definitions(components, content.get("schema", {}))
    if with_webhooks:
        schema["webhooks"] = webhook_messages(components)
    return schema


def _document_errors(operation: dict[str, Any]) -> None:
    problem = {PROBLEM_JSON: {"schema": {"$ref": REF.format(model="Problem")}}}
    responses = operation.setdefault("responses", {})
    if "security" in operation and "401" not in responses:
        responses["401"] = {"description": "No valid API key."}
    responses.setdefault("default", {"description": "An error (problem details)."})
    for status, response in responses.items():
        if status != "default" and int(status) < 400:
            continue
        response["content"] = problem
        if status != "default":
            response["x-problem-codes"] = [code.value for code, kind in PROBLEMS.items() if kind.status == int(status)]
            if int(status) in RETRY_STATUSES:
                response.setdefault("headers", {}).update(RETRY_AFTER)


def _add_model(components: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=REF)
    _hoist_definitions(components, schema)
    components[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}


def _hoist_definitions(components: dict[str, Any], schema: dict[str, Any]) -> None:
    """A pydantic schema's nested models (`$defs`, referenced as components already) into the components."""
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)


def message_model(event: WebhookEvent) -> type[WebhookMessage]:
    """The message of one event: `WebhookMessage` with its `type` fixed to the event."""
    name = "".join(part.title() for part in event.value.replace(".", "_").split("_")) + "Message"
    fixed = (Literal[event], Field(description="The event."))
    model: type[WebhookMessage] = create_model(name, __base__=WebhookMessage, type=fixed)  # type: ignore[arg-type]
    return model


def webhook_messages(components: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI 3.1 `webhooks`: what each event's POST to a tenant's endpoint (or a session's callback_url) carries."""
    headers = [
        {"name": name, "in": "header", "required": True, "schema": {"type": "string"}, "description": description}
        for name, description in webhooks.SIGNED_HEADERS.items()
    ]
    return {
        event.value: {
            "post": {
                "operationId": f"webhook_{event.name.lower()}",
                "summary": f"{event.value}: the session is {webhooks.STATUS_OF[event].value}",
                "description": f"{' '.join((WebhookEvent.__doc__ or '').split())} Verify `webhook-signature`"
                " before trusting the body (any Standard Webhooks library does, with the endpoint's `whsec_` secret, or"
                " the `callback_secret` of a session created with a `callback_url`).",
                "parameters": headers,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _add_model(components, message_model(event))}},
                },
                "responses": {
                    "2XX": {"description": "Received: the delivery ends. Any other answer (or none) is retried."}
                },
            }
        }
        for event in WebhookEvent
    }
