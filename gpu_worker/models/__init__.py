"""Model families: THE registry. Each family lives in `gpu_worker/models/<family>/`, whose `build_family()`
returns its `ModelSet`; `FAMILIES` has one entry per `contracts.Family` (a test holds it to that) saying what the
family loads and which settings it reads. Its latent grid is the contract's (`Family.grid`: the workflows plan
chunks on it), so an entry refers to it rather than repeat it.

Importing this module loads no family: an entry names its package, imported when the family is first built (the
dit and infinitetalk packages pull in torch, diffusers and transformers)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_worker.pipeline import ModelSet
from monologue.contracts import Family
from monologue.contracts.session import LatentGrid

SETTINGS_PREFIX = "MONOLOGUE_"


@dataclass(frozen=True)
class FamilyEntry:
    """One family as a node knows it."""

    family: Family
    package: str  # its `build_family(**overrides) -> ModelSet`, and `check_weights()` if it has `weight_settings`
    # The environment variables its package reads, by setting: MONOLOGUE_<FAMILY>_<SETTING> (`env`). Read in the
    # package alone (the GPU machine has no pydantic-settings); named here so the node and the tests can set and
    # check them without importing the package.
    settings: tuple[str, ...] = ()
    # The settings that name user-given weights: when any is set, the node checks the files at start.
    weight_settings: tuple[str, ...] = ()

    @property
    def grid(self) -> LatentGrid:
        return self.family.grid

    def env(self, setting: str) -> str:
        """The environment variable of one of the family's settings."""
        if setting not in self.settings:
            raise ValueError(f"the {self.family} family has no setting {setting!r}; its settings: {self.settings}")
        return f"{SETTINGS_PREFIX}{self.family.name}_{setting.upper()}"

    def weights_configured(self) -> bool:
        return any(os.environ.get(self.env(setting), "").strip() for setting in self.weight_settings)

    def configuration(self) -> dict[str, str]:
        """Its settings as the environment gives them: what a reference kept beyond one session (an avatar's) was
        encoded under, so other weights or a preset do not reuse it."""
        return {setting: os.environ.get(self.env(setting), "") for setting in self.settings}

    def build(self, **overrides: Any) -> ModelSet:
        """The family's modules, constructed (weights load when a Pipeline starts); `overrides` go to its
        package's `build_family` (weights, precision)."""
        models: ModelSet = importlib.import_module(self.package).build_family(**overrides)
        return models


_ENTRIES = (
    FamilyEntry(Family.WARP, "gpu_worker.models.warp"),
    FamilyEntry(Family.DIT, "gpu_worker.models.dit", settings=("weights", "warm_resolutions", "quantize")),
    FamilyEntry(
        Family.INFINITETALK,
        "gpu_worker.models.infinitetalk",
        settings=("weights", "wan", "wav2vec", "adapter", "preset", "lora", "lora_strength", "quantize"),
        weight_settings=("weights", "wan", "wav2vec", "adapter"),
    ),
)
FAMILIES: Mapping[Family, FamilyEntry] = {entry.family: entry for entry in _ENTRIES}


def family_entry(family: Family) -> FamilyEntry:
    """The registry's entry for `family`; ValueError naming the known families for anything else."""
    entry = FAMILIES.get(family)
    if entry is None:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    return entry


def build_family(family: Family) -> ModelSet:
    """`family`'s modules with their defaults (the weights its settings name)."""
    return family_entry(family).build()


def check_configured_weights() -> None:
    """At node start: a family whose user-given weights are configured checks every file's tensor names and shapes
    now (headers only), so a missing or mismatched file stops the node instead of failing a render. Raises
    gpu_worker.models.dit.checkpoint.CheckpointError naming the file, the key and the shapes."""
    for entry in FAMILIES.values():
        if entry.weights_configured():
            importlib.import_module(entry.package).check_weights()
