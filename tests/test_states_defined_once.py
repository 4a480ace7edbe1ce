"""Each stored state is one enum, defined once: no two enums spell the same values, every state column of the
database is typed with its enum, and no module compares a state to a bare string (a misspelt one would silently
match nothing). Read from the source (ast), so the check covers modules no test imports."""

from __future__ import annotations

import ast
from collections import Counter
from enum import StrEnum
from pathlib import Path

from monologue.contracts import ChunkKind, SessionKind, SessionStatus, SinkType
from monologue.db import Base, ChunkStatus, EnumText, NodeStatus
from monologue.schemas import DeliveryStatus, SinkState, WebhookEvent

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "activities", "workflows", "monologue", "gpu_worker")
# ChunkKind ("N", "I") is a key, not a state, and the engine's uses of it are the anchor rule's business.
STATES: tuple[type[StrEnum], ...] = (
    SessionKind,
    SessionStatus,
    ChunkStatus,
    SinkType,
    SinkState,
    NodeStatus,
    DeliveryStatus,
    WebhookEvent,
)
STATE_VALUES = {member.value for state in STATES for member in state}
# What a state is called where it is read: `row.status`, `spec["type"]`, `session.get("kind")`, a `status=` argument.
STATE_NAMES = {"status", "kind", "type", "event"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text())) for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
    ]


def _enums() -> list[tuple[str, str, frozenset[str]]]:
    """(module, name, its members' values as written) of every enum class in the source."""
    found = []
    for path, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(base).endswith("Enum") for base in node.bases):
                values = frozenset(ast.unparse(item.value) for item in node.body if isinstance(item, ast.Assign))
                found.append((str(path.relative_to(ROOT)), node.name, values))
    return found


def _named(node: ast.expr) -> str | None:
    """The name a compared value goes by: `x.status`, `status`, `x["status"]`, `x.get("status")`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = node.args[0]
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
    return None


def _bare_states(node: ast.expr) -> list[str]:
    """State values written as string literals in `node` (a literal, a tuple, list or set of them, or either arm
    of a conditional)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in STATE_VALUES else []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [value for element in node.elts for value in _bare_states(element)]
    if isinstance(node, ast.IfExp):
        return _bare_states(node.body) + _bare_states(node.orelse)
    return []


def test_each_enum_is_defined_once() -> None:
    """No two enums share a name or spell the same values (as `VideoLayout` and the client's `Layout` did)."""
    enums = _enums()
    names = Counter(name for _, name, _ in enums)
    assert [name for name, count in names.items() if count > 1] == []
    by_values: dict[frozenset[str], list[str]] = {}
    for module, name, values in enums:
        by_values.setdefault(values, []).append(f"{module}:{name}")
    assert [where for where in by_values.values() if len(where) > 1] == []


def test_every_state_column_is_typed_with_its_enum() -> None:
    """Stored as text (no migration), read back as the enum."""
    untyped = [
        f"{table.name}.{column.name}"
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if column.name in STATE_NAMES and not isinstance(column.type, EnumText)
    ]
    assert untyped == []
    typed = {
        (table.name, column.name): column.type.enum
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, EnumText)
    }
    assert set(typed.values()) <= {*STATES, ChunkKind}
    assert {("sinks", "kind"), ("sinks", "status"), ("nodes", "status"), ("chunks", "status")} <= set(typed)


def _uses_a_bare_state(node: ast.AST) -> bool:
    """`x.status == "done"`, `status="done"`, `default="done"`, `x.status = "done"` (or a tuple or conditional of
    such literals). A `Literal["s3"]` tag is exempt: that is where a value is defined (SinkType derives from it)."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(_named(side) in STATE_NAMES for side in sides) and any(_bare_states(side) for side in sides)
    if isinstance(node, ast.keyword):
        return node.arg in STATE_NAMES | {"default"} and bool(_bare_states(node.value))
    if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation).startswith("Literal["):
        return False
    if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and _bare_states(node.value):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(_named(target) in STATE_NAMES for target in targets)
    return False


def test_no_module_compares_or_writes_a_state_as_a_bare_string() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {ast.unparse(node)}"
        for path, module in _modules()
        for node in ast.walk(module)
        if _uses_a_bare_state(node)
    ]
    assert found == [], "use the enum member instead:\n" + "\n".join(found)
