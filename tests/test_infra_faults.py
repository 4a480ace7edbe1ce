"""Nothing lost when the infrastructure beneath Monologue fails (issue 28): each fault of cli/faults.py injected
into a loopback cluster (its own PostgreSQL server, SeaweedFS, Temporal on its database file) while two renders and
a live session run. Every session completes with the clean run's frames, every playlist lists each segment once,
and the API answered normally or with 503 + Retry-After throughout. `monologue bench faults` runs the same and
prints the figures (docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.faults import Fault, Rig, fault_rig, run_fault

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    with fault_rig() as running:
        yield running


@pytest.mark.parametrize("fault", list(Fault))
def test_sessions_ride_out(fault: Fault, rig: Rig) -> None:
    report = run_fault(rig, fault)
    print(report.line())
    assert report.problems == []
    assert report.completed == report.sessions == report.identical
    assert report.answers.total() > 0  # it was asked throughout the fault (each answer normal, or 503 + Retry-After)
