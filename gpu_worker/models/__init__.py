"""Model families. Each lives in `gpu_worker/models/<family>/` and exposes `build_family() -> Family`."""

from __future__ import annotations

import importlib
import os

from gpu_worker.pipeline import Family

FAMILIES = ("warp", "dit", "infinitetalk")

# Where the infinitetalk family's checkpoints are (read by gpu_worker/models/infinitetalk/__init__.py; named here so
# the node can tell whether they are configured without importing diffusers and transformers).
INFINITETALK_WEIGHTS_ENV = "MONOLOGUE_INFINITETALK_WEIGHTS"
INFINITETALK_PART_ENVS = {
    "wan": "MONOLOGUE_INFINITETALK_WAN",
    "wav2vec": "MONOLOGUE_INFINITETALK_WAV2VEC",
    "adapter": "MONOLOGUE_INFINITETALK_ADAPTER",
}


def build_family(name: str) -> Family:
    """The named family with its modules constructed (weights load when a Pipeline starts)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    module = importlib.import_module(f"gpu_worker.models.{name}")
    family: Family = module.build_family()
    return family


def check_configured_weights() -> None:
    """At node start: a family whose user-given weights are configured checks every file's tensor names and shapes
    now (headers only), so a missing or mismatched file stops the node instead of failing a render. Raises
    gpu_worker.models.dit.checkpoint.CheckpointError naming the file, the key and the shapes."""
    names = (INFINITETALK_WEIGHTS_ENV, *INFINITETALK_PART_ENVS.values())
    if any(os.environ.get(name, "").strip() for name in names):
        from gpu_worker.models.infinitetalk import check_weights

        check_weights()
