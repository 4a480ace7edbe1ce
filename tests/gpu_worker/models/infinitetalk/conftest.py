"""Tiny random InfiniteTalk checkpoints in the original folder layout (make_checkpoint.py), written once."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_worker.models.infinitetalk.config import TINY
    from gpu_worker.models.infinitetalk.make_checkpoint import write

    return write(tmp_path_factory.mktemp("infinitetalk"), TINY, seed=3)
