"""A paper model of one node's time per chunk under Ulysses sequence parallelism (SP) over P GPUs: a MODEL,
not a measurement. Run `monologue bench sp` for the table.

Why a model: the figures issue 15 asks for (speed-up at 8 GPUs, fps of a seed-scale model) need eight H200s
we do not always have. The model multiplies counted work by measured one-GPU rates, so it is as good as its
two inputs and its stated assumptions, and it says where the time goes.

Work, counted (not estimated) with FlopCounterMode on the meta device by reusing `gpu_worker.models.dit.flops`:
- A2V and SR DiTs (SP'd): the self-attention core (the attention ops inside `Attention` modules) is split by
  heads, every rank attends over the whole sequence for heads / P, so it divides by P exactly. Everything
  else (projections, MLPs, cross-attention) runs on a rank's own frames: it scales with the busiest rank's
  frames, `max(split_frames(frames, P))` / frames (frames are never cut, so 13 frames over 8 ranks is 2/13,
  not 1/8).
- VAE decode: the per-frame spatial stage is split by output frames like the DiTs; the causal temporal stage
  runs on each rank's own latents after priming on `context_frames` latents (counted as if every rank primed,
  and the busiest rank's work as (its latents + context_frames) / (latents + context_frames) of the chunk's
  temporal work, priming included). The context (audio encoder) stage is replicated.

Time of one stage on the busiest rank:
    compute = overhead x (local FLOPs x share / local rate + attention FLOPs / P / attention rate)
where the rates are GPU_NOTES.md's: linear 751 TFLOP/s (bf16 matmul), A2V attention 618 (dense SDPA), SR
attention 426 useful TFLOP/s (frame-window flex), and `overhead` = 1.06, the measured DiT block (32.2 ms for
20.1 TFLOP at d=3072, 32,256 tokens) over the same FLOPs at those op rates (norms, RoPE, modulation). VAE
convolutions run at an ASSUMED half of the matmul rate (not measured). Small matrices lose rate: the linear
rate is scaled by m / (m + 256) for a rank's m rows (ASSUMED, normalised to 1 at the measured 32,256 rows).

All-to-all bytes (Ulysses). Per self-attention call the busiest rank holds L_r of the sequence's L tokens
(B sequences of width D, bf16 = 2 bytes). seq -> heads: it keeps its own heads' part, sends the other P - 1
head groups of its tokens, L_r x D x (P - 1) / P elements, and receives its heads of everyone else's tokens,
(L - L_r) x D / P elements. The return (heads -> seq) is the mirror. With q, k, v in and the output back
there are four such exchanges per layer, each moving per rank (both directions the same when L_r = L / P):

    bytes per exchange = 2 x B x D x max(L_r (P - 1) / P, (L - L_r) / P)     (= 2 B D L (P - 1) / P^2 even)
    bytes per layer    = 4 x bytes per exchange;  per A2V chunk: x layers x sampling steps

over NVLink at an ASSUMED 75 % of the per-GPU unidirectional 450 GB/s (900 GB/s aggregate), 337.5 GB/s, plus
an ASSUMED 25 us per collective (q, k, v go as one collective, the output as another).

Head-group pipelining (G groups of heads): group g + 1's all-to-all runs while group g attends, so only the
first group's input exchange and the last group's return are exposed, plus any group whose exchange (c) is
longer than its attention (a):  exposed per layer = c_in / G + c_out / G + 2 latency + (G - 1) x max(0, c - a)
with c = (c_in + c_out) / G + 2 latency, a = attention / G. With no latency a larger G never exposes more;
with latency each group adds collectives, so past some G it does (the table picks the G you give).

Also modelled: each SP'd stage's exit all-gather of its output (bf16, (P - 1) / P of it received per rank; the
decoded frames are the largest, the "gather of frames"); optional FSDP2 weights (`fsdp=True`): each block's
bf16 weights all-gathered per block call, overlapped with the previous block's compute, exposed only where
the gather is longer. Not modelled: kernel launch gaps (assume CUDA graphs or compile), NCCL's use of SMs
during overlap, the host side (encode, publish). Importable with torch alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.distributed.sequence import split_frames
from gpu_worker.models.dit import flops
from gpu_worker.models.dit.a2v import AudioToVideoDiT
from gpu_worker.models.dit.config import A2VConfig, DiTConfig, SRConfig, preset
from gpu_worker.models.dit.layers import Attention
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.models.dit.vae import VAEDecoder, fold
from monologue.contracts import ChunkKind

BF16_BYTES = 2
# The measured DiT block of GPU_NOTES.md: d=3072, MLP 4x, 32,256 tokens, 32.2 ms.
_BLOCK_DIM, _BLOCK_TOKENS, _BLOCK_MS = 3072, 32_256, 32.2
_SELF_ATTENTION = re.compile(r"\.blocks\.\d+\.attention$")
_LINEAR_OPS = {"aten.mm", "aten.addmm", "aten.convolution"}

# The seed's scale, 18B parameters over two transformers (an ASSUMPTION: the seed's layout is not published): a
# Wan-14B-shaped A2V DiT (d=5120, 40 layers, 40 heads of 128) and a ~4.1B SR DiT (d=3072, 36 layers, 24 heads of
# 128), with the h200 preset's VAE, audio encoder and sequence shapes. The weights every token passes through
# (what the FLOPs follow) are ~14.8B + 4.1B; our A2V block also has a per-block adaLN modulation (6.3B in all,
# applied to the time embedding once per sequence: parameters, not FLOPs; Wan shares one) and cross-attention
# keys/values applied to the few audio tokens.
SEED_18B = replace(
    preset("h200"),
    name="seed18b",
    a2v=replace(A2VConfig(), dim=5120, layers=40, heads=40),
    sr=replace(SRConfig(), dim=3072, layers=36, heads=24),
)


@dataclass(frozen=True)
class Rates:
    """Per-op rates (TFLOP/s, GB/s): measured on one H200 (GPU_NOTES.md) unless named an assumption."""

    matmul_tflops: float = 751.0
    dense_attention_tflops: float = 618.0
    window_attention_tflops: float = 426.0
    conv_tflops: float = 375.0  # ASSUMPTION: half the matmul rate (VAE convolutions were not measured)
    nvlink_gbps: float = 0.75 * 450.0  # ASSUMPTION: 75 % of the per-GPU unidirectional NVLink bandwidth
    collective_latency_us: float = 25.0  # ASSUMPTION: per NCCL collective on one NVSwitch node
    gemm_half_rows: int = 256  # ASSUMPTION: a GEMM of m rows runs at m / (m + this) of its large-m rate

    @property
    def overhead(self) -> float:
        """Measured DiT block time over its FLOPs at the op rates: the element-wise work's share."""
        linear = 2 * _BLOCK_TOKENS * 12 * _BLOCK_DIM**2  # qkv + out (4 d^2) and MLP (8 d^2) per token
        attention = 4 * _BLOCK_TOKENS**2 * _BLOCK_DIM
        ideal_ms = 1e-9 * (linear / self.matmul_tflops + attention / self.dense_attention_tflops)
        return _BLOCK_MS / ideal_ms

    def gemm_efficiency(self, rows: int) -> float:
        def curve(m: int) -> float:
            return m / (m + self.gemm_half_rows)

        return min(1.0, curve(rows) / curve(_BLOCK_TOKENS)) if rows else 1.0


@dataclass(frozen=True)
class StageWork:
    """One stage's counted work for one chunk. `frames` = 0: replicated on every rank (not split)."""

    stage: str
    local_flops: float  # per-token work: split by frames under SP
    attention_flops: float  # self-attention core: split by heads under SP
    local_tflops: float
    attention_tflops: float
    overhead: float
    frames: int = 0  # frames of the sequence split across ranks (Layout.DESIGN)
    halo: int = 0  # frames every rank runs besides its share (Layout.DESIGN; the decoder's priming latents)
    units: int = 0  # the finest split Layout.BALANCED uses (tokens, pixel rows); 0: as `frames`
    heads: int = 0  # attention heads (head groups must divide heads / P)
    tokens_per_frame: int = 0  # per sequence; rows of a rank's GEMMs = batch x its frames x this
    batch: int = 1
    dim: int = 0
    attention_calls: int = 0  # self-attention calls per chunk (layers x passes)
    output_bytes: float = 0.0  # the stage's whole output, all-gathered at exit under SP
    block_bytes: float = 0.0  # one block's bf16 weights (FSDP2 gathers them per block call)


@dataclass(frozen=True)
class StageTime:
    compute_s: float
    exposed_comm_s: float  # all-to-all, exit gather and FSDP gathers not hidden behind compute
    all_to_all_bytes: float  # per rank, whole chunk

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s


def exchange_bytes(tokens: int, local_tokens: int, dim: int, degree: int, batch: int = 1) -> float:
    """Bytes one all-to-all exchange (q, k, v or the output) moves on a rank holding `local_tokens` of
    `tokens`: the larger of what it sends and receives (see the module docstring)."""
    if degree == 1:
        return 0.0
    send = local_tokens * (degree - 1) / degree
    receive = (tokens - local_tokens) / degree
    return BF16_BYTES * batch * dim * max(send, receive)


def exposed_all_to_all(in_s: float, out_s: float, attention_s: float, groups: int, latency_s: float) -> float:
    """Exposed seconds of one layer's all-to-alls (in: q, k, v; out: the output) with `groups` head groups."""
    per_group = (in_s + out_s) / groups + 2 * latency_s
    return (in_s + out_s) / groups + 2 * latency_s + (groups - 1) * max(0.0, per_group - attention_s / groups)


class Layout(StrEnum):
    """How work is split across ranks. DESIGN: what the node implements (sequences split on frame edges,
    the VAE's temporal stage on each rank's latents plus its priming ones). BALANCED: what the 6.5x goal
    needs (DiT sequences split by tokens, the decode split by pixel rows, the temporal stage too, halos
    neglected)."""

    DESIGN = "design"
    BALANCED = "balanced"


def busiest_share(work: StageWork, degree: int, layout: Layout = Layout.DESIGN) -> float:
    """The fraction of a stage's per-token work on the busiest rank (1.0: replicated or one GPU)."""
    balanced = layout is Layout.BALANCED
    parts = work.units or work.frames if balanced else work.frames
    if degree == 1 or parts == 0:
        return 1.0
    halo = 0 if balanced else work.halo
    return min(1.0, (max(end - start for start, end in split_frames(parts, degree)) + halo) / (parts + halo))


def head_groups_for(heads: int, degree: int, wanted: int, stage: str = "a model") -> int:
    """The head groups a model runs with: the largest g <= wanted with degree x g dividing its heads."""
    if heads % degree:
        raise ValueError(f"{stage} has {heads} attention heads: they do not split over an SP degree of {degree}")
    return max(g for g in range(1, wanted + 1) if heads % (degree * g) == 0)


def stage_time(
    work: StageWork,
    degree: int,
    rates: Rates,
    head_groups: int = 1,
    fsdp: bool = False,
    layout: Layout = Layout.DESIGN,
) -> StageTime:
    """The busiest rank's time for one stage at SP degree `degree` (1: one GPU, nothing exchanged)."""
    share = busiest_share(work, degree, layout)
    split = share < 1.0 or (degree > 1 and work.attention_calls > 0)
    heads_share = 1 / degree if split else 1.0
    tokens = work.frames * work.tokens_per_frame
    local_tokens = round(share * tokens)
    local_rate = work.local_tflops * (rates.gemm_efficiency(work.batch * local_tokens) if tokens else 1.0)
    attention_s = work.overhead * 1e-12 * work.attention_flops * heads_share / work.attention_tflops
    compute_s = work.overhead * 1e-12 * work.local_flops * share / local_rate + attention_s
    if not split:
        return StageTime(compute_s, 0.0, 0.0)
    latency, bandwidth = 1e-6 * rates.collective_latency_us, 1e9 * rates.nvlink_gbps
    exposed, moved = 0.0, 0.0
    if work.attention_calls:
        groups = head_groups_for(work.heads, degree, head_groups, work.stage)
        one = exchange_bytes(tokens, local_tokens, work.dim, degree, work.batch)
        per_call_attention = attention_s / work.attention_calls
        layer = exposed_all_to_all(3 * one / bandwidth, one / bandwidth, per_call_attention, groups, latency)
        exposed += work.attention_calls * layer
        moved = 4 * one * work.attention_calls
    if work.output_bytes:  # exit all-gather (the decoder's temporal stage feeds its own rank's spatial stage)
        exposed += work.output_bytes * (degree - 1) / degree / bandwidth + latency
    if fsdp and work.block_bytes and work.attention_calls:
        gather = work.block_bytes * (degree - 1) / degree / bandwidth + latency
        exposed += work.attention_calls * max(0.0, gather - compute_s / work.attention_calls)
    return StageTime(compute_s, exposed, moved)


def _split_counts(counter: FlopCounterMode) -> tuple[float, float]:
    """(local, self-attention core) FLOPs from a counter's per-module breakdown."""
    counts = counter.get_flop_counts()
    total = float(sum(counts["Global"].values()))
    attention = sum(
        float(value)
        for module, ops in counts.items()
        if _SELF_ATTENTION.search(module)
        for op, value in ops.items()
        if str(op) not in _LINEAR_OPS
    )
    return total - attention, attention


def _sequence(run: object) -> tuple[FlopCounterMode, list[tuple[int, int, int]]]:
    """Run `run()` under a FlopCounterMode, recording the (B, L, D) of every self-attention call."""
    shapes: list[tuple[int, int, int]] = []

    def record(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        batch, length, dim = args[0].shape
        shapes.append((batch, length, dim))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: record(module, args) if isinstance(module, Attention) else None
    )
    try:
        with FlopCounterMode(display=False) as counter:
            run()  # type: ignore[operator]
    finally:
        handle.remove()
    return counter, shapes


def _dit_work(
    stage: str, config: DiTConfig, shape: flops.ChunkShape, attention_tflops: float, rates: Rates
) -> StageWork:
    """The A2V or SR DiT's work for one chunk: counted by flops.py's own builders, split by our counter."""
    a2v = stage == flops.Stage.AUDIO_TO_VIDEO
    builder = flops._a2v_flops if a2v else flops._sr_flops  # flops.py's own counting: one definition
    counter, shapes = _sequence(lambda: builder(config, shape))
    local, attention = _split_counts(counter)
    passes = config.a2v.sampling_steps if a2v else 1
    batch, tokens, dim = shapes[0]
    # The sequence's frames (the model splits on their edges): the chunk's latents, then for the A2V its
    # boundary latents and the reference, for the SR its decoder-context latents and the reference.
    if a2v:
        boundary = config.a2v.boundary_frames * (2 if shape.kind is ChunkKind.I else 1)
        frames, (height, width), layers = shape.latents + boundary + 1, shape.low, config.a2v.layers
    else:
        frames, (height, width), layers = config.vae.context_frames + shape.latents + 1, shape.high, config.sr.layers
    if tokens % frames:
        raise ValueError(f"{stage}: {tokens} tokens are not {frames} whole frames")
    with torch.device("meta"):
        model = AudioToVideoDiT(config) if a2v else SuperResolutionDiT(config)
    block = sum(parameter.numel() for parameter in model.blocks[0].parameters())  # what FSDP2 gathers per block
    return StageWork(
        stage=stage,
        local_flops=passes * local,
        attention_flops=passes * attention,
        local_tflops=rates.matmul_tflops,
        attention_tflops=attention_tflops,
        overhead=rates.overhead,
        frames=frames,
        units=tokens,
        heads=config.a2v.heads if a2v else config.sr.heads,
        tokens_per_frame=tokens // frames,
        batch=batch,
        dim=dim,
        attention_calls=passes * layers,
        output_bytes=BF16_BYTES * batch * config.latent_channels * (frames - 1) * height * width,
        block_bytes=BF16_BYTES * block,
    )


def _decode_work(config: DiTConfig, shape: flops.ChunkShape, rates: Rates) -> tuple[StageWork, StageWork]:
    """The VAE decode split as it runs under SP: the temporal stage by latents (each rank primes on
    `context_frames` more), the spatial one by frames (`frames_per_batch` = one latent's frames assumed)."""
    channels = config.latent_channels
    with torch.device("meta"):
        decoder = VAEDecoder(config.vae)
        context = torch.zeros(1, channels, config.vae.context_frames, *shape.high)
        latents = torch.zeros(1, channels, shape.latents, *shape.high)
    with FlopCounterMode(display=False) as temporal, torch.no_grad():
        state = decoder.prime(context) if context.shape[2] else None
        features, _ = decoder.temporal(latents, state)
    with FlopCounterMode(display=False) as spatial, torch.no_grad():
        decoder.spatial(fold(features[:, :, : shape.frames]))
    pixels = shape.frames * 3 * shape.high[0] * shape.high[1] * config.vae.stride**2
    conv = rates.conv_tflops  # no attention in the decoder; its element-wise work is not scaled either
    return (
        StageWork(
            "decode_temporal",
            local_flops=float(temporal.get_total_flops()),
            attention_flops=0.0,
            local_tflops=conv,
            attention_tflops=conv,
            overhead=1.0,
            frames=shape.latents,  # Layout.DESIGN: each rank's latents, plus its priming ones
            halo=config.vae.context_frames,
            units=shape.high[0],  # latent rows (Layout.BALANCED)
        ),
        StageWork(
            "decode_spatial",
            local_flops=float(spatial.get_total_flops()),
            attention_flops=0.0,
            frames=shape.frames,
            units=shape.frames * shape.high[0] * config.vae.stride,  # pixel rows of every frame
            output_bytes=BF16_BYTES * pixels,
            local_tflops=conv,
            attention_tflops=conv,
            overhead=1.0,
        ),
    )


@lru_cache(maxsize=16)
def chunk_work(config: DiTConfig, resolution: str, n_frames: int, kind: ChunkKind, rates: Rates) -> list[StageWork]:
    """Every stage's counted work for one chunk (cached: counting a 14B model on meta takes seconds)."""
    shape = flops.chunk_shape(config, resolution, n_frames, kind)
    context = flops._context_flops(config, shape)
    return [
        StageWork(flops.Stage.CONTEXT, context, 0.0, rates.matmul_tflops, rates.matmul_tflops, rates.overhead),
        _dit_work(flops.Stage.AUDIO_TO_VIDEO, config, shape, rates.dense_attention_tflops, rates),
        _dit_work(flops.Stage.SUPER_RESOLUTION, config, shape, rates.window_attention_tflops, rates),
        *_decode_work(config, shape, rates),
    ]
