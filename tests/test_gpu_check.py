"""The GPU check (infra/gpu_check.sh) runs on a bare CUDA machine: torch, numpy and Pillow, maybe pytest,
and none of the service stack. Here that machine is imitated on the CPU: a `sitecustomize.py` on PYTHONPATH
makes every service package look uninstalled in every Python process the script starts (`import` fails,
`importlib.util.find_spec` says None, as when it is not there), pytest's plugins are not loaded (no
pytest-timeout, no pytest-asyncio), and the script runs in its dry mode (every step tiny, on the CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.conftest import SERVICE_PACKAGES

ROOT = Path(__file__).resolve().parent.parent

# Runs first in every Python process: the service stack is "not installed"; at exit the process writes
# down any of it that got imported anyway (nothing should).
SITECUSTOMIZE = """
import atexit, json, os, sys

BLOCKED = {blocked!r}
for name in BLOCKED:
    sys.modules[name] = None


def _report():
    leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED and sys.modules[n] is not None)
    with open(os.path.join({log!r}, f"{{os.getpid()}}.json"), "w") as out:
        json.dump({{"argv": sys.argv, "leaked": leaked}}, out)


atexit.register(_report)
"""


@pytest.fixture
def bare(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """(environment of a bare GPU machine, folder of the processes' import logs)."""
    site, log = tmp_path / "site", tmp_path / "imports"
    site.mkdir()
    log.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=sorted(SERVICE_PACKAGES), log=str(log)))
    env = {**os.environ, "PYTHONPATH": str(site), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PY": sys.executable}
    return env, log


def _import_logs(log: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text()) for path in sorted(log.glob("*.json"))]


def test_the_imitation_hides_the_service_stack(bare: tuple[dict[str, str], Path]) -> None:
    env, log = bare
    probe = "import importlib.util; print(importlib.util.find_spec('av'))"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "None"
    failed = subprocess.run([sys.executable, "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert failed.returncode == 1 and "ModuleNotFoundError" in failed.stderr
    assert len(_import_logs(log)) == 2


def test_the_gpu_check_runs_on_a_bare_machine(bare: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """The dry run: the environment report, the GPU-marked tests (collected and skipped: no CUDA here), the
    benchmark's JSON, the SP kernel check, and the render records with the quality gate; every step succeeds
    without the service stack and nothing of it is imported."""
    env, log = bare
    out = tmp_path / "out"
    env |= {
        "OUT": str(out),
        "GPU_CHECK_DRY": "1",
        "GPU_CHECK_STEPS": "env pytest_gpu bench_resident sp_check records",
        "RECORD_VARIANTS": "bf16:resident bf16:switch",
    }
    done = subprocess.run(["bash", "infra/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    steps = {
        line.split("\t")[0]: line.split("\t")[1]
        for line in (out / "steps.tsv").read_text().splitlines()[1:]
        if "\t" in line
    }
    expected = {"env", "pytest_gpu", "bench_resident", "sp_check"}
    if (ROOT / "gpu_worker" / "render_record.py").exists():
        expected |= {"record_bf16_resident", "record_bf16_switch", "gate_switch"}
    failed = {name: rc for name, rc in steps.items() if rc != "0"}
    assert set(steps) == expected and not failed, (failed, _tails(out, failed))

    assert json.loads((out / "env.json").read_text())["modules"]["pydantic"] is None
    tests = ElementTree.parse(out / "pytest_gpu.xml").getroot().find("testsuite")
    assert tests is not None and int(tests.get("tests", 0)) >= 1
    assert tests.get("skipped") == tests.get("tests")  # collected, and skipped: no CUDA here
    bench = json.loads((out / "bench_resident.json").read_text())
    assert bench["errors"] == {} and bench["frames"] > 0 and bench["warm_ttff_ms"] > 0
    assert bench["switch_ms"]["N"]["sr"]["median"] >= 0 and bench["a2v_step"]["tflop"] > 0
    sp = json.loads((out / "sp_check.json").read_text())
    assert all(sp["one_rank_sp"][f"g{groups}"]["max_abs_diff"] < 1e-5 for groups in (1, 2, 4))
    assert 0 <= sp["overlap"]["overlap"] <= 1 and sp["overlap"]["attention_ms"] > 0

    logs = _import_logs(log)
    assert len(logs) >= len(expected)  # every Python step ran under the imitation
    assert [entry for entry in logs if entry["leaked"]] == []


def _tails(out: Path, steps: dict[str, str]) -> dict[str, str]:
    return {name: (out / f"{name}.err").read_text()[-2000:] for name in steps if (out / f"{name}.err").exists()}
