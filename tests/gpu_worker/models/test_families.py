"""Each model family is defined once: a member of `contracts.Family` (with its latent grid), one entry of
`gpu_worker.models.FAMILIES` (what it loads, its settings), and no module keeping its own list of names."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import gpu_worker.models as registry
from gpu_worker.models import FAMILIES, build_family, family_entry
from gpu_worker.pipeline import ModelSet
from monologue.contracts import Family
from monologue.contracts.session import LATENT_GRIDS

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ("activities", "api", "gpu_worker", "monologue", "workflows")
FAMILY_ENV = re.compile(rf"MONOLOGUE_({'|'.join(family.name for family in Family)})_[A-Z0-9_]+")


def _modules() -> list[Path]:
    return [path for package in SOURCES for path in sorted((ROOT / package).rglob("*.py"))]


def test_every_family_has_exactly_one_entry_and_one_grid() -> None:
    listed = [entry.family for entry in registry._ENTRIES]
    assert sorted(listed) == sorted(Family), "one registry entry per contracts.Family member, no more"
    assert set(LATENT_GRIDS) == set(Family)
    for family, entry in FAMILIES.items():
        assert entry.family is family
        assert entry.grid == family.grid == (family.temporal_stride, family.leading_frames)


def test_every_entry_names_a_package_with_a_builder() -> None:
    """Read, not imported: the dit and infinitetalk packages pull in torch and diffusers."""
    for entry in FAMILIES.values():
        spec = importlib.util.find_spec(entry.package)
        assert spec is not None and spec.origin is not None, entry.package
        defined = {
            node.name for node in ast.parse(Path(spec.origin).read_text()).body if isinstance(node, ast.FunctionDef)
        }
        assert "build_family" in defined, f"{entry.package} has no build_family()"
        if entry.weight_settings:
            assert "check_weights" in defined, f"{entry.package} has weight settings but no check_weights()"
        assert set(entry.weight_settings) <= set(entry.settings)


def test_a_family_builds_its_model_set_by_enum() -> None:
    models = build_family(Family.WARP)
    assert isinstance(models, ModelSet) and models.name == Family.WARP == "warp"


def test_an_unknown_family_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown model family 'nope'; known: warp, dit, infinitetalk"):
        family_entry("nope")  # type: ignore[arg-type]


def test_settings_keep_their_environment_names() -> None:
    """Deployments set these: the registry derives them, and must derive the names they always had."""
    dit, talk = FAMILIES[Family.DIT], FAMILIES[Family.INFINITETALK]
    assert [dit.env(name) for name in dit.settings] == [
        "MONOLOGUE_DIT_WEIGHTS",
        "MONOLOGUE_DIT_WARM_RESOLUTIONS",
        "MONOLOGUE_DIT_QUANTIZE",
    ]
    assert [talk.env(name) for name in talk.settings] == [
        "MONOLOGUE_INFINITETALK_WEIGHTS",
        "MONOLOGUE_INFINITETALK_WAN",
        "MONOLOGUE_INFINITETALK_WAV2VEC",
        "MONOLOGUE_INFINITETALK_ADAPTER",
        "MONOLOGUE_INFINITETALK_PRESET",
        "MONOLOGUE_INFINITETALK_LORA",
        "MONOLOGUE_INFINITETALK_LORA_STRENGTH",
        "MONOLOGUE_INFINITETALK_QUANTIZE",
    ]
    with pytest.raises(ValueError, match="no setting 'weights'"):
        FAMILIES[Family.WARP].env("weights")


def test_no_module_keeps_its_own_list_of_families() -> None:
    """No literal collection of two or more family names, no family setting spelled outside the registry, and one
    class called Family (the contracts' enum; the pipeline's bundle of modules is a ModelSet)."""
    names = {family.value for family in Family}
    problems = []
    for path in _modules():
        relative = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                listed = {item.value for item in items if isinstance(item, ast.Constant) and item.value in names}
                if len(listed) > 1:
                    problems.append(f"{relative}:{node.lineno} lists families {sorted(listed)}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and FAMILY_ENV.fullmatch(node.value):
                problems.append(f"{relative}:{node.lineno} spells {node.value} (ask FAMILIES[...].env)")
            if (
                isinstance(node, ast.ClassDef)
                and node.name == "Family"
                and relative != Path("monologue/contracts/session.py")
            ):
                problems.append(f"{relative}:{node.lineno} defines another Family")
    assert not problems, "\n".join(problems)
