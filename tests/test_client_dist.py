"""The light client (clients/python, `monologue-client`): the repository's own client modules without the server's
dependencies. Importing it loads only modules the distribution ships and none of the server's packages; its
dependencies are stated as the root project states them; installed alone into an empty venv, it renders against the
stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement

from monologue.mp4.boxes import iter_boxes
from tests.helpers import api_key, wav_bytes

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "clients" / "python"
# What the client must never need: the server's packages (issue 30), and the settings above them. (Not click: httpx
# imports it where it is installed, for its own command line.)
SERVER_ONLY = ("temporalio", "sqlalchemy", "psycopg", "boto3", "botocore", "numpy", "pydantic_settings", "structlog")
# Everything the client offers, the live socket's helpers included (websockets loads lazily, on the first stream).
IMPORTS = "import monologue.client, monologue.client.live, websockets.sync.client, websockets.asyncio.client"


def _project(path: Path) -> dict[str, object]:
    return tomllib.loads((path / "pyproject.toml").read_text())


def _shipped() -> set[str]:
    """The modules the client distribution is built from (its setuptools lists, whole packages expanded)."""
    setup = _project(CLIENT)["tool"]["setuptools"]  # type: ignore[index]
    root = (CLIENT / setup["package-dir"][""]).resolve()
    modules = {"monologue", *setup["py-modules"]}
    for package in setup["packages"]:
        folder = root.joinpath(*package.split("."))
        modules |= {package} | {f"{package}.{path.stem}" for path in folder.glob("*.py") if path.stem != "__init__"}
    return modules


def test_importing_the_client_loads_only_what_its_distribution_ships() -> None:
    """Run where every package is installed: a client module importing a server module (settings, the database,
    Temporal's client) would load it here, and the client distribution would fail to import without it."""
    probe = f"{IMPORTS}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = json.loads(ran.stdout)
    ours = {name for name in loaded if name.split(".")[0] == "monologue"}
    assert ours <= _shipped(), f"the client imports modules clients/python does not ship: {sorted(ours - _shipped())}"
    assert not [name for name in SERVER_ONLY if name in loaded]


def test_the_client_states_each_dependency_as_the_root_project_does() -> None:
    """One floor per package: a floor raised for a vulnerability at the root is raised for the client too."""
    root = {Requirement(line).name: str(Requirement(line)) for line in _project(ROOT)["project"]["dependencies"]}  # type: ignore[index]
    client = [Requirement(line) for line in _project(CLIENT)["project"]["dependencies"]]  # type: ignore[index]
    assert [str(requirement) for requirement in client] == [root.get(requirement.name) for requirement in client]
    assert not {requirement.name.replace("-", "_") for requirement in client} & set(SERVER_ONLY)


RENDER = """
import importlib.util, json, os, sys
from pathlib import Path

{imports}
import monologue
from monologue.client import Client, Layout

api_url, folder = sys.argv[1], Path(sys.argv[2])
with Client(api_url, api_key=os.environ["MONOLOGUE_API_KEY"]) as client:
    created = client.create_render(portrait=folder / "portrait.jpg", audio=folder / "speech.wav")
    done = client.wait(created.id)
    size = client.download(done.id, folder / "out.mp4", layout=Layout.PROGRESSIVE)
server_only = {server_only!r}
print(json.dumps({{
    "status": done.status,
    "size": size,
    "monologue": monologue.__file__,
    "loaded": [name for name in server_only if name in sys.modules],
    "installed": [name for name in server_only if importlib.util.find_spec(name) is not None],
}}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_client_alone_in_an_empty_venv_renders_against_the_stack(
    api_url: str, sample_portrait: bytes, tmp_path: Path
) -> None:
    """One `pip install` of clients/python into a venv without system site packages (the lock as constraints),
    then a render from that venv's Python, outside the checkout."""
    # A copy of the two folders the build reads: setuptools writes its build/ and egg-info beside them, not into
    # the checkout.
    source = tmp_path / "source"
    shutil.copytree(CLIENT, source / "clients" / "python", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    shutil.copytree(ROOT / "monologue", source / "monologue", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = ["-c", str(ROOT / "infra" / "constraints.txt")]
    subprocess.run([*install, *constraints, str(source / "clients" / "python")], check=True, timeout=240)

    work = tmp_path / "work"
    work.mkdir()
    (work / "portrait.jpg").write_bytes(sample_portrait)
    (work / "speech.wav").write_bytes(wav_bytes(np.zeros(16_000)))
    (work / "render.py").write_text(RENDER.format(imports=IMPORTS, server_only=SERVER_ONLY))
    env = {"PATH": os.environ["PATH"], "MONOLOGUE_API_KEY": api_key(api_url) or ""}
    ran = subprocess.run(
        [python, "render.py", api_url, str(work)], cwd=work, env=env, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"] == "completed" and Path(result["monologue"]).is_relative_to(venv)
    assert result["loaded"] == [] and result["installed"] == []
    video = (work / "out.mp4").read_bytes()
    assert result["size"] == len(video) and [box.kind for box in iter_boxes(video)] == [b"ftyp", b"moov", b"mdat"]
