"""Command-line options made from a model's fields: one `--name` per field of a pydantic model, with its type,
bounds, allowed values and description, so an option added to the model appears in `monologue render --help`
(and `live`) with no edit here.

Every option defaults to None, meaning "not given": the server fills it from its own defaults
(MONOLOGUE_RENDER__*), exactly as for an HTTP client that leaves a form field out. Structured fields (a list of
sinks) take JSON, which the API validates like the form field of the same name."""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import annotated_types
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

F = TypeVar("F", bound=Callable[..., Any])


def model_options(model: type[BaseModel]) -> Callable[[F], F]:
    """A decorator adding one option per field of `model`; the command receives them as keyword arguments
    named after the fields (None when not given). `given_options(kwargs, model)` picks them out again."""

    def decorate(command: F) -> F:
        for name, info in reversed(model.model_fields.items()):  # click lists options in decoration order
            command = _option(name, info)(command)
        return command

    return decorate


def given_options(values: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """The model's options the user gave, ready for the API's form (JSON fields as parsed JSON text)."""
    return {name: values[name] for name in model.model_fields if values.get(name) is not None}


def _option(name: str, info: FieldInfo) -> Callable[[F], F]:
    flag = "--" + name.replace("_", "-")
    help_text = f"{info.description or name} [default: the server's, MONOLOGUE_RENDER__{name.upper()}]"
    kind = _scalar(info.annotation)
    if kind is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text)
    if kind is None:  # a list or a model: JSON, checked here for syntax and by the API for meaning
        return click.option(flag, name, default=None, callback=_json_text, metavar="JSON", help=help_text)
    return click.option(flag, name, type=_click_type(kind, info), default=None, help=help_text)


def _scalar(annotation: Any) -> Any:
    """The field's plain type (int, float, str, bool, a Literal or an Enum), or None for anything structured."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _scalar(args[0])  # `int | None`: an optional int
    if typing.get_origin(annotation) is typing.Literal:
        return annotation
    if isinstance(annotation, type) and issubclass(annotation, (bool, int, float, str, enum.Enum)):
        return annotation
    return None


def _click_type(kind: Any, info: FieldInfo) -> click.ParamType[Any, Any]:
    if typing.get_origin(kind) is typing.Literal:
        return click.Choice([str(value) for value in typing.get_args(kind)])
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return click.Choice([str(member.value) for member in kind])
    if kind in (int, float):
        low: Any = next((bound.ge for bound in info.metadata if isinstance(bound, annotated_types.Ge)), None)
        high: Any = next((bound.le for bound in info.metadata if isinstance(bound, annotated_types.Le)), None)
        return click.IntRange(low, high) if kind is int else click.FloatRange(low, high)
    return click.STRING


def _json_text(_context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            json.loads(value)
        except json.JSONDecodeError as err:
            raise click.BadParameter(f"not valid JSON ({err.msg} at character {err.pos})", param=parameter) from None
    return value
