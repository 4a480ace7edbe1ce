"""The torchrun entry point: every rank starts, rank 0 leads and the others serve until it shuts them
down; a broken group makes every rank exit non-zero so torchrun can restart the node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker.distributed import TorchrunEnv
from tests.gpu_worker.distributed.worlds import free_port

ROOT = Path(__file__).resolve().parents[3]


def torchrun(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command += ["-m", "tests.gpu_worker.distributed.launch_probe", str(out), *extra]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(90)
def test_under_torchrun_rank_0_leads_the_others_serve_and_all_exit_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    completed = torchrun(out)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(out.read_text()) == {"ranks": [0, 1], "world_size": 2}
    assert "rank 1: shutdown" in completed.stderr


@pytest.mark.timeout(90)
def test_a_broken_group_makes_the_node_exit_non_zero(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    completed = torchrun(out, "break")
    assert completed.returncode != 0
    seen = json.loads(out.read_text())
    assert "block failed on purpose" in seen["broken"]
    assert "leaving a broken rank group" in completed.stderr


def test_the_torchrun_contract_is_read_from_its_variables() -> None:
    assert TorchrunEnv.from_environ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}) == TorchrunEnv(3, 8, 3)
    with pytest.raises(ValueError, match="LOCAL_RANK not set: start the node with torchrun"):
        TorchrunEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1"})
