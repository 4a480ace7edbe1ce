"""Model families. Each lives in `gpu_worker/models/<family>/` and exposes `build_family() -> Family`."""

from __future__ import annotations

import importlib

from gpu_worker.pipeline import Family

FAMILIES = ("warp", "dit", "infinitetalk")


def build_family(name: str) -> Family:
    """The named family with its modules constructed (weights load when a Pipeline starts)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    module = importlib.import_module(f"gpu_worker.models.{name}")
    family: Family = module.build_family()
    return family
