"""What the infinitetalk sequence-parallel test runs on every rank of its gloo world: the tiny DiT's forwards and
the tiny checkpoint's decodes, single-process and under SP.

A module of its own (not the test file) because the spawned ranks unpickle these classes by name; it needs
diffusers (the test module skips without it before importing this).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gpu_worker.distributed import DistributedPipeline, RankContext, RankGroup
from gpu_worker.distributed.sequence import SPGroup, gather_frames, sequence_parallel
from gpu_worker.models.infinitetalk import build_family
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.models.infinitetalk.roles import InfiniteTalkDecoder, WanLatents
from gpu_worker.models.infinitetalk.vae import DecodeStream, decode_share
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.module import ModelSet
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec
from monologue.contracts import Chunk, ChunkKind, Family
from tests.gpu_worker.distributed.worlds import attempt

RANKS = 4
# The tiny DiT with 4 heads (head dim 16), so degree 2 takes 1 and 2 head groups and degree 4 one.
DIT = replace(TINY.dit, num_heads=4)
HEAD_GROUPS = {2: (1, 2), 4: (1,)}

# (name, batch, latent frames, latent height, latent width): S = (h / 2)(w / 2) tokens a frame. The splits:
# cut_frames, 18 tokens of frames of 6: degree 2 cuts frame 1 at token 9, degree 4 (5, 5, 4, 4) cuts frames 0, 1, 2;
# halves, 8 tokens of frames of 4: degree 2 on the frame edge, degree 4 each frame in two;
# uneven, 25 tokens of frames of 5: degree 2 (13, 12), degree 4 (7, 6, 6, 6), the guidance batch of three passes
# (rank 0 at degree 2 holds two whole frames and part of a third);
# short, 2 tokens of one frame: at degree 4 two ranks hold none.
DIT_CASES = (
    ("cut_frames", 1, 3, 4, 6),
    ("halves", 1, 2, 4, 4),
    ("uneven", 3, 5, 2, 10),
    ("short", 1, 1, 2, 4),
)

# (name, chunk latents, decoder-context latents, video frames): the first chunk (its first latent one frame; at
# degree 4 a rank with no latent), a later chunk, a ragged last one, and one whose later ranks prime on only the
# last 38 (`StreamConfig.decoder_context`) latents before their run.
DECODE_CASES = (
    ("first", 3, 0, 9),
    ("later", 4, 5, 16),
    ("ragged", 3, 2, 10),
    ("long_context", 6, 38, 24),
)


def dit_inputs(batch: int, frames: int, height: int, width: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(7 + 10 * frames + 100 * batch + height)
    config = DIT
    audio_frames = 1 + config.vae_scale * (frames - 1)
    return (
        torch.randn(batch, config.in_dim, frames, height, width, generator=generator),
        torch.linspace(900.0, 300.0, batch),
        torch.randn(batch, config.text_len, config.text_dim, generator=generator),
        torch.randn(batch, 257, config.image_dim, generator=generator),
        torch.randn(
            batch, audio_frames, config.audio_window, config.audio_blocks, config.audio_channels, generator=generator
        ),
    )


def tiny_dit(config: Any = DIT) -> InfiniteTalkDiT:
    torch.manual_seed(5)  # the same weights on every rank
    return InfiniteTalkDiT(config).eval().requires_grad_(False)


def dit_forwards(
    model: InfiniteTalkDiT, cases: tuple[tuple[str, int, int, int, int], ...] = DIT_CASES
) -> dict[str, np.ndarray]:
    with torch.no_grad():
        return {name: model(*dit_inputs(*sizes)).numpy() for name, *sizes in cases}


def sp_group(context: RankContext, degree: int, head_groups: int = 1) -> SPGroup:
    """This rank's SP group of `degree` consecutive ranks (made once per degree, by every rank in order)."""
    groups: dict[int, list[dist.ProcessGroup]] = context.local.setdefault("sp_groups", {})
    if degree not in groups:
        groups[degree] = [
            dist.new_group(list(range(start, start + degree))) for start in range(0, context.world_size, degree)
        ]
    return SPGroup(groups[degree][context.rank // degree], degree, context.rank % degree, head_groups)


@dataclass(frozen=True)
class DiTForwards:
    """The tiny DiT single-process and under SP of `degree`, for every head-group count it takes."""

    degree: int

    def run(self, context: RankContext) -> dict[str, Any]:
        model = tiny_dit()
        seen: dict[str, Any] = {"single": dit_forwards(model)}
        for head_groups in HEAD_GROUPS[self.degree]:
            with sequence_parallel(sp_group(context, self.degree, head_groups)):
                seen[f"sp_g{head_groups}"] = dit_forwards(model)
        return seen


@dataclass(frozen=True)
class CheckpointDiT:
    """The tiny checkpoint's own DiT (2 heads) single-process and at degree 2 (one head a rank)."""

    weights: str

    def run(self, context: RankContext) -> dict[str, Any]:
        model = InfiniteTalkWeights(TINY, Locations.under(Path(self.weights))).build("dit").eval()
        cases = DIT_CASES[:1]
        seen: dict[str, Any] = {"single": dit_forwards(model, cases)}  # type: ignore[arg-type]
        with sequence_parallel(sp_group(context, 2)):
            seen["sp"] = dit_forwards(model, cases)  # type: ignore[arg-type]
        return seen


@dataclass(frozen=True)
class Decodes:
    """The tiny checkpoint's decoder role on every case, single-process and under SP of `degree` (uint8 frames): split
    across the ranks where the node keeps no decode states, whole on every rank where it keeps them (the default),
    and the float frames of `decode_share` gathered against one `DecodeStream`'s (uint8 rounding would hide a
    cache that is off in the last bits); the tail's motion latents the decoder adds, gathered from the ranks that
    hold the last frames (several, where a rank's run is shorter than the motion frames), against one process's."""

    weights: str
    degree: int

    def run(self, context: RankContext) -> dict[str, Any]:
        decoder = InfiniteTalkDecoder(InfiniteTalkWeights(TINY, Locations.under(Path(self.weights))))
        decoder.load()
        # A node keeping no decode states splits the decode across the ranks (the other decodes whole on each).
        unkept_config = replace(TINY, stream=replace(TINY.stream, decoder_states=0))
        unkept = InfiniteTalkDecoder(InfiniteTalkWeights(unkept_config, Locations.under(Path(self.weights))))
        unkept.load()
        vae = decoder.models["vae"]
        sp = sp_group(context, self.degree)
        seen: dict[str, Any] = {}
        for name, latents, context_latents, video_frames in DECODE_CASES:
            generator = torch.Generator().manual_seed(latents + 10 * context_latents)
            frames = torch.randn(TINY.vae.z_dim, latents, 4, 4, generator=generator)
            before = (
                torch.randn(TINY.vae.z_dim, context_latents, 4, 4, generator=generator) if context_latents else None
            )
            motion = 1 + 4 * ((min(TINY.stream.motion_frames, video_frames) - 1) // 4)
            ended = frames if before is None else torch.cat([before, frames], dim=1)
            context = ended[:, -TINY.stream.decoder_context :].numpy()  # what an N chunk's tail anchor holds
            plain_tail: dict[str, np.ndarray] = {"context": context}
            split_tail: dict[str, np.ndarray] = {"context": context}
            whole_tail: dict[str, np.ndarray] = {"context": context}
            with torch.no_grad():
                plain = decoder.decode({}, WanLatents(frames, before, video_frames, plain_tail, motion))
                starts = decoder.states.hits + decoder.states.misses
                with sequence_parallel(sp):
                    split = unkept.decode({}, WanLatents(frames, before, video_frames, split_tail, motion))
                    whole = decoder.decode({}, WanLatents(frames, before, video_frames, whole_tail, motion))
                starts = decoder.states.hits + decoder.states.misses - starts  # 1: a stream from a state, or primed
                stream = DecodeStream(vae)  # type: ignore[arg-type]
                if before is not None:
                    stream.prime(before[None])
                one_stream = stream.decode(frames[None])
                share, counts = decode_share(
                    vae,  # type: ignore[arg-type]
                    None if before is None else before[None],
                    frames[None],
                    TINY.vae.temporal_stride,
                    TINY.stream.decoder_context,
                    sp,
                )
                gathered = gather_frames(share, 2, counts, sp)
            seen[name] = {
                "plain": plain,
                "sp": split,
                "sp_whole": whole,
                "float_equal": torch.equal(gathered, one_stream),
                "motion_equal": np.array_equal(split_tail["motion"], plain_tail["motion"]),
                "whole_motion_equal": np.array_equal(whole_tail["motion"], plain_tail["motion"]),
                "stream_starts": {"whole": starts, "split": unkept.states.hits + unkept.states.misses},
            }
        return seen


# A short timeline on the grid: N0 (1 + 4 frames: 2 latents), N1 (4 frames, led by N0's motion frames), I0 between.
RENDER_CHUNKS = (Chunk(ChunkKind.N, 0, 0, 5), Chunk(ChunkKind.N, 1, 9, 4), Chunk(ChunkKind.I, 0, 5, 4))


def build_tiny(weights: str, family: Family) -> ModelSet:
    """The infinitetalk family over the tiny checkpoints (a DistributedPipeline's builder: pickled by reference)."""
    return build_family(InfiniteTalkWeights(TINY, Locations.under(Path(weights))))


class ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.extend(frames.copy())


def render(pipeline: Pipeline) -> dict[str, np.ndarray]:
    """The frames of RENDER_CHUNKS, in generation order, by chunk."""
    rng = np.random.default_rng(7)
    portrait = (rng.random((90, 80, 3)) * 255).astype(np.uint8)
    audio = ArrayAudio((0.3 * np.sin(2 * np.pi * 220 * np.arange(16_000) / 16_000)).astype(np.float32))
    session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
    pipeline.encode_speech(session)  # a render's: rank 0 encodes, every chunk forwards its rows to the other ranks
    out = {}
    for chunk in RENDER_CHUNKS:
        sink = ListSink()
        pipeline.run_chunk(session, ChunkRequest(chunk, seed=3, prompt="a calm studio"), sink)
        out[chunk.name] = np.stack(sink.frames)
    return out


def render_both(weights: str, group: RankGroup) -> dict[str, Any]:
    """The node's way (a DistributedPipeline: every rank under its SP group, replicas checked) and one process's,
    and how many collectives rank 0's SP group carried meanwhile."""
    if group.sp is None:
        raise RuntimeError("the world has no SP group")
    before = group.sp.group._get_sequence_number_for_group()  # type: ignore[attr-defined]
    node = render(
        DistributedPipeline(group, Family.INFINITETALK, builder=partial(build_tiny, weights), check_replicas=True)
    )
    collectives = group.sp.group._get_sequence_number_for_group() - before  # type: ignore[attr-defined]
    return {
        "node": node,
        "plain": render(Pipeline(build_tiny(weights, Family.INFINITETALK))),
        "collectives": collectives,
    }


def drive(weights: str, group: RankGroup) -> dict[str, Any]:
    """The 4-rank world's scenarios; its node SP degree is 2 (groups {0, 1} and {2, 3})."""
    steps: dict[str, Any] = {
        "dit2": DiTForwards(2),
        "dit4": DiTForwards(4),
        "checkpoint_dit2": CheckpointDiT(weights),
        "decode2": Decodes(weights, 2),
        "decode4": Decodes(weights, 4),
    }
    out = {name: attempt(partial(group.gather_from_all, step)) for name, step in steps.items()}
    return out | {"render": attempt(partial(render_both, weights, group))}
