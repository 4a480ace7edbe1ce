"""The dit family's warm buckets for its compiled steps (gpu_worker/compiled.py): the step inputs of a default
session's steady-state chunks at a named resolution, built as zeros of the shapes the roles hand the DiTs, so a
load can compile them before any session (as `SuperResolutionDiT.warm_up` compiles the SR attention's buckets).

A default session (`RenderOptions()`'s chunk sizes, no prompt) has three chunk shapes that repeat: its first N
chunk (no boundary, no decoder context), every later N chunk (the previous tail's boundary and context) and every
I chunk (both anchors' boundaries, the left tail's context). A session's ragged last chunk, a custom chunk size or
a prompt makes other shapes: their steps run eagerly (compiled.py says why none compiles in a chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpu_worker.models.dit.a2v import A2VConditioning
from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.models.dit.reference import named_canvas
from monologue.contracts import Family, RenderOptions
from monologue.plan import chunk_sizes


@dataclass(frozen=True)
class ChunkShape:
    """A chunk as its steps see it, in latents: its own, the clean boundary ones, the decoder context ones."""

    latents: int
    boundary: int
    context: int


def steady_chunks(config: DiTConfig) -> tuple[ChunkShape, ...]:
    """The first N, a later N and an I chunk of a default session (roles.py's anchors: a tail keeps
    max(boundary, context, 1) latents, a head `boundary_frames`)."""
    sizes = chunk_sizes(RenderOptions(family=Family.DIT))
    stride, boundary = config.vae.temporal_stride, config.a2v.boundary_frames
    first, later = -(-sizes["first_frames"] // stride), sizes["n_frames"] // stride
    tail = min(max(boundary, config.vae.context_frames, 1), later)
    shapes = [ChunkShape(first, 0, 0), ChunkShape(later, min(boundary, tail), min(config.vae.context_frames, tail))]
    if sizes["i_frames"]:
        shapes.append(ChunkShape(sizes["i_frames"] // stride, 2 * min(boundary, tail, later), shapes[1].context))
    return tuple(dict.fromkeys(shapes))


def low_resolution(config: DiTConfig, resolution: str) -> tuple[int, int]:
    """(h, w) of the low-resolution latents the A2V DiT samples at a named resolution."""
    width, height = named_canvas(config, resolution)
    scale = config.vae.stride * config.sr.scale
    return height // scale, width // scale


def a2v_inputs(config: DiTConfig, resolution: str, chunk: ChunkShape, device: str) -> tuple[Tensor, A2VConditioning]:
    """(noise (1, C, T, h, w), conditioning) of one chunk's steps, as `DiTAudioToVideo._sample` builds them."""
    height, width = low_resolution(config, resolution)
    channels, stride = config.latent_channels, config.vae.temporal_stride
    before, after = config.audio.margin_frames
    audio_frames = before + stride * chunk.latents + after

    def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.zeros(shape, device=device, dtype=dtype)

    cond = A2VConditioning(
        reference=zeros(1, channels, height, width),
        boundary=zeros(1, channels, chunk.boundary, height, width),
        boundary_times=zeros(chunk.boundary),
        audio=zeros(1, audio_frames, config.audio.tokens_per_frame, config.audio.dim),
        audio_times=zeros(audio_frames),
        text=zeros(1, 0, config.text.dim),
        text_mask=zeros(1, 0, dtype=torch.bool),
        keep_audio=torch.ones(1, dtype=torch.bool, device=device),
    )
    return zeros(1, channels, chunk.latents, height, width), cond


def sr_inputs(config: DiTConfig, resolution: str, chunk: ChunkShape, device: str) -> tuple[Tensor, Tensor]:
    """(low-resolution latents (1, C, K + T, h, w), reference latents (1, C, H, W)) of one chunk's SR pass, as
    `DiTSuperResolution.upscale` hands them over (the decoder context first)."""
    height, width = low_resolution(config, resolution)
    channels, scale = config.latent_channels, config.sr.scale
    low = torch.zeros(1, channels, chunk.context + chunk.latents, height, width, device=device)
    return low, torch.zeros(1, channels, height * scale, width * scale, device=device)
