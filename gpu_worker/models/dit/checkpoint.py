"""Weights: one safetensors file per model plus `config.json`, read from a local folder or S3.

    <folder or s3://bucket/prefix>/
        config.json                 DiTConfig (config.py): the architecture, never guessed from shapes
        vae_encoder.safetensors     reference encoder
        vae_decoder.safetensors     decoder
        audio_encoder.safetensors   context (speech)
        text_encoder.safetensors    context (prompt)
        a2v.safetensors             audio-to-video DiT
        sr.safetensors              super-resolution DiT

`Weights.build(name)` is the one path from (config, checkpoint) to a ready model. A key or shape that
does not match the configured architecture fails with the file, the key and both shapes, before any
weight is copied. Without a checkpoint, `Weights` draws every model from a fixed seed: a smoke-test
model that renders deterministic noise-like frames, and never downloads anything.

S3 goes through `monologue.storage.S3Store`, imported only when an s3:// location is used (the GPU
machine may lack boto3; local folders need nothing beyond torch and safetensors).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import safetensors.torch
import torch
from accelerate import init_empty_weights
from torch import Tensor, nn

from gpu_worker.models.dit.a2v import AudioToVideoDiT
from gpu_worker.models.dit.audio_encoder import AudioEncoder
from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.models.dit.layers import parameter_count, randomise
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.models.dit.text_encoder import TextEncoder
from gpu_worker.models.dit.vae import VAEDecoder, VAEEncoder
from monologue.errors import NotFound

CONFIG_FILE = "config.json"

BUILDERS: dict[str, Callable[[DiTConfig], nn.Module]] = {
    "vae_encoder": lambda config: VAEEncoder(config.vae),
    "vae_decoder": lambda config: VAEDecoder(config.vae),
    "audio_encoder": lambda config: AudioEncoder(config.audio),
    "text_encoder": lambda config: TextEncoder(config.text),
    "a2v": AudioToVideoDiT,
    "sr": SuperResolutionDiT,
}
MODEL_NAMES = tuple(BUILDERS)


class CheckpointError(ValueError):
    """A checkpoint that does not match its configuration (or is missing a file)."""


class Store(Protocol):
    """The part of monologue.storage.ObjectStore a checkpoint reads."""

    def get(self, key: str) -> bytes: ...


class Checkpoint:
    """A checkpoint's files, by name, from a local folder or an object store under a prefix."""

    def __init__(
        self, *, folder: Path | None = None, store: Store | None = None, prefix: str = "", where: str = ""
    ) -> None:
        if (folder is None) == (store is None):
            raise ValueError("a checkpoint reads from exactly one of a folder or a store")
        self.folder, self.store, self.prefix = folder, store, prefix.strip("/")
        # How error messages name the checkpoint: the folder, or the URL it was opened from.
        self.where = where or (str(folder) if folder is not None else f"store:{self.prefix or '/'}")

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def read_text(self, name: str) -> str:
        if self.folder is not None:
            path = self.folder / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint {self.where} has no {name}")
            return path.read_text()
        return self._get(name).decode()

    def tensors(self, name: str) -> dict[str, Tensor]:
        """All tensors of one safetensors file (memory-mapped from a folder)."""
        if self.folder is not None:
            path = self.folder / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint {self.where} has no {name}")
            return safetensors.torch.load_file(path)
        return safetensors.torch.load(self._get(name))

    def _get(self, name: str) -> bytes:
        if self.store is None:
            raise RuntimeError("a folder checkpoint has no store")
        try:
            return self.store.get(self._key(name))
        except NotFound as exc:
            raise CheckpointError(f"checkpoint {self.where} has no {name}") from exc


def open_checkpoint(location: str | Path) -> Checkpoint:
    """A local folder, or `s3://bucket/prefix` (credentials and endpoint from boto3's usual environment:
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for S3-compatible servers)."""
    text = str(location)
    if text.startswith("s3://"):
        bucket, _, prefix = text.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"S3 weights location {text!r} has no bucket")
        try:
            from monologue.storage import S3Store
        except ImportError as exc:
            raise RuntimeError(f"loading weights from {text} needs boto3 (pip install boto3): {exc}") from exc
        return Checkpoint(store=S3Store(bucket=bucket, prefix=prefix), where=text)
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise CheckpointError(f"weights folder {folder} does not exist")
    return Checkpoint(folder=folder)


def load_state(model: nn.Module, state: dict[str, Tensor], where: str) -> None:
    """Copy `state` into `model`, or raise CheckpointError naming every missing, unexpected or misshapen key."""
    expected = model.state_dict()
    problems = [
        f"missing key {key!r} (model shape {tuple(expected[key].shape)})" for key in expected if key not in state
    ]
    problems += [
        f"unexpected key {key!r} (file shape {tuple(state[key].shape)})" for key in state if key not in expected
    ]
    problems += [
        f"key {key!r} has shape {tuple(state[key].shape)} in the file, the model expects {tuple(expected[key].shape)}"
        for key in expected
        if key in state and state[key].shape != expected[key].shape
    ]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise CheckpointError(f"{where} does not match its config.json: {shown}")
    # A model built under accelerate's init_empty_weights has its parameters on the meta device: take the
    # file's tensors as they are (assign) instead of copying into storage that does not exist.
    empty = any(parameter.is_meta for parameter in model.parameters())
    if empty:  # assigned tensors keep their dtype: give them the model's (a bf16 file still runs in fp32)
        state = {key: value.to(expected[key].dtype) for key, value in state.items()}
    model.load_state_dict(state, strict=True, assign=empty)


class Weights:
    """Where a family's models come from: a checkpoint, or (checkpoint None) a seeded random draw."""

    def __init__(self, config: DiTConfig, checkpoint: Checkpoint | None = None, seed: int = 0) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.seed = seed

    @classmethod
    def open(cls, location: str | Path | Checkpoint) -> Weights:
        checkpoint = location if isinstance(location, Checkpoint) else open_checkpoint(location)
        text = checkpoint.read_text(CONFIG_FILE)
        try:
            config = DiTConfig.from_json(text)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{checkpoint.where}/{CONFIG_FILE} is not a valid dit config: {exc}") from exc
        return cls(config, checkpoint)

    def describe(self) -> str:
        if self.checkpoint is None:
            return f"random weights (preset {self.config.name}, seed {self.seed})"
        return self.checkpoint.where

    def build(self, name: str) -> nn.Module:
        """The named model with its weights, in eval mode, on the CPU, gradients off."""
        if name not in BUILDERS:
            raise ValueError(f"unknown dit model {name!r}; known: {', '.join(MODEL_NAMES)}")
        if self.checkpoint is None:
            model = BUILDERS[name](self.config)
            randomise(model, self.seed + MODEL_NAMES.index(name))
        else:
            # Parameters on the meta device (buffers stay real): a 1 B-parameter model is neither allocated
            # nor randomly initialised only to be overwritten by the checkpoint.
            with init_empty_weights(include_buffers=False):
                model = BUILDERS[name](self.config)
            file = f"{name}.safetensors"
            load_state(model, self.checkpoint.tensors(file), f"{self.checkpoint.where}/{file}")
        return model.eval().requires_grad_(False)


def save_checkpoint(
    folder: Path, config: DiTConfig, models: dict[str, nn.Module], dtype: torch.dtype | None = None
) -> None:
    """Write config.json and one safetensors file per model (cast to `dtype` if given)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(config.to_json() + "\n")
    for name, model in models.items():
        state = {
            key: (value.to(dtype) if dtype is not None and value.is_floating_point() else value).contiguous()
            for key, value in model.state_dict().items()
        }
        metadata = {"model": name, "preset": config.name, "parameters": str(parameter_count(model))}
        safetensors.torch.save_file(state, folder / f"{name}.safetensors", metadata=metadata)
