"""Scale-out under chaos, with real processes on loopback: one Temporal server, PostgreSQL, SeaweedFS as S3, two
API processes and two nodes (two slots each); six sessions (renders of two lengths and two live sessions
streaming speech in real time) while three nodes are SIGKILLed (each restarted a few seconds later) and one API
process too. Every session completes, every render's frames equal a clean render's, every playlist lists each
segment once, and no node ever held more sessions than slots (cli/benches/cluster.py checks all of it; the
full scenario is `monologue bench cluster`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.benches.cluster import SMALL, run
from cli.cluster import cluster
from tests.helpers import postgres_database
from tests.s3_server import S3Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_sessions_survive_node_and_api_kills_with_identical_frames(s3_server: S3Server, tmp_path: Path) -> None:
    with (
        postgres_database() as database_url,
        cluster(tmp_path / "cluster", database_url, s3_server, SMALL.shape) as running,
    ):
        report = run(running, SMALL, tmp_path)
    print(report.table())  # the figures, for the log
    assert report.problems == []
    assert report.completed == report.sessions == SMALL.renders + SMALL.live
    assert [name for name in report.kills if name.startswith("node-")] and len(report.kills) == SMALL.node_kills + 1
