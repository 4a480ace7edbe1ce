"""Import rules: the API and the workflows never load the node's code or the media stack, so an API process
runs from the `api` extra alone (no torch, OpenCV, PyAV or Pillow installed), and pyproject's extras say so."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
MEDIA_STACK = ("torch", "cv2", "av", "PIL", "gpu_worker", "safetensors", "accelerate")
MEDIA_PACKAGES = {"torch", "opencv-python-headless", "av", "pillow", "safetensors", "accelerate"}


def test_api_and_workflows_import_no_node_code_and_no_media_stack(tmp_path: Path) -> None:
    """Every module of `api/` and `workflows/` imported, and the app built, in a fresh interpreter."""
    probe = f"""
import importlib, pkgutil, sys
import api, workflows
for package in (api, workflows):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
from api.app import create_app
from monologue.settings import Settings
create_app(Settings(home={str(tmp_path)!r}))
print(sorted(name for name in {MEDIA_STACK!r} if name in sys.modules))
"""
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def _closure(extra: str) -> set[str]:
    """The packages `pip install monologue[extra]` asks for, extras of extras followed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names: set[str] = set()
    pending = [*project["dependencies"], *project["optional-dependencies"][extra]]
    seen: set[str] = set()
    while pending:
        requirement = Requirement(pending.pop())
        if requirement.name == project["name"]:
            for inner in requirement.extras - seen:
                seen.add(inner)
                pending.extend(project["optional-dependencies"][inner])
            continue
        names.add(canonicalize_name(requirement.name))
    return names


def test_the_api_extra_has_no_media_stack_and_dev_has_everything() -> None:
    assert not _closure("api") & MEDIA_PACKAGES
    assert MEDIA_PACKAGES <= _closure("node") <= _closure("gpu")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    everything = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]} | {
        canonicalize_name(Requirement(r).name)
        for extra in project["optional-dependencies"].values()
        for r in extra
        if Requirement(r).name != project["name"]
    }
    assert _closure("dev") == everything
