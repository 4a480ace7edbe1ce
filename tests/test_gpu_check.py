"""The GPU check (infra/gpu_check.sh) runs on the lent CUDA image: torch, numpy, Pillow, pytest, transformers,
and neither diffusers nor the service stack. Here that machine is imitated on the CPU: a `sitecustomize.py` on
PYTHONPATH makes every service package and diffusers look uninstalled in every Python process the script starts
(`import` fails, `importlib.util.find_spec` says None, as when it is not there), pytest's plugins are not loaded (no
pytest-timeout, no pytest-asyncio), and the script runs in its dry mode (every step tiny, on the CPU): every step
runs, or is skipped saying why, and what comes back is three files.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpu_worker.distributed.sp_check import overlap_fraction
from tests.conftest import SERVICE_PACKAGES

ROOT = Path(__file__).resolve().parent.parent
INFINITETALK_TESTS = ROOT / "tests" / "gpu_worker" / "models" / "infinitetalk"  # each needing diffusers skips whole


def _names(path: Path) -> set[str]:
    """Normalised distribution names, one per line (# comments)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {_normal(line) for line in lines if line and not line.startswith("#")}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


ON_THE_IMAGE = _names(ROOT / "infra" / "gpu_image_packages.txt")
WHEELHOUSE = _names(ROOT / "infra" / "wheelhouse.txt")


def _needs(name: str) -> set[str]:
    """What distribution `name`, as installed here, requires (extras left out); nothing if it is not here."""
    try:
        requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {_normal(re.split(r"[^A-Za-z0-9._-]", need, maxsplit=1)[0]) for need in requires if "extra ==" not in need}


def missing_on_the_image(wheelhouse: bool) -> set[str]:
    """Every importable top-level module installed here whose distributions are not on the image (nor, with
    `wheelhouse`, among the wheels brought along): what the lent GPU machine lacks."""
    there = ON_THE_IMAGE | (WHEELHOUSE if wheelhouse else set())
    # What they need, transitively, as installed here (their versions there differ; what the image is known to
    # lack stays out).
    lacking, grown = {_normal(name) for name in SERVICE_PACKAGES}, set(there)
    while grown:
        grown = {need for name in grown for need in _needs(name)} - lacking - there
        there |= grown
    there.add("monologue")  # this project's own packages travel with the working tree
    mapping = importlib.metadata.packages_distributions()
    missing = {module for module, dists in mapping.items() if not {_normal(d) for d in dists} & there}
    return {module for module in missing if module.isidentifier()}


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


def _imitation(tmp_path: Path, wheelhouse: bool) -> tuple[dict[str, str], Path]:
    site, log = tmp_path / "site", tmp_path / "imports"
    site.mkdir()
    log.mkdir()
    blocked = sorted(missing_on_the_image(wheelhouse))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=blocked, log=str(log)))
    env = {**os.environ, "PYTHONPATH": str(site), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PY": sys.executable}
    return env, log


@pytest.fixture
def bare(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """(environment of a bare GPU machine, no wheels brought; folder of the processes' import logs)."""
    return _imitation(tmp_path, wheelhouse=False)


def test_the_imitation_hides_what_the_image_lacks() -> None:
    assert missing_on_the_image(wheelhouse=True) >= SERVICE_PACKAGES
    assert {"diffusers", "ftfy"} <= missing_on_the_image(wheelhouse=False) - missing_on_the_image(wheelhouse=True)
    assert not {"torch", "numpy", "PIL", "safetensors", "pytest", "gpu_worker"} & missing_on_the_image(False)


def test_the_gpu_tests_collect_with_the_wheelhouse(tmp_path: Path) -> None:
    """With the wheels of infra/wheelhouse.txt brought (and nothing else the image lacks), every GPU test module
    imports: none stops the collection (ftfy once did, imported by the infinitetalk encoders)."""
    env, _ = _imitation(tmp_path, wheelhouse=True)
    command = [sys.executable, "-m", "pytest", "tests/gpu_worker", "-m", "gpu", "--collect-only", "-q"]
    done = subprocess.run([*command, "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True)
    summary = done.stdout.strip().splitlines()[-1]  # "1/187 tests collected (186 deselected) in 4.38s"
    assert done.returncode == 0 and re.search(r"tests? collected", summary), done.stdout[-3000:]
    assert "error" not in summary and "ImportError while importing" not in done.stdout, done.stdout[-3000:]
    assert "SKIPPED" not in done.stdout, done.stdout[-3000:]  # diffusers imports: no infinitetalk module skips


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
    """The dry run of every step: the environment report, the GPU-marked tests (collected and skipped: no CUDA here;
    the infinitetalk modules skipped for want of diffusers, saying so), the shared weights, the benchmarks' JSON,
    the infinitetalk step skipped with its reason, the SP kernel check, the render records and the quality gate;
    nothing of the service stack imported; three files back."""
    env, log = bare
    out = tmp_path / "out"
    env |= {"OUT": str(out), "GPU_CHECK_DRY": "1", "RECORD_VARIANTS": "bf16:resident bf16:switch"}
    done = subprocess.run(["bash", "infra/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in out.iterdir()) == ["gpu_check.tar.gz", "steps.tsv", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    outcomes = {row["step"]: (row["outcome"], row["why"]) for row in summary["steps"]}
    ran = {"env", "pytest_gpu", "build", "bench_resident", "sp_check", "decoder_timing", "bench_compiled"}
    ran |= {"bench_switch", "bench_fp8", "bench_eager_decoder"}
    ran |= {"record_bf16_resident", "record_bf16_switch", "gate_switch"}
    failed = {row["step"]: row.get("stderr_tail") for row in summary["steps"] if row["outcome"] == "failed"}
    wanting = {"infinitetalk": ("skipped", ANY_DIFFUSERS), "wan_vae": ("skipped", ANY_DIFFUSERS)}
    assert outcomes == {name: ("ok", None) for name in ran} | wanting, failed
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "gpu_check.tar.gz") as packed:
        packed.extractall(unpacked, filter="data")

    figures = summary["figures"]
    assert figures["env"]["modules"]["pydantic"] is None and figures["env"]["modules"]["diffusers"] is None
    tests = summary["pytest_gpu"]
    assert tests["tests"] >= 1 and tests["failures"] == tests["errors"] == 0
    skips = {case["test"]: case["message"] for case in tests["not_passed"] if case["outcome"] == "skipped"}
    assert len(skips) == tests["skipped"] == tests["tests"]  # collected, and skipped: no CUDA here
    infinitetalk = [message for test, message in skips.items() if "infinitetalk" in test]
    needing = [path for path in INFINITETALK_TESTS.glob("test_*.py") if 'importorskip("diffusers"' in path.read_text()]
    assert len(infinitetalk) == len(needing) >= 3 and all("diffusers" in message for message in infinitetalk)
    assert (unpacked / "pytest_gpu.xml").exists()
    bench = figures["bench_resident"]
    assert bench["errors"] == {} and bench["warm_ttff_ms"] > 0  # measured (0 is the report's unmeasured default)
    assert (bench["chunks"], bench["frames"]) == (2, 8)  # the dry BENCH args: the warm session's N0 and N1 of 4 frames
    assert bench["switch_ms"]["N"]["sr"]["median"] > 0 and bench["a2v_step"]["tflop"] > 0
    assert "wrote" in (unpacked / "build.out").read_text()  # the one checkpoint the later steps load
    decoder = figures["decoder_timing"]
    assert decoder["nchw"]["repeatable"] and decoder["nchw"]["max_diff_vs_first"] == 0
    assert decoder["nhwc"]["max_diff_vs_first"] <= 2 and decoder["spatial_tflop"] > 0  # a layout, not another model
    assert figures["bench_fp8"]["errors"] == {} and figures["bench_fp8"]["warm_ttff_ms"] > 0
    sp = figures["sp_check"]
    assert all(sp["one_rank_sp"][f"g{groups}"]["max_abs_diff"] < 1e-5 for groups in (1, 2, 4))
    timing = sp["overlap"]
    assert min(timing["attention_ms"], timing["copy_ms"], timing["together_ms"]) > 0
    assert timing["overlap"] == overlap_fraction(timing["attention_ms"], timing["copy_ms"], timing["together_ms"])

    logs = _import_logs(log)
    assert len(logs) >= len(ran)  # every Python step ran under the imitation
    assert [entry for entry in logs if entry["leaked"]] == []


def test_overlap_is_none_when_one_side_took_no_time() -> None:
    """A copy timed on a stream that did no work measures zero: no overlap figure, not a division by zero."""
    assert overlap_fraction(2.0, 0.0, 2.0) is None
    assert overlap_fraction(2.0, 1.0, 2.5) == 0.5
    assert overlap_fraction(2.0, 1.0, 3.5) == 0.0  # slower together: nothing hidden


class _Mentions(str):
    """Equal to any text that mentions diffusers (a skip's reason)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and "diffusers" in other

    __hash__ = str.__hash__


ANY_DIFFUSERS = _Mentions("diffusers")
