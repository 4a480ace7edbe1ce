"""A real SeaweedFS S3 server for the storage tests (no moto, no mocks): `weed mini` on loopback, started by
cli/seaweed.py (which `monologue bench cluster` uses too); and a counting proxy in front of it."""

from __future__ import annotations

import http.client
import http.server
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cli.seaweed import S3Server, seaweed_s3

__all__ = ["CountingS3Proxy", "S3Server", "s3_server"]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    try:
        server = seaweed_s3(tmp_path_factory.mktemp("seaweedfs"))
        running = server.__enter__()
    except RuntimeError as err:  # the binary is missing or the server never answered: say so, as a failure
        pytest.fail(str(err), pytrace=False)
    try:
        yield running
    finally:
        server.__exit__(None, None, None)


@dataclass
class ProxiedRequest:
    """One request the counting proxy forwarded, and what the S3 server answered."""

    method: str
    path: str  # without the query string
    status: int
    if_none_match: str | None


class CountingS3Proxy:
    """A loopback HTTP proxy in front of the S3 server that records every request and its status, so a test
    can count writes (a key PUT twice, a conditional PUT refused with 412), which the bucket alone cannot show.
    Requests are forwarded with their Host header unchanged, so SigV4 signatures made for the proxy's URL hold."""

    def __init__(self, target_url: str) -> None:
        self.target = urllib.parse.urlsplit(target_url)
        self.requests: list[ProxiedRequest] = []
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _proxy_handler(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="s3-proxy", daemon=True)

    def __enter__(self) -> CountingS3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection(self.target.netloc, timeout=60)
        connection.request(method, path, body=body, headers=headers)
        return connection.getresponse()


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


def _proxy_handler(proxy: CountingS3Proxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if "chunked" not in self.headers.get("Transfer-Encoding", ""):
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))
            data = b""
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return data

        def _relay(self) -> None:
            body = self._body()
            headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            response = proxy.forward(self.command, self.path, headers, body)
            data = response.read()
            proxy.requests.append(
                ProxiedRequest(
                    self.command, self.path.split("?", 1)[0], response.status, self.headers.get("If-None-Match")
                )
            )
            self.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header(
                "Content-Length",
                response.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)),
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

    return Handler
