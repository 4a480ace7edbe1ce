"""Distilled LoRAs for the Wan DiT (lightx2v's step/CFG-distilled LoRAs, FusionX), merged once into the weights
at load, so a step costs what it cost before: no extra matrix products, no second copy of the model.

Two published layouts are read, both with the weight names of the checkpoint they were trained on:
- the original's names under `diffusion_model.` (lightx2v's and Kijai's files, FusionX; what InfiniteTalk's
  `wan/wan_lora.py` reads): `<name>.lora_down.weight` (rank, in) and `<name>.lora_up.weight` (out, rank), or
  `lora_A`/`lora_B` for down/up; an optional `<name>.alpha` (the update is scaled by alpha / rank; without it by
  1); `<name>.diff`, a whole weight's difference, and `<name>.diff_b`, a bias's;
- diffusers/PEFT names under `transformer.` (diffusers' `save_lora_weights`): `<name>.lora_A.weight`,
  `<name>.lora_B.weight` (alpha already folded into them by diffusers' conversion, or an `.alpha` beside them) and
  `<name>.lora_B.bias` (PEFT's lora_bias: a bias difference).
An original name goes through the checkpoint loader's own key map (`rename.dit_map`), so the LoRA lands on the
tensor the same original name loads into: one mapping is the truth. Diffusers names are this model's already.

Strict, as the checkpoint is: every key must land on one of the model's tensors with a matching shape, else one
`CheckpointError` lists every key that does not (with both shapes where the name matched), at node start, on the
file's header alone. Each updated weight is merged in fp32, W + strength (alpha / rank) up @ down, from the file's
own values, and cast to the model's dtype once (`checkpoint.convert`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import Tensor

from gpu_worker.models import FAMILIES
from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.models.infinitetalk.rename import KeyMap
from monologue.contracts import Family

# The operator's settings (read in __init__.py): the LoRA file, and how strongly it is merged (default 1).
LORA_ENV = FAMILIES[Family.INFINITETALK].env("lora")
LORA_STRENGTH_ENV = FAMILIES[Family.INFINITETALK].env("lora_strength")
ORIGINAL_PREFIX = "diffusion_model."
DIFFUSERS_PREFIX = "transformer."
# Key endings → what the tensor is; longest first, so `.diff_b` is not read as `.diff`.
_ROLES = (
    (".lora_down.weight", "down"),
    (".lora_up.weight", "up"),
    (".lora_A.weight", "down"),
    (".lora_B.weight", "up"),
    (".lora_B.bias", "bias"),
    (".diff_b", "bias"),
    (".alpha", "alpha"),
    (".diff", "diff"),
)


@dataclass(frozen=True)
class LoraFile:
    """A LoRA the operator names (`MONOLOGUE_INFINITETALK_LORA`) and how strongly it is merged (`…_LORA_STRENGTH`)."""

    path: Path
    strength: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.strength):
            raise ValueError(f"LoRA strength must be a finite number (got {self.strength})")

    def updates(self, keymap: KeyMap, expected: Mapping[str, tuple[int, ...]], shapes_only: bool) -> dict[str, Update]:
        """The file's updates by our weight names, checked against `expected` (the model's shapes); a
        CheckpointError listing every key that does not fit."""
        if self.path.suffix != ".safetensors" or not self.path.is_file():
            raise CheckpointError(f"infinitetalk LoRA: {self.path} is not a .safetensors file")
        return match(_read(self.path, shapes_only), keymap, expected, self.strength, str(self.path))


@dataclass
class Update:
    """What a LoRA changes in one of the model's tensors: a low-rank product, a whole difference, or both."""

    strength: float
    up: Tensor | None = None  # (out, rank, 1...)
    down: Tensor | None = None  # (rank, in, kernel...)
    alpha: Tensor | None = None
    diff: Tensor | None = None  # the tensor's shape

    @property
    def scale(self) -> float:
        """strength × alpha / rank (alpha absent: 1, as the files without it were trained)."""
        if self.up is None or self.alpha is None:
            return self.strength
        return self.strength * float(self.alpha.float().reshape(())) / self.up.shape[1]

    def merged(self, tensor: Tensor) -> Tensor:
        """`tensor` + the update, in fp32 (a new tensor: `tensor` may be a read-only file map)."""
        out = tensor.to(torch.float32, copy=True)
        if self.up is not None and self.down is not None:
            product = self.up.float().flatten(1) @ self.down.float().flatten(1)  # (out, in × kernel)
            out += self.scale * product.view_as(out)
        if self.diff is not None:
            out += self.strength * self.diff.float()
        return out


def _read(path: Path, shapes_only: bool) -> dict[str, Tensor]:
    if not shapes_only:
        return safetensors.torch.load_file(path)
    with safetensors.safe_open(path, "pt") as handle:  # type: ignore[no-untyped-call]
        return {key: torch.empty(handle.get_slice(key).get_shape(), device="meta") for key in handle.keys()}  # noqa: SIM118


def _target(name: str, kind: str, original: bool, keymap: KeyMap, expected: Mapping[str, tuple[int, ...]]) -> str:
    """Our tensor for a LoRA target `name` (`kind`: weight or bias); KeyError if the model has none. A weight
    difference may also name a tensor without a `.weight` ending (`blocks.0.modulation`)."""
    candidates = [f"{name}.{kind}"] + ([name] if kind == "weight" else [])
    for candidate in candidates:
        if original:
            try:
                names = keymap.ours(candidate)
            except KeyError:
                continue
            if len(names) == 1 and names[0] in expected:
                return names[0]
        elif candidate in expected:
            return candidate
    raise KeyError(name)


def _problems(key: str, role: str, update: Update, want: tuple[int, ...]) -> list[str]:
    """What is wrong with one tensor of an update, against the model tensor's shape `want`."""
    tensor = {"up": update.up, "down": update.down, "alpha": update.alpha}.get(role)
    if role == "alpha":
        return [] if tensor is not None and tensor.numel() == 1 else [f"{key!r} is not one number"]
    if role in ("diff", "bias"):
        shape = tuple(update.diff.shape)  # type: ignore[union-attr]
        return [] if shape == want else [f"{key!r} has shape {shape}, the model's tensor {want}"]
    shape = tuple(tensor.shape)  # type: ignore[union-attr]
    if role == "up" and (len(shape) != len(want) or shape[0] != want[0] or any(size != 1 for size in shape[2:])):
        return [
            f"{key!r} has shape {shape}, the model's tensor {want} needs ({want[0]}, rank{', 1' * (len(want) - 2)})"
        ]
    if role == "down" and (len(shape) != len(want) or shape[1:] != want[1:]):
        return [f"{key!r} has shape {shape}, the model's tensor {want} needs (rank, {', '.join(map(str, want[1:]))})"]
    return []


def match(
    tensors: Mapping[str, Tensor],
    keymap: KeyMap,
    expected: Mapping[str, tuple[int, ...]],
    strength: float,
    where: str,
) -> dict[str, Update]:
    """A LoRA file's tensors as updates by our tensor names, or a CheckpointError naming every key that does not
    land on a tensor of the model with a fitting shape (see the module docstring for the layouts)."""
    updates: dict[str, Update] = {}
    sources: dict[tuple[str, str], str] = {}  # (our tensor, role) → the file's key
    problems: list[str] = []
    for key, tensor in tensors.items():
        original = key.startswith(ORIGINAL_PREFIX)
        prefix = ORIGINAL_PREFIX if original else DIFFUSERS_PREFIX if key.startswith(DIFFUSERS_PREFIX) else None
        role = next(((suffix, role) for suffix, role in _ROLES if key.endswith(suffix)), None)
        if prefix is None or role is None:
            problems.append(
                f"{key!r} is neither {ORIGINAL_PREFIX}<name> nor {DIFFUSERS_PREFIX}<name> with lora_down/lora_up/"
                f"lora_A/lora_B(.weight), alpha, diff or diff_b"
            )
            continue
        suffix, role_name = role
        name = key[len(prefix) : -len(suffix)]
        try:
            ours = _target(name, "bias" if role_name == "bias" else "weight", original, keymap, expected)
        except KeyError:
            problems.append(f"{key!r}: the DiT has no tensor {name!r}")
            continue
        if (ours, role_name) in sources:
            problems.append(f"{key!r} and {sources[ours, role_name]!r} both update {ours}")
            continue
        sources[ours, role_name] = key
        update = updates.setdefault(ours, Update(strength))
        setattr(update, "diff" if role_name == "bias" else role_name, tensor)
        problems += _problems(key, role_name, update, expected[ours])
    for ours, update in updates.items():
        low_rank = {role: sources.get((ours, role)) for role in ("down", "up", "alpha")}
        given = [key for key in low_rank.values() if key]
        if given and (update.up is None or update.down is None):
            problems.append(f"{', '.join(map(repr, given))}: {ours} needs both a down and an up tensor")
        elif update.up is not None and update.down is not None and update.up.shape[1] != update.down.shape[0]:
            problems.append(
                f"{low_rank['up']!r} has rank {update.up.shape[1]}, {low_rank['down']!r} rank {update.down.shape[0]}"
            )
    if problems:
        raise CheckpointError(
            f"infinitetalk LoRA {where} does not fit the DiT ({len(problems)} problems): {'; '.join(problems)}"
        )
    return updates
