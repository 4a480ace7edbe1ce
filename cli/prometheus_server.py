"""A real Prometheus server (Debian's `prometheus` package) on loopback, for the metrics test and
`monologue bench cluster`: a generated scrape config, a throwaway storage folder, queries through its HTTP API.
The deployment's own scrape config is `infra/k8s/base/prometheus-scrape.yaml`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cli.stack import free_port, stop_process


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector ([{metric: {...}, value: [t, "v"]}, ...])."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {promql!r}: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, promql: str) -> float | None:
        """The one number an instant query gives (a sum, a quantile), or None when it gives none."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, ready: Any, timeout_s: float = 30.0) -> float | None:
        """Poll `promql` until `ready(value)` holds (scrapes happen every second); the last value."""
        deadline = time.monotonic() + timeout_s
        value = self.value(promql)
        while not ready(value) and time.monotonic() < deadline:
            time.sleep(0.5)
            value = self.value(promql)
        return value


def scrape_config(jobs: Mapping[str, Sequence[str]], interval_s: float = 1.0) -> str:
    """prometheus.yml scraping each job's "host:port" targets (path /metrics) every `interval_s`."""
    every = f"{round(interval_s * 1000)}ms"  # Prometheus durations are integers with a unit
    lines = ["global:", f"  scrape_interval: {every}", f"  scrape_timeout: {every}", "scrape_configs:"]
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{', '.join(targets)}]"]
    return "\n".join(lines) + "\n"


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError(
            "the `prometheus` binary is missing: install Debian's package (infra/test.sh does:"
            " apt-get install --no-install-recommends prometheus)"
        )
    return found


@contextmanager
def prometheus(jobs: Mapping[str, Sequence[str]], *, interval_s: float = 1.0) -> Iterator[Prometheus]:
    """Run Prometheus on a free loopback port scraping `jobs` until the block ends."""
    with tempfile.TemporaryDirectory(prefix="monologue-prometheus-") as folder:
        root = Path(folder)
        (root / "prometheus.yml").write_text(scrape_config(jobs, interval_s))
        port = free_port()
        log = (root / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                binary(),
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, process, root / "prometheus.log")
            yield Prometheus(url)
        finally:
            stop_process(process)
            log.close()


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"prometheus exited with {process.returncode}: {log.read_text(errors='replace')[-2000:]}"
            )
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus did not become ready within {timeout_s:.0f} s")
