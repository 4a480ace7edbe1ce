"""A node's own HTTP port (`MONOLOGUE_NODE__HTTP_PORT`): `/metrics` (Prometheus), `/healthz` (the process
answers) and `/readyz` (it polls Temporal, which it does only once it is warm, its database answers, it is not
draining, its disks have room for a session (activities/disks.py) and, where the node needs one, a CUDA device is
visible), each with a JSON body saying why. A stdlib
server on its own threads: the node's event loop only updates `NodeHealth`, so a busy loop never makes a probe
time out and a probe never waits on the loop. Never imports temporalio (the node process wires it)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from monologue import metrics


@dataclass
class NodeHealth:
    """What readiness is decided from, written by the node's loop, read by the probe threads."""

    capacity: int
    require_gpu: bool = False
    warm: bool = False  # its warm-up is done (node/warm.py); its workers start polling only after it
    polling: bool = False  # the workers run (set once they started, cleared when the node drains)
    draining: bool = False
    temporal_ok: bool = False
    database_ok: bool = False
    problems: dict[str, str] = field(default_factory=dict)
    slots_used: Callable[[], int] = lambda: 0
    shortage: Callable[[], str | None] = lambda: None  # why the node takes no session for want of room

    def report(self) -> tuple[bool, dict[str, object]]:
        """(ready, the body /readyz answers with)."""
        gpus = cuda_devices()
        short = self.shortage()
        checks = {
            "polling": self.polling and not self.draining,
            "temporal": self.temporal_ok,
            "database": self.database_ok,
            "disk": short is None,
            "gpu": gpus > 0 or not self.require_gpu,
        }
        problems = dict(self.problems) | ({"disk": short} if short is not None else {})
        body: dict[str, object] = {
            "status": "ready" if all(checks.values()) else "not ready",
            "checks": checks,
            "slots": {"used": self.slots_used(), "total": self.capacity},
            "gpus": gpus,
            "warm": self.warm,  # false while warming: why a starting node does not poll yet
            "draining": self.draining,
        }
        if problems:
            body["problems"] = problems
        return all(checks.values()), body


def cuda_devices() -> int:
    """CUDA devices this process sees; 0 without torch imported (a CPU node never imports it for this)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.device_count())


def refresh_gauges(health: NodeHealth) -> None:
    """The node's slot and memory gauges, read at scrape time."""
    metrics.SLOTS_USED.set(health.slots_used())
    metrics.SLOTS_TOTAL.set(health.capacity)
    for state, value in metrics.host_memory().items():
        metrics.HOST_MEMORY.labels(state=state).set(value)
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for device in range(cuda_devices()):
        free, total = torch.cuda.mem_get_info(device)
        figures = {
            "allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
            "used": total - free,
            "total": total,
        }
        for state, value in figures.items():
            metrics.GPU_MEMORY.labels(device=str(device), state=state).set(value)


def serve(health: NodeHealth, host: str, port: int) -> ThreadingHTTPServer:
    """Start the node's HTTP server in a daemon thread; `shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                refresh_gauges(health)
                self._send(200, generate_latest(REGISTRY) + generate_latest(metrics.NODE), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._json(200, {"status": "ok"})
            elif self.path == "/readyz":
                ready, body = health.report()
                self._json(200 if ready else 503, body)
            else:
                self._json(404, {"detail": "try /metrics, /healthz or /readyz"})

        def _json(self, status: int, body: dict[str, object]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: not worth a line
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="node-http", daemon=True).start()
    return server
