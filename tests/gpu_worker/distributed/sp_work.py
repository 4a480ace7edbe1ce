"""What the sequence-parallel tests run on every rank: the dit decoder's cases, a dit family whose decoder
fails on purpose, and the drivers of the worlds they run in.

A module of its own (not the test file) because the spawned ranks unpickle these classes by name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from gpu_worker.distributed import DistributedPipeline, RankContext, RankGroup
from gpu_worker.distributed.sequence import SPGroup, current_sp, sequence_parallel
from gpu_worker.models.dit import build_family, default_weights
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.decoder import DiTDecoder
from gpu_worker.models.dit.roles import ChunkLatents
from gpu_worker.models.dit.runtime import DiTLatents
from gpu_worker.models.dit.vae import VAEDecoder
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.module import ModelSet, Reference
from gpu_worker.pipeline.pipeline import Session
from monologue.contracts import Chunk, ChunkKind, Family
from tests.gpu_worker.distributed.worlds import attempt

# (name, latents, decoder-context latents, video frames): N and I chunks, a ragged last chunk, and a chunk
# with fewer decode batches than ranks; two longer chunks whose later ranks prime on only the last
# `context_frames` latents before their range (from the context, and from a chunk without context).
DECODE_CASES = [
    ("N", 3, 0, 12),
    ("I", 2, 2, 8),
    ("ragged", 3, 1, 10),
    ("few", 1, 1, 2),
    ("long", 8, 4, 30),
    ("fresh", 8, 0, 32),
]
FRAMES_PER_BATCH = (1, 3, 16)  # one frame a batch, batches across latents, one batch for the whole chunk

# Generation order N0 N1 I0 N2 I1: a short first chunk (one latent) and a ragged last one (6 frames: 2 latents).
DIT_CHUNKS = [
    ChunkRequest(Chunk(ChunkKind.N, 0, 0, 4), seed=5),
    ChunkRequest(Chunk(ChunkKind.N, 1, 8, 8), seed=5),
    ChunkRequest(Chunk(ChunkKind.I, 0, 4, 4), seed=5),
    ChunkRequest(Chunk(ChunkKind.N, 2, 20, 6), seed=5),
    ChunkRequest(Chunk(ChunkKind.I, 1, 16, 4), seed=5),
]
DIT_OUTPUT = OutputSpec(fps=25)


def digest(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest()


def _decoder(frames_per_batch: int) -> DiTDecoder:
    config = replace(TINY, vae=replace(TINY.vae, frames_per_batch=frames_per_batch))
    decoder = DiTDecoder(Weights(config, seed=7))
    decoder.load()
    return decoder


def _case(latents: int, context: int, video_frames: int) -> tuple[Reference, DiTLatents]:
    generator = torch.Generator().manual_seed(latents * 10 + context)
    frames = torch.randn(TINY.vae.latent_channels, latents, 3, 4, generator=generator)  # (C, T, h, w)
    context_latents = torch.randn(TINY.vae.latent_channels, context, 3, 4, generator=generator) if context else None
    reference = {"frame_size": np.array([30, 20]), "canvas_size": np.array([32, 24])}  # cropped from 32 x 24
    return reference, ChunkLatents(frames, context_latents, video_frames=video_frames)


@dataclass(frozen=True)
class DecodeCases:
    """Every case decoded without SP and under SP; each spatial batch the rank ran is counted, and the latents
    of each call to the temporal stage (`prime`'s, then `temporal_inputs`'). The SP group is
    the node's (`RankGroup.sp`), or with `whole_node` one over every rank of the data plane. `fail_rank` raises
    on that rank before the frames are gathered (its SP peers wait in the gather)."""

    fail_rank: int | None = None
    whole_node: bool = False

    def run(self, context: RankContext) -> dict[str, Any]:
        out: dict[str, Any] = {}
        sp = context.group.sp
        if self.whole_node:
            sp = SPGroup(context.group.data, context.world_size, context.rank)
        for step in FRAMES_PER_BATCH:
            decoder = _decoder(step)
            spatial_frames: list[int] = []
            temporal_latents: list[int] = []
            model = decoder.model("vae_decoder", VAEDecoder)
            model.conv_out.register_forward_hook(lambda _m, args, _out, seen=spatial_frames: seen.append(len(args[0])))
            feature_frames: list[int] = []
            _record_latents(model, temporal_latents, feature_frames)
            for name, *sizes in DECODE_CASES:
                reference, latents = _case(*sizes)
                plain = decoder.decode(reference, latents)
                spatial_frames.clear()
                temporal_latents.clear()
                feature_frames.clear()
                if context.rank == self.fail_rank:
                    raise RuntimeError(f"rank {context.rank} failed before the gather on purpose")
                with sequence_parallel(sp):
                    split = decoder.decode(reference, latents)
                out[f"{name}/{step}"] = {
                    "plain": plain,
                    "sp": split,
                    "spatial_frames": list(spatial_frames),
                    "temporal_latents": list(temporal_latents),
                    "feature_frames": list(feature_frames),
                }
        return out


def _record_latents(model: VAEDecoder, seen: list[int], made: list[int]) -> None:
    """Record the latent count of every `prime` and `temporal_inputs` call, in order, and the frames of every
    `frame_features` call (instance attributes shadow the methods: the decoder role calls them through the
    instance)."""
    prime, temporal_inputs, frame_features = model.prime, model.temporal_inputs, model.frame_features

    def recorded_features(inputs: torch.Tensor, frames: range) -> Any:
        made.append(len(frames))
        return frame_features(inputs, frames)

    def recorded_prime(context: torch.Tensor) -> Any:
        seen.append(context.shape[2])
        return prime(context)

    def recorded_inputs(latents: torch.Tensor, state: Any) -> Any:
        seen.append(latents.shape[2])
        return temporal_inputs(latents, state)

    model.frame_features = recorded_features  # type: ignore[method-assign]
    model.prime = recorded_prime  # type: ignore[method-assign]
    model.temporal_inputs = recorded_inputs  # type: ignore[method-assign]


# A dit family whose decoder fails once on a chosen rank, after the chunk's last collective.
_armed: set[int] = set()


class FailingDecoder(DiTDecoder):
    def decode(self, reference: Reference, upscaled: DiTLatents) -> np.ndarray:
        frames = super().decode(reference, upscaled)
        sp = current_sp()
        if sp is not None and sp.rank in _armed:
            _armed.discard(sp.rank)
            raise RuntimeError(f"rank {sp.rank}'s decoder failed after the gather on purpose")
        return frames


def build_failing_dit(family: Family) -> ModelSet:
    family = build_family()
    family.decoder = FailingDecoder(default_weights())
    return family


@dataclass(frozen=True)
class ArmDecoderFailure:
    rank: int

    def run(self, context: RankContext) -> None:
        if context.rank == self.rank:
            _armed.add(self.rank)


class ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.extend(frames.copy())


def render_dit(pipeline: Pipeline, group: RankGroup | None = None) -> dict[str, Any]:
    """Frame hashes per chunk of DIT_CHUNKS. With `group`, a second session then runs its first chunk with rank
    1's decoder failing once (after every collective): that attempt's outcome is recorded, and the chunk is run
    again (rank 1 dropped its mirrors: the session comes back to it)."""
    portrait = np.random.default_rng(4).integers(0, 256, size=(24, 32, 3), dtype=np.uint8)
    audio = ArrayAudio(np.random.default_rng(2).normal(scale=0.1, size=16_000 * 2).astype(np.float32))
    session = pipeline.start_session(portrait, DIT_OUTPUT, audio)
    out: dict[str, Any] = {"hashes": {}, "frames": {}}
    for chunk in DIT_CHUNKS:
        out["hashes"][chunk.name], out["frames"][chunk.name] = _run(pipeline, session, chunk)
    if group is not None:
        session = pipeline.start_session(portrait, DIT_OUTPUT, audio)
        group.run_on_all(ArmDecoderFailure(1))
        out["failed"] = attempt(lambda: pipeline.run_chunk(session, DIT_CHUNKS[0], ListSink()))
        out["again"], _ = _run(pipeline, session, DIT_CHUNKS[0])
    return out


def _run(pipeline: Pipeline, session: Session, chunk: ChunkRequest) -> tuple[list[str], np.ndarray]:
    sink = ListSink()
    result = pipeline.run_chunk(session, chunk, sink)
    if len(sink.frames) != chunk.n_frames:
        raise AssertionError(f"{chunk.name}: {len(sink.frames)} frames reached rank 0's sink")
    return result.frame_hashes, np.stack(sink.frames)


def sp_scenarios(group: RankGroup) -> dict[str, Any]:
    """The 2-rank world's SP scenarios (scenarios.drive runs them before its group-breaking last one)."""
    out: dict[str, Any] = {"sp_degree": group.sp.degree if group.sp else 1}
    out["sp_decode"] = attempt(lambda: group.gather_from_all(DecodeCases()))
    out["dit_sp"] = attempt(
        lambda: render_dit(
            DistributedPipeline(group, Family.DIT, builder=build_failing_dit, check_replicas=True), group
        )
    )
    out["dit_plain"] = attempt(lambda: render_dit(Pipeline(build_family())))
    return out


def drive_four(group: RankGroup) -> dict[str, Any]:
    """The 4-rank world at SP degree 2 (groups {0, 1} and {2, 3}): the decoder's cases over the node's groups
    and over all four ranks, then rank 2 fails before the gather (this breaks the group: last)."""
    out: dict[str, Any] = {"sp_degree": group.sp.degree if group.sp else 1}
    out["sp_decode"] = attempt(lambda: group.gather_from_all(DecodeCases()))
    out["sp_decode_whole"] = attempt(lambda: group.gather_from_all(DecodeCases(whole_node=True)))
    out["mid_gather_failure"] = attempt(lambda: group.run_on_all(DecodeCases(fail_rank=2)))
    return out
