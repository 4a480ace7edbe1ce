"""One 2-rank world (gloo on loopback) for the whole folder: see scenarios.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu_worker.distributed.scenarios import drive
from tests.gpu_worker.distributed.worlds import spawn_world

COLLECTIVE_TIMEOUT_S = 4.0


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[str]]:
    """(rank 0's scenario results, how rank 1's serve loop ended)."""
    folder: Path = tmp_path_factory.mktemp("world")
    return spawn_world(drive, folder, collective_timeout_s=COLLECTIVE_TIMEOUT_S, deadline_s=90)


@pytest.fixture(scope="session")
def results(world: tuple[dict[str, Any], list[str]]) -> dict[str, Any]:
    return world[0]
