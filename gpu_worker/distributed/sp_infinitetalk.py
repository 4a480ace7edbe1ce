"""A paper model of the infinitetalk family's node time per N chunk under Ulysses sequence parallelism over P GPUs:
a MODEL, not a measurement. Run `monologue bench sp --family infinitetalk` for the table.

Why: issue 29 asks whether eight H200s make 25 frames/s of the 14B model at 480p with TTFF ≤ 3 s and SP ≥ 6.5×;
one H200 is all that has run it. The model multiplies counted work by rates measured on that H200.

Counted (FlopCounterMode on the meta device, through flops.py's own builders): a DiT forward at 1 and 2 layers,
extrapolated to 40 (every layer is the same, so this is exact: equal to flops.py's full count), of which the
self-attention core is 4 B L² D a layer (the rest splits by tokens); the Wan VAE per unit (a decode stream's first
latent, each later one; an encode's first frame, each 4 after), from which a chunk's encodes and decodes follow
exactly (linear in the calls: test-checked by a direct count and flops.py's table). Under SP the node (dit.py, vae.py,
roles.py) splits the DiT's tokens and the chunk's decode by latents (every rank primes on the up to 38 latents
before its run); the motion frames' encode (from the decoder's own frames) runs whole on every rank, and so does the
I2V condition's encode, once per clip length (N0's counts; a steady N chunk reuses its length's).

MEASURED on one H200 (docs/gpu_runs/2026-12-04/, `MEASURED` below): one 480p DiT pass (21 latents, 32,760 tokens,
1825 TFLOP) 3.50 s (521 TFLOP/s); a quality step (3 passes batched) 10.64 s (514 TFLOP/s): the DiT's rates, by
passes batched. The Wan VAE (docs/gpu_runs/2026-12-04-b/run1/wan_vae.json, `vae_timing`): 18 latents decoded from a
kept state, 243.9 TFLOP, in 2.475 s in fp32 as the node runs it (98.5 TFLOP/s; its priming and encodes ran at the
same rate, 95-101), 1.460 s in bf16 channels-last (167); the model charges every VAE call at the fp32 rate. The SP
layer on a one-rank group (dim 2048, 16 heads, 11,960 tokens): plain 2.95 ms, with 1/2/4 head groups 3.52/3.69/4.23 ms.

MODELLED from those: the DiT on a rank is its token share of the per-token work at the measured rate times the
dit model's GEMM curve for its rows (`Rates.gemm_efficiency`: 1 at P = 1), plus the attention core / P. Launch
overhead (`LaunchOverhead`): the extra kernels of the SP path, fitted to the one-rank figures as a fixed cost per
layer plus a cost per head group (a least-squares line through the three), charged per layer per forward (a
batched quality step is one forward) at P > 1, taken as size-independent (launches and small kernels; the one-rank
exchange's local copy is in it too, so with the exchanges costed separately it errs high). Exposed all-to-all: the
dit model's (`exposed_all_to_all`, NVLink at 337.5 GB/s and 25 µs a collective, ASSUMED), the q, k, v projected for
every head before any exchange (the RMS norms need all heads), each group's output projection as it returns; head
groups as the node picks them (`head_groups_for`: 40 heads, at most 2 groups: 2, 2, 1 at P = 2, 4, 8). Also the
DiT output's gather per forward and the frames' gather per chunk. Context (umT5, CLIP ViT-H, wav2vec2 on the first
chunk's audio; closed-form FLOPs at the DiT's rate) counts for TTFF only. Not modelled: I chunks, the host side
(publishing), NCCL's SMs during overlap, the VAE's parallel speed beyond its split of the chunk's decode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache

import torch

from gpu_worker.distributed.config import GroupConfig
from gpu_worker.distributed.sequence import head_groups_for, split_frames
from gpu_worker.distributed.sp_model import Rates, exchange_bytes, exposed_all_to_all, largest_part
from gpu_worker.models.infinitetalk.checkpoint import _vae
from gpu_worker.models.infinitetalk.config import WAN_14B, InfiniteTalkConfig, SamplingConfig
from gpu_worker.models.infinitetalk.flops import SIZES, _count, step_flops
from gpu_worker.models.infinitetalk.vae import DecodeStream
from monologue.contracts import SamplingPreset

GOAL_FPS, GOAL_SPEEDUP, GOAL_TTFF_S, GOAL_RANKS = 25.0, 6.5, 3.0, 8


@dataclass(frozen=True)
class Measured:
    """The H200 runs' figures (docs/gpu_runs/2026-12-04/infinitetalk_rerun.json, summary.json; 2026-12-04-b)."""

    pass_tflop: float = 1825.065  # one DiT pass over the 480p clip (FlopCounterMode over the real forward)
    step_s: tuple[tuple[int, float], ...] = ((1, 3.5034), (3, 10.644))  # warm step seconds by passes batched
    plain_layer_ms: float = 2.95  # sp_check: the plain layer (dim 2048, 16 heads, 11,960 tokens)
    sp_layer_ms: tuple[tuple[int, float], ...] = ((1, 3.52), (2, 3.69), (4, 4.23))  # the SP path by head groups
    vae_decode_tflop: float = 243.9  # the Wan VAE: 18 latents at 480p decoded from a kept state (second session)
    vae_decode_s: float = 2.4751  # in fp32 (TF32 convolutions), the node's precision

    def dit_tflops(self, passes: int) -> float:
        """The DiT's measured rate with `passes` passes batched."""
        steps = dict(self.step_s)
        if passes not in steps:
            raise ValueError(f"no DiT step was measured with {passes} passes batched; measured: {sorted(steps)}")
        return passes * self.pass_tflop / steps[passes]

    @property
    def vae_tflops(self) -> float:
        return self.vae_decode_tflop / self.vae_decode_s


MEASURED = Measured()


@dataclass(frozen=True)
class LaunchOverhead:
    """The SP path's extra cost per layer and forward: `base_ms` + `per_group_ms` × head groups (modelled)."""

    base_ms: float
    per_group_ms: float

    @classmethod
    def fitted(cls, measured: Measured = MEASURED) -> LaunchOverhead:
        """A least-squares line through the one-rank SP layer's extra time over the plain layer, by head groups."""
        points = [(groups, ms - measured.plain_layer_ms) for groups, ms in measured.sp_layer_ms]
        mean_g = sum(g for g, _ in points) / len(points)
        mean_ms = sum(ms for _, ms in points) / len(points)
        slope = sum((g - mean_g) * (ms - mean_ms) for g, ms in points) / sum((g - mean_g) ** 2 for g, _ in points)
        return cls(mean_ms - slope * mean_g, slope)

    def seconds(self, groups: int) -> float:
        return (self.base_ms + self.per_group_ms * groups) / 1000


NO_LAUNCH = LaunchOverhead(0.0, 0.0)


@cache
def dit_pass_flops(resolution: str, latents: int, passes: int) -> float:
    """FLOPs of one DiT forward of `passes` batched over a clip of `latents` latent frames (all 40 layers)."""
    width, height = SIZES[resolution]
    sampling = WAN_14B.fast if passes == 1 else WAN_14B.sampling
    if sampling.passes != passes:
        raise ValueError(f"the presets batch 1 or {WAN_14B.sampling.passes} passes, not {passes}")
    one, two = (_with_layers(layers) for layers in (1, 2))
    first = step_flops(one, width, height, latents, sampling)
    per_layer = step_flops(two, width, height, latents, sampling) - first
    return first + (WAN_14B.dit.num_layers - 1) * per_layer


def _with_layers(layers: int) -> InfiniteTalkConfig:
    return dataclasses.replace(WAN_14B, dit=dataclasses.replace(WAN_14B.dit, num_layers=layers))


@dataclass(frozen=True)
class VAEUnits:
    """The Wan VAE's FLOPs per call, counted: a decode stream's first latent (1 frame) and each later one (4 frames);
    an encode's first frame and each 4 frames after it."""

    decode_first: float
    decode_next: float
    encode_first: float
    encode_next: float

    def decode(self, calls: int) -> float:
        """A fresh stream fed `calls` latents (primed or kept: the same work)."""
        return self.decode_first + (calls - 1) * self.decode_next if calls else 0.0

    def encode(self, frames: int) -> float:
        return self.encode_first + (frames - 1) // 4 * self.encode_next


@cache
def vae_units(resolution: str) -> VAEUnits:
    width, height = SIZES[resolution]
    with torch.device("meta"):
        vae = _vae(WAN_14B)
        z = WAN_14B.vae.z_dim
        latent_size = (height // WAN_14B.vae.spatial_stride, width // WAN_14B.vae.spatial_stride)
        decode = [_count(lambda n=n: DecodeStream(vae).decode(torch.zeros(1, z, n, *latent_size))) for n in (1, 2)]
        encode = [_count(lambda n=n: vae.encode(torch.zeros(1, 3, n, height, width))) for n in (1, 5)]
    return VAEUnits(decode[0], decode[1] - decode[0], encode[0], encode[1] - encode[0])


@dataclass(frozen=True)
class Scenario:
    """What the model is asked: a sampling preset at a canvas, N chunk and first chunk sizes, the rates."""

    preset: SamplingPreset = SamplingPreset.FAST
    resolution: str = "480p"
    chunk_frames: int = 72  # InfiniteTalk's clip: 9 motion + 72 new frames
    first_frames: int = 17  # N0: the live sessions' first chunk on the infinitetalk grid (1 + 4 k)
    head_groups: int = GroupConfig.sp_head_groups
    vae_tflops: float = field(default_factory=lambda: MEASURED.vae_tflops)  # the Wan VAE's, fp32
    rates: Rates = field(default_factory=Rates)
    launch: LaunchOverhead = field(default_factory=LaunchOverhead.fitted)
    config: InfiniteTalkConfig = WAN_14B

    def __post_init__(self) -> None:
        stride = self.config.vae.temporal_stride
        motion = self.config.stream.motion_frames
        if self.chunk_frames < stride or self.chunk_frames % stride or (self.first_frames - 1) % stride:
            raise ValueError(
                f"chunk_frames {self.chunk_frames} must be a positive multiple of {stride} and first_frames "
                f"{self.first_frames} 1 + a multiple of {stride} (the Wan VAE's latent grid)"
            )
        if self.first_frames < motion:
            raise ValueError(f"first_frames {self.first_frames}: the model needs at least the {motion} motion frames")

    @property
    def sampling(self) -> SamplingConfig:
        return self.config.sampler(self.preset)

    def latents(self, frames: int, known: int) -> tuple[int, int]:
        """(motion, own) latents of a chunk of `frames` new frames: N0 (`known` 0: no decoder context) has no
        motion frames and 1 + 4 k frames; a later N chunk opens with the 9 motion frames' 3 latents."""
        stride = self.config.vae.temporal_stride
        if known == 0:
            return 0, (frames - 1) // stride + 1
        return 1 + (self.config.stream.motion_frames - 1) // stride, frames // stride

    def tokens(self, latents: int) -> int:
        width, height = SIZES[self.resolution]
        _, patch_h, patch_w = self.config.dit.patch_size
        spatial = self.config.vae.spatial_stride
        return latents * (height // spatial // patch_h) * (width // spatial // patch_w)


@dataclass(frozen=True)
class ChunkTime:
    """One chunk on the busiest rank, seconds."""

    dit_s: float  # compute
    comm_s: float  # exposed all-to-all and gathers
    launch_s: float  # modelled launch overhead of the SP path
    vae_s: float  # condition encode (N0), motion frames' encode, decode: at the stand-in rate

    @property
    def dit_total_s(self) -> float:
        return self.dit_s + self.comm_s + self.launch_s

    @property
    def total_s(self) -> float:
        return self.dit_total_s + self.vae_s


def dit_step(scenario: Scenario, latents: int, degree: int) -> tuple[float, float, float]:
    """(compute, exposed communication, launch overhead) of one denoising step on the busiest rank."""
    dit, rates, passes = scenario.config.dit, scenario.rates, scenario.sampling.passes
    tokens, rate = scenario.tokens(latents), 1e12 * MEASURED.dit_tflops(passes)
    flops = dit_pass_flops(scenario.resolution, latents, passes)
    core = 4 * passes * tokens**2 * dit.dim * dit.num_layers  # self-attention: QK^T and AV
    local_tokens = largest_part(tokens, degree)
    efficiency = rates.gemm_efficiency(passes * local_tokens)
    local_s = (flops - core) * local_tokens / tokens / rate / efficiency
    attention_s = core / degree / rate
    if degree == 1:
        return local_s + attention_s, 0.0, 0.0
    if dit.num_heads % degree:
        raise ValueError(f"the DiT's {dit.num_heads} heads do not split over an SP degree of {degree}")
    groups = head_groups_for(dit.num_heads, degree, scenario.head_groups)
    bandwidth, latency = 1e9 * rates.nvlink_gbps, 1e-6 * rates.collective_latency_us
    one = exchange_bytes(tokens, local_tokens, dit.dim, degree, passes)
    out_projection_s = 2 * passes * local_tokens * dit.dim**2 / rate / efficiency
    layer = exposed_all_to_all(
        3 * one / bandwidth, one / bandwidth, attention_s / dit.num_layers, groups, latency, 0.0, out_projection_s
    )
    patch = dit.patch_size[0] * dit.patch_size[1] * dit.patch_size[2]
    head_out = 4 * passes * tokens * patch * dit.out_dim  # (B, L, p_t p_h p_w out) fp32, gathered after each forward
    gather = head_out * (degree - 1) / degree / bandwidth + latency
    return local_s + attention_s, dit.num_layers * layer + gather, dit.num_layers * scenario.launch.seconds(groups)


def vae_flops(scenario: Scenario, frames: int, known: int, degree: int) -> dict[str, float]:
    """A chunk's VAE FLOPs on the busiest rank by part; `known`: decoder context latents before it (0: N0, the only
    chunk that encodes its I2V condition here: a steady N chunk's length was encoded before)."""
    units, stream, stride = vae_units(scenario.resolution), scenario.config.stream, scenario.config.vae.temporal_stride
    motion_latents, chunk_latents = scenario.latents(frames, known)
    clip_latents = motion_latents + chunk_latents
    if stream.decoder_states:  # every rank decodes the chunk whole, from the previous N chunk's kept state (roles.py)
        decode = units.decode(chunk_latents) if known == 0 else chunk_latents * units.decode_next
    else:  # the latents split, each rank primed on the up to `decoder_context` latents before its run
        calls = [
            min(stream.decoder_context, known + start) + end - start
            for start, end in split_frames(chunk_latents, degree)
            if end > start
        ]
        decode = max(units.decode(count) for count in calls)
    return {
        "condition": 0.0 if known else units.encode(1 + stride * (clip_latents - 1)),
        "motion": units.encode(stream.motion_frames),
        "decode": decode,
    }


def chunk_time(scenario: Scenario, frames: int, known: int, degree: int) -> ChunkTime:
    """A chunk of `frames` new frames (N0 when `known` is 0) at SP degree `degree`."""
    compute, comm, launch = dit_step(scenario, sum(scenario.latents(frames, known)), degree)
    steps = scenario.sampling.steps
    width, height = SIZES[scenario.resolution]
    frames_bytes = frames * width * height * 3  # uint8 frames, all-gathered once
    gather = 0.0
    if degree > 1:
        gather = frames_bytes * (degree - 1) / degree / (1e9 * scenario.rates.nvlink_gbps)
        gather += 1e-6 * scenario.rates.collective_latency_us
    vae_s = sum(vae_flops(scenario, frames, known, degree).values()) / (1e12 * scenario.vae_tflops)
    return ChunkTime(steps * compute, steps * comm + gather, steps * launch, vae_s)


def context_flops(scenario: Scenario, audio_frames: int) -> float:
    """Closed-form FLOPs of the encoders before the first chunk: umT5 over the 512 text tokens, CLIP ViT-H over one
    image (31 of its 32 layers, as the original), wav2vec2-base (12 x 768, 50 tokens a second) over the chunk's
    audio and its 1-s left context. A few TFLOP: small beside a chunk, kept for TTFF's sake."""

    def encoder(tokens: int, dim: int, layers: int, mlp: int, mlp_matrices: int) -> float:
        per_token = 2 * (4 * dim * dim + mlp_matrices * dim * mlp)
        return layers * (tokens * per_token + 4 * tokens**2 * dim)

    t5, clip, stream = scenario.config.t5, scenario.config.clip, scenario.config.stream
    audio_tokens = 2 * (audio_frames + stream.audio_context_frames)  # 50 Hz at 25 frames/s
    return (
        encoder(scenario.config.dit.text_len, t5.dim, t5.num_layers, t5.dim_ffn, 3)  # gated FFN
        + encoder(257, clip.dim, clip.num_layers - 1, clip.mlp_ratio * clip.dim, 2)
        + encoder(audio_tokens, 768, 12, 3072, 2)
    )


@dataclass(frozen=True)
class Row:
    degree: int
    chunk: ChunkTime
    fps: float
    speedup: float
    dit_fps: float
    dit_speedup: float
    ttff_s: float


def model_rows(scenario: Scenario, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> list[Row]:
    """Per SP degree: a steady N chunk's time and frames/s, the speed-up over one GPU (whole chunk and DiT alone),
    and TTFF (context + N0)."""
    context = scenario.config.stream.decoder_context
    one = chunk_time(scenario, scenario.chunk_frames, context, 1)
    context_s = context_flops(scenario, scenario.first_frames) / (1e12 * MEASURED.dit_tflops(1))
    rows = []
    for degree in degrees:
        chunk = chunk_time(scenario, scenario.chunk_frames, context, degree)
        first = chunk_time(scenario, scenario.first_frames, 0, degree)
        rows.append(
            Row(
                degree,
                chunk,
                fps=scenario.chunk_frames / chunk.total_s,
                speedup=one.total_s / chunk.total_s,
                dit_fps=scenario.chunk_frames / chunk.dit_total_s,
                dit_speedup=one.dit_total_s / chunk.dit_total_s,
                ttff_s=context_s + first.total_s,
            )
        )
    return rows
