"""A Monologue cluster on loopback, as real processes: one Temporal dev server, PostgreSQL (a fresh database on a
server you give), SeaweedFS as S3, several API processes and several nodes, each node with its own metrics and
probe port. Processes can be SIGKILLed and restarted; what the nodes logged about their leases is read back.
`monologue bench cluster` and tests/test_cluster_chaos.py drive it (cli/benches/cluster.py)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from cli.seaweed import S3Server
from cli.stack import Child, Stack, free_port, http_ok
from monologue.settings import (
    ApiSettings,
    LimitSettings,
    NodeSettings,
    RenderDefaults,
    SchedSettings,
    Settings,
    SinkSettings,
    StorageSettings,
    TemporalSettings,
)

BUCKET = "monologue-cluster"


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database on the server `admin_url` reaches; dropped afterwards. Yields its URL."""
    name = f"monologue_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # the server may restart
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass(frozen=True)
class Shape:
    """How big the cluster is and how its nodes behave."""

    apis: int = 2
    nodes: int = 4
    capacity: int = 2
    lease_timeout_s: float = 3.0  # a killed node's sessions move after this long
    chunk_delay_s: float = 0.0  # testing only: stretch every chunk, so kills land inside sessions
    live_idle_timeout_s: float = 4.0


@dataclass
class Kill:
    """One SIGKILL: which process, when (wall clock, epoch s)."""

    name: str
    at: float
    restarted_at: float | None = None
    child: Child | None = None  # the process as it was started, to start it again


@dataclass
class Cluster:
    stack: Stack
    s3: S3Server
    api_urls: list[str]
    node_ports: dict[str, int]  # node id → its HTTP port (metrics, probes)
    kills: list[Kill] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.stack.settings

    @property
    def api_key(self) -> str:
        return self.stack.api_key

    def alive_api(self) -> str:
        """An API that answers now (clients behind a load balancer reach whichever is up)."""
        for _ in range(200):
            for url in self.api_urls:
                if http_ok(f"{url}/healthz"):
                    return url
            time.sleep(0.1)
        raise RuntimeError("no API process answers")

    def api_child(self, url: str) -> str:
        return "api" if url == self.api_urls[0] else f"api-{self.api_urls.index(url) + 1}"

    def kill(self, name: str) -> Kill:
        old = self.stack.kill(name)
        kill = Kill(name, time.time(), child=old)
        self.kills.append(kill)
        return kill

    def restart(self, kill: Kill) -> None:
        """Start the killed process again (not waiting for it: `ready` says when it is). Call it from the thread
        that runs the cluster: a child dies with the thread that started it (PR_SET_PDEATHSIG is per thread)."""
        if kill.child is None:
            raise ValueError(f"{kill.name}: no process to restart")
        self.stack.respawn(kill.child)
        kill.restarted_at = time.time()

    def alive(self, name: str) -> bool:
        return any(child.name == name and child.process.poll() is None for child in self.stack.children)

    def ready(self, name: str) -> bool:
        """The process runs and its probe answers (a node: /readyz, so it polls again; an API: /healthz)."""
        return self.alive(name) and http_ok(self._probe_url(name))

    def _probe_url(self, name: str) -> str:
        if name.startswith("node-"):
            return f"http://127.0.0.1:{self.node_ports[name.removeprefix('node-')]}/readyz"
        index = 0 if name == "api" else int(name.split("-")[1]) - 1
        return f"{self.api_urls[index]}/healthz"

    def object(self, key: str) -> bytes:
        """An object of the cluster's storage (the session layout of monologue/keys.py)."""
        body = self.s3.client().get_object(Bucket=BUCKET, Key=key)["Body"]
        data: bytes = body.read()
        return data

    def keys(self, prefix: str) -> list[str]:
        pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def lease_events(self) -> list[dict[str, Any]]:
        """Every lease line the nodes logged ("node acquired"/"node released"/"node ready"), oldest first."""
        return self.node_events("node acquired", "node released", "node ready")

    def node_events(self, *names: str) -> list[dict[str, Any]]:
        """Every line the nodes logged whose event is one of `names` (with `at`, epoch s), oldest first."""
        events: list[dict[str, Any]] = []
        for log in sorted(self.stack.log_dir.glob("node-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                entry = json.loads(line)
                if entry.get("event") in names:
                    entry["at"] = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
                    events.append(entry)
        return sorted(events, key=lambda entry: entry["at"])


def cluster_settings(
    home: Path,
    database_url: str,
    s3: S3Server,
    shape: Shape,
    sched: SchedSettings | None = None,
    *,
    sinks: SinkSettings | None = None,
) -> Settings:
    """Every process's settings (each child gets them as MONOLOGUE_* variables); `sched`: the scheduling's, e.g.
    tenants' weights, `sinks`: where sessions may publish (default: the settings' own)."""
    return Settings(
        home=home,
        database_url=database_url,
        log_format="json",
        storage=StorageSettings(backend="s3", bucket=BUCKET, endpoint_url=s3.endpoint_url, region=s3.region),
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(
            id="n1",
            capacity=shape.capacity,
            lease_timeout_s=shape.lease_timeout_s,
            chunk_delay_s=shape.chunk_delay_s,
            graceful_shutdown_s=5.0,
        ),
        render=RenderDefaults(live_idle_timeout_s=shape.live_idle_timeout_s),
        limits=LimitSettings(max_sessions_per_tenant=1000),  # one tenant submits every session of a scenario
        sched=sched or SchedSettings(),
        sinks=sinks or SinkSettings(),
    )


@contextmanager
def cluster(
    home: Path,
    database_url: str,
    s3: S3Server,
    shape: Shape,
    sched: SchedSettings | None = None,
    *,
    sinks: SinkSettings | None = None,
    node_env: Callable[[Settings, str], dict[str, str]] | None = None,
) -> Iterator[Cluster]:
    """Start Temporal, `shape.apis` APIs and `shape.nodes` nodes on loopback; stop them all afterwards. `node_env`:
    a node's extra environment, from the cluster's settings and its id ("n1", …), e.g. its own way to Temporal."""
    s3.client().create_bucket(Bucket=BUCKET)
    settings = cluster_settings(home, database_url, s3, shape, sched, sinks=sinks)
    stack = Stack(settings, env=s3.aws_env())
    stack.start(with_node=False)
    try:
        urls = [str(settings.api.public_url)]
        for index in range(2, shape.apis + 1):
            port = free_port()
            stack.start_api(f"api-{index}", port)
            urls.append(f"http://{settings.api.host}:{port}")
        ports = {f"n{i}": free_port() for i in range(1, shape.nodes + 1)}
        for node_id, port in ports.items():
            extra = node_env(settings, node_id) if node_env else {}
            stack.start_node(node_id, env={"MONOLOGUE_NODE__HTTP_PORT": str(port), **extra})
        running = Cluster(stack, s3, urls, ports)
        for node_id in ports:
            _wait_ready(running._probe_url(f"node-{node_id}"), node_id)
        yield running
    finally:
        stack.stop()


def _wait_ready(url: str, name: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} was not ready within {timeout_s:.0f} s ({url})")
