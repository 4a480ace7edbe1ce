"""Every Prometheus metric Monologue exports, defined once (prometheus-client).

Nodes observe what happens on them (chunks, checkpoints, leases, sinks, slots, memory) and serve it on their
HTTP port (`node/http_port.py`); the API serves `/metrics` with the sessions by kind and status counted
from the database at scrape time (`SessionsCollector`), so any replica reports the whole service, and the lease
queue's backlog by class as last polled from Temporal (`LeaseBacklogCollector`). Temporal's
own SDK metrics (`temporal_*`) come from its runtime on a port of their own (`monologue/temporal_client.py`).
Label values are bounded sets (families, stages, kinds, sink types): never ids."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from monologue.db import SessionRow

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
REALTIME_FACTOR = Histogram(
    "monologue_realtime_factor",
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


def initialise() -> None:
    """Create every labelled series a node can report before it reports one: Prometheus' increase() cannot see
    a series' first value, so a count born at 1 (a node's first live session, or any after a restart) would
    be lost. Stage times stay lazy (their label set is the families' business; a first chunk is one of many)."""
    from monologue.contracts import ChunkKind, Family, SessionKind, SinkType

    for family in Family:
        CHUNK_RETRIES.labels(family=family.value)
        REALTIME_FACTOR.labels(family=family.value)
        for kind in ChunkKind:
            CHUNKS.labels(family=family.value, kind=kind.value)
    for session_kind in SessionKind:
        TTFF.labels(kind=session_kind.value)
    for sink in SinkType:
        SINK_FAILURES.labels(sink=sink.value)
        SINK_LAG.labels(sink=sink.value)


def observe_stages(family: str, stage_ms: dict[str, float]) -> None:
    for stage, ms in stage_ms.items():
        CHUNK_STAGE.labels(family=family, stage=stage).observe(ms / 1000)


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


class SessionsCollector(Collector):
    """`monologue_sessions{kind,status}` counted in the database when Prometheus scrapes (cheap: one grouped
    count), so it is right whichever API replica answers and survives restarts."""

    def __init__(self, sessions: sessionmaker[Any]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("monologue_sessions", "Sessions by kind and status", labels=["kind", "status"])
        try:
            with self._sessions() as db:
                query = select(SessionRow.kind, SessionRow.status, func.count()).group_by(
                    SessionRow.kind, SessionRow.status
                )
                for kind, status, count in db.execute(query):
                    family.add_metric([str(kind.value), str(status.value)], count)
        except SQLAlchemyError:
            return  # no database: no figure (readiness says why)
        yield family


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
