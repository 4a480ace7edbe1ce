"""The house's floors, checked over every import statement in the tree (lazy ones inside functions too):

    cli ─┬─▶ node ─┬─▶ workflows ──┐
         │         └─▶ activities ─┼─▶ gpu_worker ─▶ monologue
         └─▶ api ──────────────────┘      (api, workflows, activities and gpu_worker all stand on monologue)

`cli/` (commands, benches, the embedded stack) and `node/` (the node process, its port, registry and torchrun
launcher) are the entry floor: they start things, so they stand above everything they use. `api/` starts workflows
by name and never imports `workflows/`, `activities/` or `gpu_worker/`; `workflows/` imports only the standard
library, temporalio and the stdlib-only contracts (tests/workflows/test_sandbox_imports.py); `gpu_worker/` never
imports temporalio. Nothing imports upward, and no two modules import each other (a package's `__init__` re-exporting
its own submodules aside), except under `TYPE_CHECKING`."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("cli", "node", "api", "workflows", "activities", "gpu_worker", "monologue", "migrations")
MAY_IMPORT = {
    "cli": {"node", "api", "workflows", "activities", "gpu_worker", "monologue", "migrations"},
    "node": {"workflows", "activities", "gpu_worker", "monologue"},
    "api": {"monologue"},
    "workflows": {"monologue"},
    "activities": {"gpu_worker", "monologue"},
    "gpu_worker": {"monologue"},
    "monologue": set(),
    "migrations": {"monologue"},
}
THIRD_PARTY_REFUSED = {"gpu_worker": {"temporalio"}, "api": {"torch", "cv2", "av", "PIL"}}
# The one exception, and why: live audio at rates other than 16 kHz is resampled with PyAV where it is installed
# (a lazy import; an API without it answers such a socket with a clear error).
LAZY_EXCEPTIONS = {("api.live_resample", "av")}


def _modules() -> dict[str, Path]:
    found = {}
    for floor in FLOORS:
        for path in (ROOT / floor).rglob("*.py"):
            found[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> Iterator[tuple[str, bool]]:
    """(module imported, under TYPE_CHECKING) for every import statement in `path` (module `name`)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            # `from pkg import submodule` imports the submodule; `from pkg import name` the package.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            yield target, id(node) in type_only


def _graph() -> dict[str, set[str]]:
    """Module → the project modules it imports at run time."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for target, type_only in _imported(name, path):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not type_only:
                graph[name].add(target)
    return graph


def test_no_import_runs_back_up_the_house() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in _graph().items()
        for target in targets
        if target.split(".")[0] != name.split(".")[0] and target.split(".")[0] not in MAY_IMPORT[name.split(".")[0]]
    )
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def test_floors_keep_out_the_libraries_they_must_not_load() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, path in MODULES.items()
        for target, _ in _imported(name, path)
        if target.split(".")[0] in THIRD_PARTY_REFUSED.get(name.split(".")[0], set())
        and (name, target.split(".")[0]) not in LAZY_EXCEPTIONS
    )
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_two_modules_import_each_other() -> None:
    assert _cycles(_graph()) == []


def test_the_checks_see_an_upward_import_and_a_circle() -> None:
    """The checks can fail: a made-up graph with a circle is found, and the real tree has imports to judge."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = _graph()
    assert "activities.node" in graph and any(t.startswith("gpu_worker") for t in graph["activities.node"])
