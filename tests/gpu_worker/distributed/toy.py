"""What the distributed tests run on every rank: a toy transformer with `.blocks`, a tiny torch family whose
audio-to-video model is sharded over the ranks, and small `Work` steps.

A module of its own (not the test files) because the spawned ranks unpickle these classes by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from gpu_worker.distributed import ModelSwitcher, RankContext, current_group, reset_after_failure, shard_model
from gpu_worker.pipeline import (
    AudioToVideo,
    AudioWindow,
    ChunkRequest,
    ContextGenerator,
    Decoder,
    ModelSet,
    OutputSpec,
    ReferenceEncoder,
    SuperResolution,
    frame_size,
)
from gpu_worker.pipeline.module import A2VOutput, Anchor, Reference
from gpu_worker.pipeline.progress import StepProgress, no_steps

IN_FEATURES, OUT_FEATURES = 8, 4


class Block(nn.Module):
    """Pre-norm residual MLP block; `fail` makes it raise (the error-path tests)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("block failed on purpose")
        out: torch.Tensor = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return out


class ToyTransformer(nn.Module):
    """(N, 8) → (N, 4) through `blocks`; the dimension is odd so FSDP pads its shards."""

    def __init__(self, dim: int = 33, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, OUT_FEATURES)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x)  # (N, dim)
        for block in self.blocks:
            hidden = block(hidden)
        out: torch.Tensor = self.head(hidden) * self.scale
        return out


def toy_model(seed: int, dim: int = 33, layers: int = 3) -> ToyTransformer:
    """The same weights on every rank for the same seed."""
    torch.manual_seed(seed)
    return ToyTransformer(dim, layers)


def toy_input(seed: int, rows: int = 5) -> torch.Tensor:
    return torch.randn(rows, IN_FEATURES, generator=torch.Generator().manual_seed(seed + 1))


# Steps.


@dataclass(frozen=True)
class WhoAmI:
    def run(self, context: RankContext) -> int:
        return context.rank


@dataclass(frozen=True)
class RaiseOn:
    """Raise `kind` on the given ranks before any collective."""

    ranks: tuple[int, ...]
    message: str = "boom"
    kind: str = "ValueError"

    def run(self, context: RankContext) -> int:
        if context.rank in self.ranks:
            from monologue.errors import InputError

            raise {"ValueError": ValueError, "InputError": InputError}[self.kind](f"{self.message} on {context.rank}")
        return context.rank


@dataclass(frozen=True)
class Outputs:
    """The toy model's output on this rank, computed plain, sharded and offloaded (sharded or not), the
    offloaded ones after switching back and forth between two models."""

    seed: int

    def run(self, context: RankContext) -> dict[str, Any]:
        x = toy_input(self.seed)
        with torch.no_grad():
            out: dict[str, Any] = {"plain": toy_model(self.seed)(x).numpy()}
            sharded = shard_model(toy_model(self.seed), context.group.mesh)
            out["sharded"] = sharded(x).numpy()
            for name, mesh in (("offloaded", None), ("sharded_offloaded", context.group.mesh)):
                switcher = ModelSwitcher(context.device, lookahead=1)
                model, other = toy_model(self.seed), toy_model(self.seed + 7, dim=20, layers=2)
                switcher.register(model, name="model", mesh=mesh)
                switcher.register(other, name="other", mesh=mesh)
                out[f"{name}_resident_bytes_idle"] = switcher.resident_bytes(model)
                runs, reports = [], []
                for _ in range(3):
                    reports.append(switcher.activate(model))
                    runs.append(model(x).numpy())
                    out[f"{name}_resident_bytes_active"] = switcher.resident_bytes(model)
                    switcher.activate(other)
                    other(x)
                out[name] = runs
                out[f"{name}_visible_ms"] = [report.visible_ms for report in reports]
                out[f"{name}_resident_bytes_after"] = switcher.resident_bytes(model)
        return out


@dataclass(frozen=True)
class ShardedForward:
    """A sharded toy model kept on each rank between steps; `fail_rank` raises in block `fail_block`.

    Registers FSDP's reset with the group, so a forward aborted on one rank leaves nothing behind."""

    layers: int
    fail_rank: int | None = None
    fail_block: int = 0

    def run(self, context: RankContext) -> tuple[np.ndarray, float]:
        key = f"sharded-{self.layers}"
        if key not in context.local:
            sharded = shard_model(toy_model(3, layers=self.layers), context.group.mesh)
            context.group.on_step_failure(lambda: reset_after_failure(sharded))
            context.local[key] = sharded
        model: ToyTransformer = context.local[key]
        for index, block in enumerate(model.blocks):
            block.fail = context.rank == self.fail_rank and index == self.fail_block  # type: ignore[assignment]
        started = time.perf_counter()
        with torch.no_grad():
            out: np.ndarray = model(toy_input(3)).numpy()
        return out, time.perf_counter() - started


@dataclass(frozen=True)
class PlainForward:
    layers: int

    def run(self, context: RankContext) -> np.ndarray:
        with torch.no_grad():
            result: np.ndarray = toy_model(3, layers=self.layers)(toy_input(3)).numpy()
        return result


# A tiny torch family whose audio-to-video model is sharded over the rank group.


class Portrait(ReferenceEncoder):
    def encode(self, portrait: np.ndarray, output: OutputSpec) -> Reference:
        return {
            "frame_size": np.array(frame_size(portrait.shape[1], portrait.shape[0], output)),
            "tone": portrait.mean(axis=(0, 1)).astype(np.float32) / 255,
        }


class Loudness(ContextGenerator):
    margin_frames = (1, 2)

    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]:
        per_frame = window.rate // window.fps
        first = window.frame_start(chunk.first_frame)
        samples = window.samples[first : first + chunk.n_frames * per_frame].reshape(chunk.n_frames, per_frame)
        loudness = np.sqrt((samples**2).mean(axis=1)).astype(np.float32)
        return {"loudness": loudness, "noise": rng.normal(size=(chunk.n_frames, IN_FEATURES - 2)).astype(np.float32)}


class Motion(AudioToVideo):
    def __init__(self, sharded: bool) -> None:
        super().__init__()
        self.model = toy_model(11)
        group = current_group()
        if sharded and group is not None:
            shard_model(self.model, group.mesh)

    def _forward(self, context: dict[str, Any], start: float) -> np.ndarray:
        inputs = np.concatenate(
            [context["loudness"][:, None], np.full((len(context["loudness"]), 1), start, np.float32), context["noise"]],
            axis=1,
        )
        with torch.no_grad():
            out: np.ndarray = self.model(torch.from_numpy(inputs)).numpy()
        return out

    def generate_n(
        self,
        reference: Reference,
        context: dict[str, Any],
        previous: Anchor | None,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        start = 0.0 if previous is None else float(previous["value"][0, 0])
        values = self._forward(context, start)  # (T, 4)
        return A2VOutput(values, head={"value": values[:1]}, tail={"value": values[-1:]})

    def generate_i(
        self,
        reference: Reference,
        context: dict[str, Any],
        left: Anchor,
        right: Anchor,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        blend = np.linspace(0, 1, chunk.n_frames + 2, dtype=np.float32)[1:-1, None]
        return A2VOutput((1 - blend) * left["value"] + blend * right["value"] + 0.1 * self._forward(context, 0.5))


class Paint(SuperResolution):
    def upscale(self, reference: Reference, latents: Any) -> Any:
        width, height = (int(v) for v in reference["frame_size"])
        colour = 128 + 60 * np.tanh(np.asarray(latents)[:, :3]) * reference["tone"]  # (T, 3)
        return np.broadcast_to(colour[:, None, None, :], (len(colour), height, width, 3))


class Quantise(Decoder):
    def decode(self, reference: Reference, upscaled: Any) -> np.ndarray:
        frames: np.ndarray = np.clip(np.round(upscaled), 0, 255).astype(np.uint8)
        return frames


def build_sharded_toy(name: str) -> ModelSet:
    return ModelSet(name, Portrait(), Loudness(), Motion(sharded=True), Paint(), Quantise())


def build_plain_toy(name: str) -> ModelSet:
    return ModelSet(name, Portrait(), Loudness(), Motion(sharded=False), Paint(), Quantise())


@dataclass(frozen=True)
class DiTOutputs:
    """The dit family's tiny audio-to-video DiT, plain, sharded, and offloaded with and without sharding.

    Conditioning comes from the dit tests' own helper, so this follows that family's API as it moves. An
    import that breaks raises (reported as this step's error), so the test fails instead of skipping."""

    seed: int = 4

    def run(self, context: RankContext) -> dict[str, Any]:
        from gpu_worker.models.dit.a2v import AudioToVideoDiT
        from gpu_worker.models.dit.config import TINY
        from gpu_worker.models.dit.layers import randomise
        from tests.gpu_worker.models.dit.test_flow import _conditioning

        def build() -> AudioToVideoDiT:
            model = AudioToVideoDiT(TINY)
            randomise(model, self.seed)
            return model.eval().requires_grad_(False)

        generator = torch.Generator().manual_seed(self.seed)
        cond = _conditioning(1, generator)
        noisy = torch.randn(1, TINY.latent_channels, 4, 4, 4, generator=generator)  # (B, C, T, h, w)
        t = torch.full((1,), 0.5)
        with torch.no_grad():
            out: dict[str, Any] = {"plain": build()(noisy, t, cond).numpy()}
            out["sharded"] = shard_model(build(), context.group.mesh)(noisy, t, cond).numpy()
            for name, mesh in (("offloaded", None), ("sharded_offloaded", context.group.mesh)):
                switcher = ModelSwitcher(context.device)
                model, other = build(), toy_model(self.seed)
                switcher.register(model, name="a2v", mesh=mesh)
                switcher.register(other, name="other")
                runs = []
                for _ in range(2):
                    switcher.activate(model)
                    runs.append(model(noisy, t, cond).numpy())
                    switcher.activate(other)
                    other(toy_input(self.seed))
                out[name] = runs
        return out
