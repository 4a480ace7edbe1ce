"""Dependencies shared by routes: the process's services, held on `app.state`, and database sessions.

A route holds a database connection only while its own code runs, never while its response streams and never
across an await, so that slow clients (event streams, downloads) cannot empty the pool every tenant needs:
- plain `def` routes take `DbDep`, a session closed as soon as the route function returns (`scope="function"`),
  before the response is sent;
- `async def` routes never take `DbDep` and never open a session on the event loop: they hand short pieces of
  database work to the thread pool with `with_db`. `tests/api/test_route_rules.py` holds every route to this."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Concatenate, ParamSpec, TypeVar

import structlog
from fastapi import Depends, HTTPException, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from monologue import apikeys
from monologue.settings import Settings
from monologue.storage import ObjectStore

from .origin import LOOPBACK_HOSTS, host_name


@dataclass
class Services:
    settings: Settings
    store: ObjectStore
    sessions: sessionmaker[Any]
    temporal: Client


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_db(services: ServicesDep) -> Iterator[Session]:
    with services.sessions() as db:
        yield db


# Closed when the route function returns, not when the response ends: a streamed file or event stream must not
# keep a connection for as long as its client reads.
DbDep = Annotated[Session, Depends(get_db, scope="function")]

P = ParamSpec("P")
T = TypeVar("T")


async def with_db(
    services: Services, work: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`work(db, *args, **kwargs)` on the thread pool, in a session of its own that is closed before this returns:
    how an `async def` route reads or writes the database without blocking the event loop or holding a
    connection across its awaits."""

    def run() -> T:
        with services.sessions() as db:
            return work(db, *args, **kwargs)

    return await run_in_threadpool(run)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant whose sessions they see, and the key's scopes."""

    tenant: str | None  # None: an operator on /ops, who sees every tenant
    scopes: tuple[str, ...]
    key_id: str | None


_NO_KEY = (
    "send an API key: 'Authorization: Bearer <key>' (create one with `monologue keys create --tenant NAME`,"
    " adding --ops for the ops UI; the embedded stack's own key is in <home>/api-key)"
)


def principal_from_headers(services: Services, authorization: str | None) -> Principal:
    """The caller from an Authorization header; HTTPException 401 without a valid key."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, _NO_KEY, headers={"WWW-Authenticate": "Bearer"})
    with services.sessions() as db:
        row = apikeys.authenticate(db, token.strip())
    if row is None:
        raise HTTPException(
            401,
            "the API key is not valid (or was revoked); create one with `monologue keys create --tenant NAME`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Principal(tenant=row.tenant, scopes=tuple(row.scopes), key_id=row.id)


# The key as OpenAPI's HTTP bearer scheme: each route that takes `TenantDep` or `OpsAccess` lists it under `security`
# (derived from the dependency, so a new route is documented as it behaves). It only reads the header; the checks
# are `principal_from_headers`'s.
BEARER = HTTPBearer(
    scheme_name="bearer",
    description="An API key (`monologue keys create --tenant NAME`): `Authorization: Bearer <key>`.",
    auto_error=False,
)
BearerDoc = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


def require_key(request: Request, services: ServicesDep, _bearer: BearerDoc) -> Principal:
    """Every /v1 route: a valid key; the caller then sees only its tenant's sessions."""
    # A request with a body was let in by api.guard, which checked its key before reading the body.
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:
        principal = principal_from_headers(services, request.headers.get("authorization"))
    structlog.contextvars.bind_contextvars(tenant=principal.tenant, key_id=principal.key_id)
    return principal


TenantDep = Annotated[Principal, Depends(require_key)]


def ops_access(request: Request, services: ServicesDep, _bearer: BearerDoc) -> Principal:
    """The operator's UI (`/ops`): a key with the `ops` scope, or, when MONOLOGUE_API__OPS_OPEN_ON_LOOPBACK is
    set, a browser on this machine without a key. Operators see every tenant."""
    authorization = request.headers.get("authorization")
    if authorization is None and services.settings.api.ops_open_on_loopback and from_this_machine(request):
        return Principal(tenant=None, scopes=("ops",), key_id=None)
    principal = principal_from_headers(services, authorization)
    if "ops" not in principal.scopes:
        raise HTTPException(403, "this API key has no 'ops' scope (create one with `monologue keys create --ops`)")
    return Principal(tenant=None, scopes=principal.scopes, key_id=principal.key_id)


OpsAccess = Annotated[Principal, Depends(ops_access)]


# Headers a reverse proxy adds: their presence means the socket's peer is the proxy, not the browser.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip")


def from_this_machine(request: Request) -> bool:
    """A browser on this machine talking to the API directly. The socket's peer must be loopback (`monologue
    api` runs uvicorn with proxy_headers off, so `request.client` is the real peer, whatever X-Forwarded-For
    says); no proxy may be in front (one on this machine makes every client on the internet look local); and
    the Host must be a loopback name (a page whose DNS name was pointed at 127.0.0.1 sends its own)."""
    peer = request.client.host if request.client else ""
    if not _loopback(peer) or any(name in request.headers for name in FORWARDING_HEADERS):
        return False
    return host_name(request.headers.get("host", "")) in LOOPBACK_HOSTS


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
