"""`monologue bench cluster` end to end: a fresh PostgreSQL database, SeaweedFS, the loopback cluster and a real
Prometheus scraping every API and node, then the scenario (cli/benches/cluster.py) and the Prometheus figures.
Counters of a killed process lose what it counted since its last scrape (every second here)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cli.benches.cluster import Report, Scenario, run
from cli.cluster import Cluster, Shape, cluster, fresh_database
from cli.prometheus_server import Prometheus, prometheus
from cli.seaweed import seaweed_s3
from monologue.settings import SchedSettings

WINDOW = "[2h]"  # longer than any run: increase() over it is the run's total, counter resets included


def _quantile(q: float, metric: str, where: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket{{{where}}}{WINDOW})))"


QUERIES = {
    "chunks": f"sum(increase(monologue_chunks_total{WINDOW}))",
    "chunk retries": f"sum(increase(monologue_chunk_retries_total{WINDOW}))",
    "node changes": f"sum(increase(monologue_session_node_changes_total{WINDOW}))",
    "queue wait p50 (s)": _quantile(0.5, "monologue_queue_wait_seconds"),
    "queue wait p95 (s)": _quantile(0.95, "monologue_queue_wait_seconds"),
    "encode p95 (s)": _quantile(0.95, "monologue_chunk_stage_seconds", 'stage="encode"'),
    "checkpoint write p95 (s)": _quantile(0.95, "monologue_checkpoint_write_seconds"),
    "realtime ratio p50": _quantile(0.5, "monologue_realtime_ratio"),
    "ttff render p50 (s)": _quantile(0.5, "monologue_ttff_seconds", 'kind="render"'),
    "ttff live p50 (s)": _quantile(0.5, "monologue_ttff_seconds", 'kind="live"'),
    "live latency p95 (s)": _quantile(0.95, "monologue_live_latency_seconds"),
    "sessions completed": f'sum(increase(monologue_sessions_finished_total{{status="completed"}}{WINDOW}))',
    "node RSS max (MB)": 'max(max_over_time(process_resident_memory_bytes{job="node"}' + WINDOW + ")) / 1e6",
}


def figures(server: Prometheus) -> dict[str, float | None]:
    return {name: server.value(query) for name, query in QUERIES.items()}


@dataclass
class Bench:
    """A cluster running for a bench: the cluster, a scratch folder for its inputs, the Prometheus scraping it."""

    cluster: Cluster
    folder: Path
    prometheus: Prometheus

    def figures(self) -> dict[str, float | None]:
        """The Prometheus figures (after its last scrape of every process that is up)."""
        up = len(self.cluster.api_urls) + len(self.cluster.node_ports)
        self.prometheus.wait_for("sum(up)", lambda value: value == up, timeout_s=30)
        return figures(self.prometheus)


@contextmanager
def bench_stack(
    shape: Shape, postgres_admin_url: str, sched: SchedSettings | None = None, keep_logs: Path | None = None
) -> Iterator[Bench]:
    """A fresh database, SeaweedFS, the cluster (with `sched`'s scheduling settings) and Prometheus; all gone after,
    but for the processes' logs, copied to `keep_logs` if given (also when the bench fails)."""
    with tempfile.TemporaryDirectory(prefix="monologue-bench-cluster-") as scratch:
        root = Path(scratch)
        try:
            with (
                fresh_database(postgres_admin_url) as database_url,
                seaweed_s3(root / "s3") as s3,
                cluster(root / "cluster", database_url, s3, shape, sched) as running,
            ):
                api = [url.removeprefix("http://") for url in running.api_urls]
                nodes = [f"127.0.0.1:{port}" for port in running.node_ports.values()]
                with prometheus({"api": api, "node": nodes}) as server:
                    yield Bench(running, root, server)
        finally:
            if keep_logs is not None:
                copy_logs(root / "cluster", keep_logs)


def copy_logs(folder: Path, into: Path) -> None:
    """The *.log files under `folder` into `into`, in the same subfolders (nothing else: no database, no objects)."""

    def not_logs(where: str, names: list[str]) -> list[str]:
        return [name for name in names if not name.endswith(".log") and not (Path(where) / name).is_dir()]

    shutil.copytree(folder, into, dirs_exist_ok=True, ignore=not_logs)


def bench_cluster(scenario: Scenario, postgres_admin_url: str, keep_logs: Path | None = None) -> Report:
    with bench_stack(scenario.shape, postgres_admin_url, keep_logs=keep_logs) as bench:
        report = run(bench.cluster, scenario, bench.folder)
        report.prometheus = bench.figures()
    return report
