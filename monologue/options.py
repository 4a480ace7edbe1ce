"""Everything derived from `contracts.RenderOptions`, the one definition of a session's options.

The dataclass in `monologue/contracts/session.py` (standard library only: it crosses Temporal and enters the workflow
sandbox) holds each option's type, default and `Bounds` (limits and help text). From it, with nothing listed
again by hand:
- `request_model(cls)`: the pydantic model that validates a request (the HTTP schema, with OpenAPI's enums and
  limits), returning the dataclass from `.to_options()`;
- `form_model(cls)`: the same, every field optional (left out: the server's default) and the sinks as a JSON
  string, for multipart form fields;
- `partial_model(cls)`: every field optional with its own type (sinks a list), for JSON create bodies;
- `defaults_model(cls)`: the settings' per-render defaults (`MONOLOGUE_RENDER__*`);
- `cli_options(cls)`: the `monologue render` options.
Each takes the class, so a test can pass a copy with one more field and see it everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from enum import StrEnum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, Json, create_model, model_validator

from monologue.contracts import Bounds, RenderOptions
from monologue.contracts.frames import OUTPUT_SIZE

SINKS = "sinks"  # the one option that is a list of dataclasses (a tagged union) rather than a scalar


def option_fields(cls: Any = RenderOptions) -> list[tuple[str, Any, Bounds, Any]]:
    """(name, type, bounds, default) per field of an options dataclass, in definition order; the default is
    a new session's (`Bounds.new_sessions` where given)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found = []
    for spec in dataclasses.fields(cls):
        base, bounds = _split(hints[spec.name])
        default = spec.default if spec.default is not dataclasses.MISSING else ...
        if bounds.new_sessions is not None:  # what new sessions get; the dataclass default is for old inputs
            default = bounds.new_sessions
        found.append((spec.name, base, bounds, default))
    return found


def _split(hint: Any) -> tuple[Any, Bounds]:
    if get_origin(hint) is Annotated:
        base, *extras = get_args(hint)
        bounds = next((extra for extra in extras if isinstance(extra, Bounds)), Bounds(""))
        return base, bounds
    return hint, Bounds("")


def _field(bounds: Bounds, default: Any) -> Any:
    given = _limits(bounds)
    if isinstance(default, tuple):  # a tuple default is a list in JSON: a fresh one per instance
        return Field(default_factory=lambda: list(default), description=bounds.doc or None, **given)
    return Field(default, description=bounds.doc or None, **given)


def _limits(bounds: Bounds, *, lengths: bool = True) -> dict[str, Any]:
    limits: dict[str, Any] = {
        "ge": bounds.ge,
        "le": bounds.le,
        "pattern": bounds.pattern,
        "multiple_of": bounds.multiple_of,
    }
    if lengths:
        limits["max_length"] = bounds.max_length
    return {name: value for name, value in limits.items() if value is not None}


def _pydantic_type(base: Any) -> Any:
    """The dataclass field type as pydantic validates it: nested dataclasses become their own models, a union
    of them a union discriminated by `type`, a tuple a list (JSON has no tuples)."""
    origin = get_origin(base)
    if origin is tuple:
        return list[_pydantic_type(get_args(base)[0])]  # type: ignore[misc]
    if origin in (Union, types.UnionType):
        members = [arg for arg in get_args(base) if arg is not type(None)]
        if all(dataclasses.is_dataclass(arg) for arg in members):
            union = Union[tuple(request_model(arg) for arg in members)]  # type: ignore[valid-type]  # noqa: UP007
            return Annotated[union, Field(discriminator="type")]
    if dataclasses.is_dataclass(base) and isinstance(base, type):
        return request_model(base)
    return base


class _Derived(BaseModel):
    model_config = ConfigDict(extra="forbid")
    _source: typing.ClassVar[type[Any]]

    def to_options(self) -> Any:
        """The dataclass these values describe (its own checks run: __post_init__)."""
        names = [spec.name for spec in dataclasses.fields(self._source)]  # a subclass may add settings of its own
        return self._source(**{name: _to_value(getattr(self, name)) for name in names})

    @model_validator(mode="after")
    def _dataclass_checks(self) -> _Derived:
        self.to_options()  # a ValueError from __post_init__ becomes a validation error naming the problem
        return self


def _to_value(value: Any) -> Any:
    if isinstance(value, _Derived):
        return value.to_options()
    if isinstance(value, list):
        return tuple(_to_value(item) for item in value)
    return value


@functools.cache
def request_model(cls: Any = RenderOptions) -> type[_Derived]:
    """The pydantic model of an options dataclass: same fields, types, defaults and limits."""
    fields = {
        name: (_pydantic_type(base), _field(bounds, default)) for name, base, bounds, default in option_fields(cls)
    }
    model = create_model(f"{cls.__name__}Model", __base__=_Derived, __doc__=cls.__doc__, **fields)  # type: ignore[call-overload]
    model._source = cls
    return model  # type: ignore[no-any-return]


@functools.cache
def form_model(cls: Any = RenderOptions) -> type[BaseModel]:
    """The options as multipart form fields: every one optional (left out: the server's default), the sinks a
    JSON string. `given(form)` is what the client sent."""
    fields: dict[str, Any] = {}
    for name, base, bounds, _default in option_fields(cls):
        kind = Json[_pydantic_type(base)] if name == SINKS else _pydantic_type(base)  # type: ignore[misc]
        description = (
            f'{bounds.doc} JSON list, e.g. [{{"type": "s3", "bucket": "videos"}}]' if name == SINKS else bounds.doc
        )
        limits = _limits(bounds, lengths=name != SINKS)  # a JSON string's length is not the list's
        fields[name] = (kind | None, Field(None, description=description or None, **limits))
    model: type[BaseModel] = create_model(f"{cls.__name__}Form", __config__=ConfigDict(extra="forbid"), **fields)
    return model


@functools.cache
def partial_model(cls: Any = RenderOptions) -> type[BaseModel]:
    """The options as a JSON body's fields: every one optional (left out or null: the server's default), with
    `request_model`'s types and limits. `given(body)` is what the client sent."""
    fields: dict[str, Any] = {
        name: (_pydantic_type(base) | None, Field(None, description=bounds.doc or None, **_limits(bounds)))
        for name, base, bounds, _default in option_fields(cls)
    }
    model: type[BaseModel] = create_model(f"{cls.__name__}Fields", __config__=ConfigDict(extra="forbid"), **fields)
    return model


def given(form: BaseModel) -> dict[str, Any]:
    """The form fields the client sent (plain values; sinks as dicts), for merging over the defaults."""
    return form.model_dump(mode="json", exclude_none=True)


@functools.cache
def defaults_model(cls: Any = RenderOptions) -> type[BaseModel]:
    """The settings group of per-render defaults: every option with its default, as `MONOLOGUE_RENDER__<NAME>`."""
    return request_model(cls)


def merge(defaults: BaseModel, sent: dict[str, Any], cls: Any = RenderOptions) -> Any:
    """The session's options: what the client sent over the server's defaults (ValidationError if bad). The
    output size is one choice (`OUTPUT_SIZE`): a client giving any part of it replaces the default size whole, so
    a width and height sent over a server whose default is `resolution=720p` are the size, not a conflict."""
    names = {name for name, *_ in option_fields(cls)}
    if OUTPUT_SIZE & sent.keys():
        names -= OUTPUT_SIZE
    base = {k: v for k, v in defaults.model_dump(mode="json").items() if k in names}
    return request_model(cls).model_validate(base | sent).to_options()


def stored(options: Any) -> dict[str, Any]:
    """Plain JSON values of an options dataclass (the database's `options` column, the API's responses)."""
    model: type[_Derived] = request_model(type(options))  # type: ignore[arg-type]
    return model.model_validate(_plain(options)).model_dump(mode="json")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {spec.name: _plain(getattr(value, spec.name)) for spec in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


def choices(base: Any) -> list[str] | None:
    """The allowed values of an enum or Literal option (for the CLI and help texts)."""
    if isinstance(base, type) and issubclass(base, StrEnum):
        return [member.value for member in base]
    if get_origin(base) is Literal:
        return [str(arg) for arg in get_args(base)]
    return None
