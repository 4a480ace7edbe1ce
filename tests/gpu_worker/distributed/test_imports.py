"""The GPU machine has torch and numpy but no service stack: the runtime, and every rank but rank 0's node
startup, must import without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SERVICE_STACK = ["temporalio", "sqlalchemy", "structlog", "pydantic", "pydantic_settings", "fastapi", "boto3", "av"]

PROBE = f"""
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVICE_STACK!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU machine)")
        return None

sys.meta_path.insert(0, Missing())
import gpu_worker.distributed
import node.launch
print("ok")
"""


def test_the_runtime_and_its_launcher_import_without_the_service_stack() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "ok"
