"""Which requests reach the routes at all, decided from the URL and headers (who calls is `deps.py`'s job).

- Every request, HTTP or WebSocket, must name this service in its `Host` header: public_url's host, a loopback
  name or one of MONOLOGUE_API__ALLOWED_HOSTS. Otherwise a web page can point its own DNS name at this
  machine and use the API as if it were its own site (DNS rebinding).
- A browser may change state (any method but GET, HEAD and OPTIONS, and every WebSocket) only from this
  service's own pages. A cross-site page can send a form POST it is not allowed to read the answer of (CSRF),
  and that is enough to cancel a render where /ops is open on loopback. Requests that carry neither `Origin`
  nor `Sec-Fetch-Site` (curl, the SDKs, the CLI) are not a browser's and pass.
- No URL may hold a NUL character: no id, name or filter has one, and PostgreSQL refuses strings that do (a
  500 on every route that looks one up).

It also builds every link the API hands out, from public_url: never from the request's `Host`, which the
client chooses. It must never admit a request that the settings do not name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from monologue.problems import PROBLEMS, ProblemCode
from monologue.settings import ApiSettings

from .problems import problem_response

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})  # none: typed into the address bar, a bookmark
_DEFAULT_PORTS = {"http": "80", "https": "443"}
# host[:port]: a bracketed IPv6 address or a name without ':', '/', '@' or spaces; the port digits only.
_NETLOC = re.compile(r"(?P<host>\[[0-9a-f:.]+\]|[^:\[\]/@\s]+)(?::(?P<port>\d*))?")
_URL_START = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<netloc>[^/?#]*)")  # what an origin keeps of a URL


def host_name(netloc: str) -> str:
    """The host of a `Host` header or a URL's netloc, lower-case and without its port (IPv6 keeps its
    brackets); "" when it is not a host[:port] at all."""
    match = _NETLOC.fullmatch(netloc.strip().lower())
    return match.group("host") if match else ""


def _origin(url: str) -> str:
    """scheme://host[:port] of a URL, lower-case, the scheme's default port left out (as browsers send it)."""
    start = _URL_START.match(url.strip().lower())
    netloc = _NETLOC.fullmatch(start.group("netloc")) if start else None
    if start is None or netloc is None or start.group("scheme") not in _DEFAULT_PORTS:
        return ""
    scheme, port = start.group("scheme"), netloc.group("port")
    keep_port = port and port != _DEFAULT_PORTS[scheme]
    return f"{scheme}://{netloc.group('host')}{':' + port if keep_port else ''}"


def public_base(api: ApiSettings) -> str:
    """The base of every HTTP link the API hands out (public_url, without a trailing slash)."""
    return str(api.public_url).rstrip("/")


def public_ws_base(api: ApiSettings) -> str:
    """The base of WebSocket links: public_url with http → ws and https → wss."""
    return "ws" + public_base(api).removeprefix("http")


@dataclass(frozen=True)
class HostPolicy:
    """The names this service answers to and the origins whose pages may change state, from the settings."""

    public_origin: str
    names: frozenset[str]  # exact host names, loopback names and public_url's host included
    suffixes: tuple[str, ...]  # '.example.com' for each '*.example.com'
    any_host: bool  # '*' in allowed_hosts: every Host passes (no DNS-rebinding protection)
    # Pages (MONOLOGUE_LINKS__CORS_ORIGINS) whose scripts may open an audio socket with a ticket: a ticket is a
    # capability the page was handed, not an ambient credential a cross-site page could ride on.
    ticket_origins: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, api: ApiSettings, *, ticket_origins: list[str] | None = None) -> HostPolicy:
        public_origin = _origin(str(api.public_url))
        if not public_origin:
            raise ValueError(
                f"MONOLOGUE_API__PUBLIC_URL={api.public_url!r} is not an http(s) URL such as https://avatar.example.com"
            )
        public_host = host_name(public_origin.partition("://")[2])
        if api.ops_open_on_loopback and public_host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"MONOLOGUE_API__OPS_OPEN_ON_LOOPBACK=true is for a machine whose API is reached on loopback only, but"
                f" MONOLOGUE_API__PUBLIC_URL={api.public_url} names {public_host}: behind a reverse proxy every client"
                " looks local. Turn one of them off (operators then sign in with a key that has the 'ops' scope)"
            )
        patterns = [pattern.strip().lower() for pattern in api.allowed_hosts]
        return cls(
            public_origin=public_origin,
            names=LOOPBACK_HOSTS | {public_host} | {p for p in patterns if not p.startswith("*")},
            suffixes=tuple(p[1:] for p in patterns if p.startswith("*.")),
            any_host="*" in patterns,
            ticket_origins=frozenset(_origin(entry) or entry.strip() for entry in ticket_origins or []),
        )

    def allows_host(self, host_header: str) -> bool:
        return self.any_host or self._named(host_name(host_header))

    def allows_origin(self, origin: str, host_header: str) -> bool:
        """A page's origin may change state here: public_url's origin, the origin the request itself was sent
        to (a proxy in front may have ended TLS, so any scheme), or a host the settings name ('*' does not
        count: it names no one)."""
        normalized = _origin(origin)
        if not normalized:  # "null" (sandboxed frames, file:) or garbage
            return False
        netloc = normalized.partition("://")[2]
        same_as_request = netloc == host_header.strip().lower() or normalized == self.public_origin
        return same_as_request or self._named(host_name(netloc))

    def _named(self, host: str) -> bool:
        return bool(host) and (host in self.names or host.endswith(self.suffixes))


# Kubelets and Prometheus reach a pod by its address, which is no name the API answers to; these GETs hold no
# tenant's data (api/routes/health.py), so the Host check does not apply to them.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class RequestGuard:
    """ASGI middleware: the Host and URL checks on every request, the same-origin check on state-changing ones."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        code, message = refusal
        response = problem_response(PROBLEMS[code].status, message, code=code, instance=scope["path"])
        if scope["type"] == "http":
            await response(scope, receive, send)
        else:
            await _refuse_websocket(WebSocket(scope, receive, send), response)

    def refusal(self, scope: Scope) -> tuple[ProblemCode, str] | None:
        """(problem code, message) when the request may not go on, else None."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        probe = scope["type"] == "http" and scope["method"] in SAFE_METHODS and scope["path"] in PROBE_PATHS
        if not probe and not self.policy.allows_host(host):
            return ProblemCode.HOST_NOT_ALLOWED, (
                f"Host {host!r} is not a name this API answers to: send the host of {self.policy.public_origin}, or"
                " add this name to MONOLOGUE_API__ALLOWED_HOSTS (set MONOLOGUE_API__PUBLIC_URL to the URL clients use)"
            )
        if "\x00" in scope["path"] or b"\x00" in unquote_to_bytes(scope["query_string"]):
            return ProblemCode.BAD_REQUEST, "the URL holds a NUL character (%00); no id, name or filter here has one"
        if scope["type"] == "http" and scope["method"] in SAFE_METHODS:
            return None
        origin, site = headers.get("origin"), headers.get("sec-fetch-site")
        if scope["type"] == "websocket" and origin is not None and self._ticket_socket(scope, origin):
            return None
        if origin is not None and not self.policy.allows_origin(origin, host):
            return ProblemCode.CROSS_SITE_REQUEST, (
                f"a page at {origin} may not change anything here: only this API's own pages may"
                f" ({self.policy.public_origin}, MONOLOGUE_API__PUBLIC_URL, or a host in MONOLOGUE_API__ALLOWED_HOSTS)"
            )
        if site is not None and site.lower() not in SAME_ORIGIN_FETCH_SITES:
            return ProblemCode.CROSS_SITE_REQUEST, (
                f"a {site} request may not change anything here (Sec-Fetch-Site: {site}): only pages served from"
                f" this API's own origin may ({self.policy.public_origin}, MONOLOGUE_API__PUBLIC_URL)"
            )
        return None

    def _ticket_socket(self, scope: Scope, origin: str) -> bool:
        """A handshake with a ticket from a page the operator named (the socket then checks the ticket)."""
        origins = self.policy.ticket_origins
        named = "*" in origins or _origin(origin) in origins
        return named and b"ticket=" in scope["query_string"]


async def _refuse_websocket(websocket: WebSocket, response: JSONResponse) -> None:
    """Refuse the handshake with the HTTP answer where the server can send one; else close before accepting
    (uvicorn then answers 403)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        await websocket.close(code=1008)


def browser_access(app: FastAPI, origins: list[str]) -> None:
    """CORS for pages at `origins` (MONOLOGUE_LINKS__CORS_ORIGINS): they may GET what needs no key, the playback
    links. No credentials and no Authorization header cross: an API key never belongs in a browser."""
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "HEAD"],
            allow_headers=["Range", "Last-Event-ID"],
            expose_headers=["Content-Length", "Content-Range", "Accept-Ranges"],
            allow_credentials=False,
            max_age=600,
        )
