"""Checkpoints are trusted only when their bytes match the SHA-256 recorded for them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save
from temporalio.exceptions import ApplicationError

from activities.checkpoints import Checkpoints
from monologue import contracts as c, keys, repo
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.storage import LocalStore


@pytest.fixture
def node(tmp_path: Path) -> tuple[Checkpoints, LocalStore, object]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    sessions = make_sessionmaker(make_engine(url))
    with sessions() as db:
        repo.create_session(
            db, session_id="s", tenant="local", options={}, workflow_id="w", audio_seconds=1.0, width=64, height=64
        )
    store = LocalStore(tmp_path / "objects")
    return Checkpoints(store=store, sessions=sessions), store, sessions


def _checkpoint(store: LocalStore, sessions: object, index: int) -> bytes:
    import hashlib

    data = save({"tail.pose": np.full(3, float(index)), "head.pose": np.zeros(3)})
    store.put(keys.checkpoint("s", index), data)
    with sessions() as db:  # type: ignore[operator]
        repo.record_checkpoint(
            db, session_id="s", index=index, key=keys.checkpoint("s", index), sha256=hashlib.sha256(data).hexdigest()
        )
    return data


def test_an_intact_checkpoint_loads(node: tuple[Checkpoints, LocalStore, object]) -> None:
    checkpoints, store, sessions = node
    _checkpoint(store, sessions, 3)
    assert checkpoints.read("s", 3)["tail.pose"].tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("damage", ["corrupt", "deleted", "never written"])
def test_a_damaged_checkpoint_is_reported_lost_with_its_index(
    damage: str, node: tuple[Checkpoints, LocalStore, object]
) -> None:
    checkpoints, store, sessions = node
    if damage != "never written":
        data = _checkpoint(store, sessions, 4)
        if damage == "corrupt":
            store.put(keys.checkpoint("s", 4), data[:-1] + bytes([data[-1] ^ 1]))
        else:
            store.delete(keys.checkpoint("s", 4))
    with pytest.raises(ApplicationError) as lost:
        checkpoints.read("s", 4)
    assert lost.value.type == c.CHECKPOINT_LOST and lost.value.non_retryable and list(lost.value.details) == [4]
    assert ("corrupt" in str(lost.value)) == (damage == "corrupt")


def test_only_the_last_two_checkpoints_are_kept(node: tuple[Checkpoints, LocalStore, object]) -> None:
    _, store, sessions = node
    for index in range(5):
        _checkpoint(store, sessions, index)
    with sessions() as db:  # type: ignore[operator]
        kept = [index for index in range(5) if repo.get_checkpoint(db, session_id="s", index=index)]
    assert kept == [3, 4]
