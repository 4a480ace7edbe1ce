"""A real HTTP server on a loopback address for tests that need the other end of a request the service makes (URL
inputs, webhooks) or a page to load in a browser: routes answer with fixed bytes, a redirect or a handler's answer,
and every request is recorded. Started and stopped by the test (a context manager)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Route = Answer | Callable[[Received], Answer]


class LocalServer:
    """`with LocalServer("127.0.0.2") as server: server.routes["/a.jpg"] = Answer(body=...)`; `server.url("/a.jpg")`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.routes: dict[str, Route] = {}
        self.received: list[Received] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                request = Received(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length)
                )
                owner.received.append(request)
                route = owner.routes.get(self.path.split("?")[0], Answer(404, b"not here"))
                answer = route(request) if callable(route) else route
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
