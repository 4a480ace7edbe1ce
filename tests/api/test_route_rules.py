"""The API's rules for database connections, checked over the route table and the source (api/deps.py says why):
an `async def` route takes no request-scoped database session and no coroutine in `api/` opens one or calls the
data-access modules on the event loop; every request-scoped session closes when its route function returns, before
the response (a stream, a file) is sent."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute, iter_route_contexts

from api.app import create_app
from api.deps import get_db
from monologue.settings import Settings

API = Path(__file__).resolve().parents[2] / "api"
# Modules whose functions take a database session: a coroutine must hand them to the thread pool (`with_db`).
DATA_ACCESS = {
    "repo",
    "repo_ops",
    "repo_nodes",
    "repo_queue",
    "repo_webhooks",
    "repo_idempotency",
    "apikeys",
    "audio_tickets",
}


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dependency in dependant.dependencies:
        yield dependency
        yield from _dependencies(dependency)


def _routes(tmp_path: Path) -> list[APIRoute | APIWebSocketRoute]:
    app = create_app(Settings(home=tmp_path))
    contexts = iter_route_contexts(app.routes)  # routers are included as such: their routes, with full paths
    return [context.route for context in contexts if isinstance(context.route, APIRoute | APIWebSocketRoute)]


def test_no_async_route_takes_a_request_scoped_database_session(tmp_path: Path) -> None:
    routes = _routes(tmp_path)
    offenders = [
        f"{route.path} ({route.endpoint.__name__})"
        for route in routes
        if inspect.iscoroutinefunction(route.endpoint)
        and any(dependency.call is get_db for dependency in _dependencies(route.dependant))
    ]
    assert not offenders, f"async routes with DbDep (use `with_db` instead): {offenders}"
    assert any(dependency.call is get_db for route in routes for dependency in _dependencies(route.dependant))


def test_request_scoped_sessions_close_before_the_response_is_sent(tmp_path: Path) -> None:
    scopes = {
        dependency.scope
        for route in _routes(tmp_path)
        for dependency in _dependencies(route.dependant)
        if dependency.call is get_db
    }
    assert scopes == {"function"}


def _event_loop_database_calls(tree: ast.AST) -> Iterator[str]:
    """`name:line` of each database call made directly in a coroutine (not in a function nested inside it, which
    is how work is handed to the thread pool)."""
    for function in ast.walk(tree):
        if not isinstance(function, ast.AsyncFunctionDef):
            continue
        pending: list[ast.AST] = list(function.body)
        while pending:
            node = pending.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            pending.extend(ast.iter_child_nodes(node))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func
                owner = target.value.id if isinstance(target.value, ast.Name) else None
                if target.attr == "sessions" or owner in DATA_ACCESS:
                    yield f"{function.name}:{node.lineno} ({ast.unparse(target)})"


@pytest.mark.parametrize("path", sorted(API.rglob("*.py")), ids=lambda path: str(path.relative_to(API)))
def test_no_coroutine_touches_the_database_on_the_event_loop(path: Path) -> None:
    found = list(_event_loop_database_calls(ast.parse(path.read_text())))
    assert not found, f"{path.name}: database calls on the event loop (use `with_db` / the thread pool): {found}"


def test_the_source_check_finds_a_database_call_in_a_coroutine() -> None:
    """The check above can fail: a coroutine that opens a session or calls a data-access module is found, one that
    hands the work to a nested function is not."""
    source = """
async def bad(services):
    with services.sessions() as db:
        return repo.get_session(db, session_id="x")

async def good(services):
    def work():
        with services.sessions() as db:
            return repo.get_session(db, session_id="x")
    return await run_in_threadpool(work)
"""
    found = list(_event_loop_database_calls(ast.parse(source)))
    assert [entry.split(":")[0] for entry in found] == ["bad", "bad"]
