"""What a session request carries besides its uploads: the option form fields (derived from
`contracts.RenderOptions`), their validation over the server's defaults and the operator's sink allow-lists,
and query filters that name an enum. Shared by the renders, live sessions and ops routes."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Form, HTTPException
from pydantic import ValidationError

from monologue import apikeys, contracts as c, options as options_, sink_policy

from .deps import Services
from .problems import describe_errors

E = TypeVar("E", bound=StrEnum)


def option_form(cls: Any = c.RenderOptions) -> Callable[..., dict[str, Any]]:
    """A dependency taking every session option as an optional form field, derived from `contracts.RenderOptions`
    (its types, so OpenAPI lists them, and its help text); the sinks come as a JSON string."""
    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[(str if name == options_.SINKS else base) | None, Form(description=bounds.doc)],
        )
        for name, base, bounds, _default in options_.option_fields(cls)
    ]

    def option_fields(**fields: Any) -> dict[str, Any]:
        """The option form fields renders and live sessions share (those left out are not in the dict)."""
        given = {name: value for name, value in fields.items() if value is not None}
        if options_.SINKS in given:
            given[options_.SINKS] = parse_sinks(given[options_.SINKS])
        return {name: value for name, value in given.items() if value is not None}

    option_fields.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return option_fields


OptionFields = Annotated[dict[str, Any], Depends(option_form())]


def enum_filter(enum: type[E], value: str | None, name: str) -> E | None:
    """A query filter's value as its enum (empty: no filter); 422 naming the allowed values otherwise. Kept a
    string in the route's signature so an empty `?status=` (a form's "any") stays valid."""
    if not value:
        return None
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise HTTPException(422, f"{name}: {value!r} is not one of {allowed}") from None


def validated_options(
    services: Services, given: dict[str, Any], *, tenant: str, scopes: tuple[str, ...]
) -> c.RenderOptions:
    """The session's options: what was given over the server's defaults (`MONOLOGUE_RENDER__*`); 422 if bad,
    or if a sink is not one the operator allows `tenant` (`MONOLOGUE_SINKS__*`); 403 if the caller's key (its
    `scopes`) may not ask for what it asked (`check_priority`)."""
    try:
        options: c.RenderOptions = options_.merge(services.settings.render, given)
    except ValidationError as err:
        raise HTTPException(422, describe_errors(err.errors())) from err
    check_priority(options, given, scopes)
    for sink in options.sinks:
        problem = sink_policy.refusal(sink, tenant=tenant, allowed=services.settings.sinks)
        if problem is not None:
            raise HTTPException(422, f"sinks: {problem}")
    return options


def check_priority(options: c.RenderOptions, given: dict[str, Any], scopes: tuple[str, ...]) -> None:
    """403 for `priority=high` asked by a key with none of `apikeys.HIGH_PRIORITY_SCOPES`: high jumps every normal
    render of every tenant, so the operator grants it. Low and normal are open to all, and a server default of high
    (`MONOLOGUE_RENDER__PRIORITY`) is the operator's own choice: only a priority the request asks for is checked."""
    if options.priority is not c.RenderPriority.HIGH or "priority" not in given:
        return
    if apikeys.HIGH_PRIORITY_SCOPES.isdisjoint(scopes):
        raise HTTPException(
            403,
            f"priority: {c.RenderPriority.HIGH.value} needs a key with the '{apikeys.Scope.PRIORITY.value}' scope"
            f" (`monologue keys create --tenant NAME --scope {apikeys.Scope.PRIORITY.value}`); this key's scopes:"
            f" {', '.join(scopes) or 'none'}. Send normal or low, or leave priority out",
        )


MAX_JSON_DEPTH = 16  # JSON the API reads (sinks, audio socket messages) nests far less; Python's parser recurses
_JSON_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def parse_json(text: str) -> Any:
    """`json.loads(text)`, refusing nesting deeper than MAX_JSON_DEPTH before the parser recurses (thousands of
    `[` would otherwise raise RecursionError: a 500). ValueError with a message for the caller otherwise."""
    depth = 0
    for bracket in _NOT_BRACKETS.sub("", _JSON_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at character {err.pos})") from None


def parse_sinks(text: str | None) -> list[Any] | None:
    """The `sinks` form field: a JSON list (validated with the other options)."""
    if text is None or not text.strip():
        return None
    try:
        value = parse_json(text)
    except ValueError as err:
        raise HTTPException(422, f"sinks: {err}") from None
    if not isinstance(value, list):
        raise HTTPException(422, 'sinks: expected a JSON list, e.g. [{"type": "s3", "bucket": "videos"}]')
    return value
