"""`Bounds`: what an option accepts, kept with its definition. Standard library only."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time.
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """What an option accepts, kept with its definition (`Annotated[int, Bounds(...)]`): the API's schema, the
    settings and the CLI read it from here (`monologue/options.py`), so a limit is written once."""

    doc: str
    ge: float | None = None
    le: float | None = None
    pattern: str | None = None
    max_length: int | None = None
    multiple_of: int | None = None
    # The default a new session gets (the HTTP form, the settings, the CLI), where it differs from the field's
    # dataclass default, which is what an input recorded before the option existed means (a running session's
    # Temporal payloads and stored rows have no such field). None: the dataclass default serves both.
    new_sessions: object = None
