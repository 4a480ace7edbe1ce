"""Counts and times every HTTP request the API answers (`monologue.metrics.HttpMetrics`), labelled by the matched
route's template (`/v1/renders/{render_id}`), never the raw path, so the label set stays as small as the route table.
Pure ASGI: it sees the response's status as it is sent, streams included, and a request that raised as the 500
the server answers. Every HTTP request is counted, `/metrics`, probes and those a guard refused before routing
(`unmatched`) included; WebSocket connections are not requests and are not counted here."""

from __future__ import annotations

import time
from http import HTTPMethod

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monologue.metrics import HttpMetrics

UNMATCHED = "unmatched"
_METHODS = frozenset(HTTPMethod)
OTHER_METHOD = "other"  # a method no route has: bounded, whatever a client sends


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before it responds
        timed = False

        def observe() -> None:
            nonlocal timed
            if not timed:
                timed = True
                self.metrics.duration.labels(method=_method(scope), route=route(scope)).observe(
                    time.perf_counter() - started
                )

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                observe()  # at the headers: the latency a client waits for, not a stream's length
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            observe()
            self.metrics.requests.labels(method=_method(scope), route=route(scope), status=str(status)).inc()


def route(scope: Scope) -> str:
    """The template of the route the router matched (its `path`: our routers declare their whole prefix, and are
    included without one), or `unmatched`."""
    matched = scope.get("route")
    path = getattr(matched, "path", None)
    return path if isinstance(path, str) else UNMATCHED


def _method(scope: Scope) -> str:
    method: str = scope["method"]
    return method if method in _METHODS else OTHER_METHOD
