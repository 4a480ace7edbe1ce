"""Every Prometheus metric Monologue exports, defined once (prometheus-client).

Nodes observe what happens on them (chunks, checkpoints, leases, sinks, slots, memory, webhook deliveries, the
sessions they end) and serve it on their HTTP port (`node/http_port.py`), with their GPUs' utilisation and memory
read from NVML at scrape time (`NvmlCollector`). The API serves `/metrics` with its own HTTP requests
(`HttpMetrics`, on each app's registry), the unfinished sessions by kind and status counted from the database at
scrape time (`SessionsCollector`) and the lease queue's backlog by class as last polled from Temporal
(`LeaseBacklogCollector`). Temporal's own SDK metrics (`temporal_*`) come from its runtime on a port of their own
(`monologue/temporal_client.py`).

Cluster-wide figures are exported once per cluster, not once per replica: `monologue_sessions` comes from the one
API replica holding the exporter lock (`monologue/exporter_lock.py`: a PostgreSQL advisory lock on a connection of
its own, tried again at every scrape by the others, so another replica takes over at its next scrape once the
holder is gone; on SQLite, one process, always that one), so `sum(monologue_sessions)` is the whole service
whichever replicas run. It counts only sessions still going; those that ended are counted once each, where the
status becomes terminal (`repo._end`, on the nodes), by `monologue_sessions_finished_total`.

Label values are bounded sets (families, stages, kinds, statuses, sink types, route templates, GPU indices): never
ids."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from monologue.contracts import TERMINAL, SessionKind, SessionStatus
from monologue.db import SessionRow
from monologue.exporter_lock import ExporterLock

# What nodes observe, apart from the process's default registry (process_*, python_*): an API process imports
# this module too, and must not export the node figures as zeros.
NODE = CollectorRegistry()

# Buckets in seconds: a stage takes milliseconds to seconds, a wait for a node seconds to minutes.
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
RATIO_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8)

QUEUE_WAIT = Histogram(
    "monologue_queue_wait_seconds",
    "From a session's node lease being scheduled to a node taking it (waiting for a free slot)",
    buckets=WAIT_BUCKETS,
    registry=NODE,
)
CHUNK_STAGE = Histogram(
    "monologue_chunk_stage_seconds",
    "Time of one pipeline stage of one chunk (context, a2v, sr, decode, encode, checkpoint, idle_before...)",
    ["family", "stage"],
    buckets=STAGE_BUCKETS,
    registry=NODE,
)
CHUNKS = Counter("monologue_chunks_total", "Chunks generated", ["family", "kind"], registry=NODE)
CHUNK_RETRIES = Counter(
    "monologue_chunk_retries_total", "Chunk activities run again (attempt > 1)", ["family"], registry=NODE
)
NODE_CHANGES = Counter("monologue_session_node_changes_total", "Sessions taken over by another node", registry=NODE)
PREEMPTIONS = Counter(
    "monologue_preemptions_total", "Renders that gave their slot up to a waiting live session", registry=NODE
)
CHECKPOINT_WRITE = Histogram(
    "monologue_checkpoint_write_seconds",
    "Writing one checkpoint (anchors) to storage",
    buckets=STAGE_BUCKETS,
    registry=NODE,
)
REALTIME_RATIO = Histogram(
    "monologue_realtime_ratio",
    "A completed render's video seconds per wall second from its start to its final video",
    ["family"],
    buckets=RATIO_BUCKETS,
    registry=NODE,
)
TTFF = Histogram(
    "monologue_ttff_seconds",
    "Time to first frame (a render: created to first chunk; a live session: first audio to first segment)",
    ["kind"],
    buckets=WAIT_BUCKETS,
    registry=NODE,
)
LIVE_LATENCY = Histogram(
    "monologue_live_latency_seconds",
    "A live chunk's audio stored to its segment published",
    buckets=WAIT_BUCKETS,
    registry=NODE,
)
SINK_LAG = Gauge(
    "monologue_sink_lag_segments",
    "Segments stored but not yet acknowledged by sinks, over running pumps",
    ["sink"],
    registry=NODE,
)
SINK_FAILURES = Counter("monologue_sink_failures_total", "Failed sink pump attempts", ["sink"], registry=NODE)
SLOTS_USED = Gauge("monologue_node_slots_used", "Session slots of this node held now", registry=NODE)
SLOTS_TOTAL = Gauge("monologue_node_slots", "Session slots of this node (its capacity)", registry=NODE)
HOST_MEMORY = Gauge("monologue_host_memory_bytes", "The host's memory (/proc/meminfo)", ["state"], registry=NODE)
GPU_MEMORY = Gauge("monologue_gpu_memory_bytes", "CUDA memory of this process", ["device", "state"], registry=NODE)
SESSIONS_FINISHED = Counter(
    "monologue_sessions_finished_total",
    "Sessions that ended, by kind and terminal status (a resumed session that ends again counts again)",
    ["kind", "status"],
    registry=NODE,
)


class WebhookOutcome(StrEnum):
    """How a webhook attempt ended (`delivered`: a 2xx; `failed`: anything else, to be tried again), or
    `gave_up`: a delivery's retry period ended (or its endpoint was refused or deleted) without a 2xx."""

    DELIVERED = "delivered"
    FAILED = "failed"
    GAVE_UP = "gave_up"


WEBHOOK_DELIVERIES = Counter(
    "monologue_webhook_deliveries_total",
    "Webhook attempts by event and outcome (delivered, failed), and deliveries given up (gave_up)",
    ["event", "outcome"],
    registry=NODE,
)
WEBHOOK_DELIVERY = Histogram(
    "monologue_webhook_delivery_seconds",
    "One webhook attempt: connecting, sending and the receiver's answer",
    ["event"],
    buckets=STAGE_BUCKETS,
    registry=NODE,
)


@dataclass(frozen=True)
class HttpMetrics:
    """The API's requests (`api/http_metrics.py` observes them), on the app's own registry: two apps in one process
    (tests, or an API beside another) do not collide. `route` is the matched route's template, `unmatched` where
    no route matched (a 404, or a request a guard refused first): never the raw path."""

    requests: Counter
    duration: Histogram

    @classmethod
    def on(cls, registry: CollectorRegistry) -> HttpMetrics:
        return cls(
            Counter(
                "monologue_http_requests_total",
                "HTTP requests answered, by method, route template and status code",
                ["method", "route", "status"],
                registry=registry,
            ),
            Histogram(
                "monologue_http_request_duration_seconds",
                "From a request's arrival to its response's headers (a stream or a download is not timed to its"
                " end), by method and route template",
                ["method", "route"],
                buckets=STAGE_BUCKETS,
                registry=registry,
            ),
        )


def initialise() -> None:
    """Create every labelled series a node can report before it reports one: Prometheus' increase() cannot see
    a series' first value, so a count born at 1 (a node's first live session, or any after a restart) would
    be lost. Stage times stay lazy (their label set is the families' business; a first chunk is one of many)."""
    from monologue.contracts import ChunkKind, Family, SinkType
    from monologue.schemas import WebhookEvent

    for family in Family:
        CHUNK_RETRIES.labels(family=family.value)
        REALTIME_RATIO.labels(family=family.value)
        for kind in ChunkKind:
            CHUNKS.labels(family=family.value, kind=kind.value)
    for session_kind in SessionKind:
        TTFF.labels(kind=session_kind.value)
        for status in TERMINAL:
            SESSIONS_FINISHED.labels(kind=session_kind.value, status=status.value)
    for event in WebhookEvent:
        WEBHOOK_DELIVERY.labels(event=event.value)
        for outcome in WebhookOutcome:
            WEBHOOK_DELIVERIES.labels(event=event.value, outcome=outcome.value)
    for sink in SinkType:
        SINK_FAILURES.labels(sink=sink.value)
        SINK_LAG.labels(sink=sink.value)


def observe_stages(family: str, stage_ms: dict[str, float]) -> None:
    for stage, ms in stage_ms.items():
        CHUNK_STAGE.labels(family=family, stage=stage).observe(ms / 1000)


GPU_UTILIZATION = "monologue_gpu_utilization_ratio"
GPU_DEVICE_MEMORY = "monologue_gpu_device_memory_bytes"


class NvmlCollector(Collector):
    """`monologue_gpu_utilization_ratio{device}` (0..1: the share of the last sample period a kernel ran) and
    `monologue_gpu_device_memory_bytes{device,state}` (used, total: every process on the device, as the driver
    sees it, beside `monologue_gpu_memory_bytes`, this process's CUDA allocator), read from NVML at scrape time.
    `device` is NVML's index (the PCI bus order: CUDA's too with CUDA_DEVICE_ORDER=PCI_BUS_ID). No NVML (no GPU,
    no driver, nvidia-ml-py missing): no series; a device that stops answering (a lost GPU): no series for it. A
    scrape never fails for a GPU."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml  # pynvml, or a stand-in with its functions (tests); None: pynvml at the first scrape
        self._opened: bool | None = None  # NVML initialised once, or found absent once: a driver does not come later
        self._lock = threading.Lock()
        self._warned: set[int] = set()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self._open()
        if nvml is None:
            return
        utilization, memory = self._families()
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception:  # NVMLError and its kin: the driver went away; no figures, no failed scrape
            return
        for index in range(count):
            try:
                device = nvml.nvmlDeviceGetHandleByIndex(index)
                busy, used = nvml.nvmlDeviceGetUtilizationRates(device).gpu, nvml.nvmlDeviceGetMemoryInfo(device)
            except Exception as err:  # a lost GPU: absent, which is what an alert looks for
                if index not in self._warned:
                    self._warned.add(index)
                    structlog.get_logger("metrics").warning("a GPU does not answer NVML", device=index, error=str(err))
                continue
            utilization.add_metric([str(index)], busy / 100)
            memory.add_metric([str(index), "used"], used.used)
            memory.add_metric([str(index), "total"], used.total)
        yield from (utilization, memory)

    def _open(self) -> Any | None:
        with self._lock:
            if self._opened is None:
                try:
                    if self._nvml is None:
                        self._nvml = importlib.import_module("pynvml")
                    self._nvml.nvmlInit()
                    self._opened = True
                except Exception:  # ImportError, or NVML's library or driver missing: a CPU node
                    self._opened = False
        return self._nvml if self._opened else None

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(GPU_UTILIZATION, "Share of time a GPU ran a kernel (NVML)", labels=["device"]),
            GaugeMetricFamily(GPU_DEVICE_MEMORY, "A GPU's memory, every process's (NVML)", labels=["device", "state"]),
        )


NODE.register(NvmlCollector())  # a node reads its GPUs at each scrape (a process that does not serve NODE never does)


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """{'total': bytes, 'available': bytes} from /proc/meminfo, or {} where it is not there."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return {}
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.endswith(" kB")}
    return {
        state: fields[name] for state, name in (("total", "MemTotal"), ("available", "MemAvailable")) if name in fields
    }


SESSIONS = "monologue_sessions"
_GOING = sorted(frozenset(SessionStatus) - TERMINAL)


class SessionsCollector(Collector):
    """`monologue_sessions{kind,status}`: the sessions still going (queued, running), counted in the database when
    Prometheus scrapes (one grouped count), from the one replica `exporter` elects: the figure is the cluster's,
    whichever replica answers, and survives restarts. Every kind and status is reported, 0 included."""

    def __init__(self, sessions: sessionmaker[Any], exporter: ExporterLock) -> None:
        self._sessions = sessions
        self._exporter = exporter

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self._exporter.held():
            return  # another replica exports it
        counts = dict.fromkeys(((kind, status) for kind in SessionKind for status in _GOING), 0)
        try:
            with self._sessions() as db:
                query = (
                    select(SessionRow.kind, SessionRow.status, func.count())
                    .where(SessionRow.status.in_(_GOING))
                    .group_by(SessionRow.kind, SessionRow.status)
                )
                counts |= {
                    (SessionKind(kind), SessionStatus(status)): count for kind, status, count in db.execute(query)
                }
        except SQLAlchemyError:
            return  # no database: no figure (readiness says why)
        family = self._family()
        for (kind, status), count in counts.items():
            family.add_metric([kind.value, status.value], count)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(SESSIONS, "Sessions not yet ended, by kind and status", labels=["kind", "status"])


@dataclass(frozen=True)
class QueueBacklog:
    """One class's leases waiting in the lease queue, as Temporal last counted them (approximate)."""

    count: int
    age_s: float  # how long the oldest of them has waited


LEASE_BACKLOG = "monologue_lease_backlog"
LEASE_BACKLOG_AGE = "monologue_lease_backlog_age_seconds"


class LeaseBacklogCollector(Collector):
    """`monologue_lease_backlog{class}` and `monologue_lease_backlog_age_seconds{class}`: the node leases waiting in
    the lease queue by `QueueClass`, what the node autoscaler (infra/k8s/base/node-scaledobject.yaml) scales on.
    `figures()` returns the last figures polled from Temporal (api/backlog.py), so a scrape never waits on Temporal;
    no figures (Temporal unreachable), no series: an autoscaler must see "unknown", never a stale or zero backlog.
    Every API replica polls the same queue and reports the same figures: aggregate across replicas with max."""

    def __init__(self, figures: Callable[[], Mapping[str, QueueBacklog]]) -> None:
        self._figures = figures

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures = self._figures()
        if not figures:
            return
        count, age = self._families()
        for queue_class, backlog in figures.items():
            count.add_metric([queue_class], backlog.count)
            age.add_metric([queue_class], backlog.age_s)
        yield from (count, age)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(LEASE_BACKLOG, "Node leases waiting for a free slot, by class", labels=["class"]),
            GaugeMetricFamily(
                LEASE_BACKLOG_AGE, "How long the oldest waiting node lease has waited, by class", labels=["class"]
            ),
        )
