"""The dependency floors keep known-vulnerable releases out, and the lock (infra/constraints.txt) that setup and
CI install from pins every dependency to a version the floors allow."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# Releases with advisories against what Monologue does (decode uploaded WebP, parse multipart forms, serve
# Range requests, speak HTTP/1.1): each must be refused by pyproject.toml's floors.
VULNERABLE = {
    "pillow": "10.0.0",  # libwebp heap overflow, CVE-2023-4863
    "python-multipart": "0.0.17",  # multipart boundary DoS, CVE-2024-53981
    "starlette": "0.49.0",  # Range header DoS, CVE-2025-62727
    "h11": "0.15.0",  # request smuggling, CVE-2025-43859
}


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    requirements = map(Requirement, listed)
    # `monologue[api,node]`: an extra made of others, not a dependency to lock.
    return {canonicalize_name(req.name): req for req in requirements if req.name != project["name"]}


def _locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "infra" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


@pytest.mark.parametrize("name", sorted(VULNERABLE))
def test_known_vulnerable_releases_are_refused(name: str) -> None:
    requirement = _requirements()[name]
    assert not requirement.specifier.contains(VULNERABLE[name]), f"{requirement} admits {name} {VULNERABLE[name]}"


def test_the_lock_pins_every_dependency_within_its_floor() -> None:
    locked = _locked()
    for name, requirement in _requirements().items():
        if name == "torch":  # pinned by infra/setup.sh (the CPU build), not by the lock
            continue
        assert name in locked, f"{name} is not in infra/constraints.txt; run infra/lock.sh"
        assert requirement.specifier.contains(locked[name]), f"the lock's {name} {locked[name]} breaks {requirement}"
