"""The figures Monologue computes at scrape time or counts at a status change: the sessions still going, exported by
exactly one API replica of a cluster (another takes over when it stops), the sessions that ended counted once each,
and the GPUs' utilisation and memory from NVML (nothing, and no error, without it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text
from sqlalchemy.orm import sessionmaker

from monologue import metrics, repo
from monologue.contracts import SessionKind, SessionStatus
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.exporter_lock import ExporterLock
from monologue.metrics import NvmlCollector, SessionsCollector
from tests.helpers import postgres_database


def _create(sessions: sessionmaker[Any], session_id: str, kind: SessionKind = SessionKind.RENDER) -> None:
    with sessions() as db:
        repo.create_session(
            db,
            session_id=session_id,
            tenant="local",
            options={"fps": 25},
            workflow_id=f"render-{session_id}",
            audio_seconds=3.0,
            width=512,
            height=512,
            kind=kind,
        )


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a registry's exposition, as Prometheus would read it: {(name, sorted labels): value}."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _sessions_gauge(collector: SessionsCollector) -> dict[tuple[str, str], float] | None:
    """{(kind, status): count} as this replica exports it; None if it exports no `monologue_sessions`."""
    registry = CollectorRegistry()
    registry.register(collector)
    samples = _scrape(registry)
    if not samples:
        return None
    return {(dict(labels)["kind"], dict(labels)["status"]): value for (_, labels), value in samples.items()}


def _seed(sessions: sessionmaker[Any]) -> None:
    """A queued render, a running live session and a completed render."""
    _create(sessions, "queued")
    _create(sessions, "live", kind=SessionKind.LIVE)
    _create(sessions, "done")
    with sessions() as db:
        repo.mark_running(db, session_id="live", frames=75, chunks_total=2)
        repo.mark_running(db, session_id="done", frames=75, chunks_total=2)
        repo.mark_completed(db, session_id="done", video_key="final.mp4", frames=75, chunks=2)


GOING = {
    ("render", "queued"): 1,
    ("render", "running"): 0,
    ("live", "queued"): 0,
    ("live", "running"): 1,
}


def test_on_sqlite_the_one_process_exports_the_sessions_still_going(sessions: sessionmaker[Any]) -> None:
    _seed(sessions)
    exporter = ExporterLock(sessions.kw["bind"])
    try:
        assert _sessions_gauge(SessionsCollector(sessions, exporter)) == GOING  # no completed: it ended
    finally:
        exporter.close()


def test_one_replica_exports_the_sessions_and_another_takes_over_when_it_stops() -> None:
    """Two API replicas on one PostgreSQL: exactly one exports the figure; once it closes (a stopping replica) or
    its connection ends (a killed one), the other exports it at its next scrape."""
    with postgres_database() as url:
        migrate(url)
        engines: list[Engine] = []
        replicas, exporters = [], []
        for _ in range(2):
            engine = make_engine(url)
            exporter = ExporterLock(engine)
            engines.append(engine)
            exporters.append(exporter)
            replicas.append(SessionsCollector(make_sessionmaker(engine), exporter))
        try:
            _seed(make_sessionmaker(engines[0]))
            first = [_sessions_gauge(replica) for replica in replicas]
            assert sorted(figure is None for figure in first) == [False, True], first
            [exporting] = [index for index, figure in enumerate(first) if figure is not None]
            assert first[exporting] == GOING
            assert [_sessions_gauge(replica) is not None for replica in replicas] == [i == exporting for i in (0, 1)]
            exporters[exporting].close()
            other = 1 - exporting
            assert _sessions_gauge(replicas[other]) == GOING
            assert _sessions_gauge(replicas[exporting]) is None  # the lock is the other's now
            # The holder dies without closing (its connection ends with its process): the first takes over again.
            with engines[0].connect() as admin:
                ended = admin.scalar(text(KILL_LOCK_HOLDER))
            assert ended
            assert _sessions_gauge(replicas[exporting]) == GOING
            assert _sessions_gauge(replicas[other]) is None
        finally:
            for exporter in exporters:
                exporter.close()
            for engine in engines:
                engine.dispose()


# The backends holding an advisory lock in this (fresh) database, ended; waits up to 10 s for them to be gone.
KILL_LOCK_HOLDER = """
SELECT bool_and(pg_terminate_backend(pid, 10000)) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _finished(kind: SessionKind, status: SessionStatus) -> float:
    labels = {"kind": kind.value, "status": status.value}
    return metrics.NODE.get_sample_value("monologue_sessions_finished_total", labels) or 0.0


def test_a_session_that_ends_is_counted_once(sessions: sessionmaker[Any]) -> None:
    """A retried finalize and a late cancel after it change nothing and count nothing."""
    completed, cancelled = (
        _finished(SessionKind.LIVE, SessionStatus.COMPLETED),
        _finished(SessionKind.LIVE, SessionStatus.CANCELLED),
    )
    _create(sessions, "s1", kind=SessionKind.LIVE)
    with sessions() as db:
        repo.mark_running(db, session_id="s1", frames=75, chunks_total=2)
        for _ in range(2):
            assert repo.mark_completed(db, session_id="s1", video_key="final.mp4", frames=75, chunks=2)
        assert not repo.mark_ended(db, session_id="s1", status=SessionStatus.CANCELLED, error=None)
    assert _finished(SessionKind.LIVE, SessionStatus.COMPLETED) == completed + 1
    assert _finished(SessionKind.LIVE, SessionStatus.CANCELLED) == cancelled


def test_without_nvml_a_scrape_has_no_gpu_series_and_no_error() -> None:
    """This machine has no NVIDIA driver (nor, on a CPU node, perhaps the package): the collector stays silent."""
    registry = CollectorRegistry()
    registry.register(NvmlCollector())
    assert not any(name.startswith("monologue_gpu_") for name, _ in _scrape(registry))
    assert "monologue_gpu_utilization_ratio" not in generate_latest(metrics.NODE).decode()


@dataclass
class FakeDevice:
    busy_percent: int
    used: int
    total: int
    lost: bool = False


@dataclass
class FakeNvml:
    """The part of pynvml's interface the collector calls, with known figures; a lost device raises as NVML does."""

    devices: list[FakeDevice]
    initialised: int = 0

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if self.devices[index].lost:
            raise RuntimeError("GPU is lost")
        return self.devices[index]

    def nvmlDeviceGetUtilizationRates(self, device: FakeDevice) -> Any:
        return type("Rates", (), {"gpu": device.busy_percent, "memory": 0})()

    def nvmlDeviceGetMemoryInfo(self, device: FakeDevice) -> Any:
        return type("Memory", (), {"used": device.used, "total": device.total, "free": device.total - device.used})()


def test_nvml_figures_are_exported_per_device_and_a_lost_device_is_absent() -> None:
    gib = 2**30
    nvml = FakeNvml(
        [FakeDevice(75, 10 * gib, 80 * gib), FakeDevice(0, 0, 80 * gib, lost=True), FakeDevice(5, gib, gib)]
    )
    registry = CollectorRegistry()
    registry.register(NvmlCollector(nvml))
    for _ in range(2):
        samples = _scrape(registry)
    assert nvml.initialised == 1
    gpu = {key: value for key, value in samples.items() if key[0].startswith("monologue_gpu_")}
    assert gpu == {
        ("monologue_gpu_utilization_ratio", (("device", "0"),)): 0.75,
        ("monologue_gpu_utilization_ratio", (("device", "2"),)): 0.05,
        ("monologue_gpu_device_memory_bytes", (("device", "0"), ("state", "used"))): 10 * gib,
        ("monologue_gpu_device_memory_bytes", (("device", "0"), ("state", "total"))): 80 * gib,
        ("monologue_gpu_device_memory_bytes", (("device", "2"), ("state", "used"))): gib,
        ("monologue_gpu_device_memory_bytes", (("device", "2"), ("state", "total"))): gib,
    }
