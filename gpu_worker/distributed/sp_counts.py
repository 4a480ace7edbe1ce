"""The work of one chunk for the SP paper model (sp_model.py has the costs): every stage's FLOPs counted with
FlopCounterMode on the meta device, through flops.py's own builders, and split the way the node splits it.
A MODEL's input, not a measurement. Importable with torch alone."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.distributed.sp_model import BF16_BYTES, MAX_DEGREE, Rates, StageWork, largest_part
from gpu_worker.models.dit import flops
from gpu_worker.models.dit.a2v import AudioToVideoDiT
from gpu_worker.models.dit.config import A2VConfig, DiTConfig, SRConfig, preset
from gpu_worker.models.dit.decoder import latents_behind, spatial_batches
from gpu_worker.models.dit.layers import Attention
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.models.dit.vae import VAEDecoder, fold
from monologue.contracts import ChunkKind

_SELF_ATTENTION = re.compile(r"\.blocks\.\d+\.attention$")
_QKV = re.compile(r"\.blocks\.\d+\.attention\.qkv$")
_OUT = re.compile(r"\.blocks\.\d+\.attention\.out$")
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


def sequence_shares(tokens: int, unit_tokens: int = 1) -> tuple[float, ...]:
    """A DiT's shares as `SequenceShard.split` cuts its sequence: whole units of `unit_tokens` tokens."""
    units = tokens // unit_tokens
    return tuple(largest_part(units, degree) / units for degree in range(1, MAX_DEGREE + 1))


@dataclass(frozen=True)
class DecodeCosts:
    """The decoder's temporal FLOPs by part: priming (every rank with frames primes), the latent-rate stage per
    latent, depth to time per frame."""

    priming: float
    per_latent: float
    per_frame: float


def decode_shares(
    frames: int, frames_per_batch: int, stride: int, costs: DecodeCosts, spatial: bool
) -> tuple[float, ...]:
    """The decoder's shares as `DiTDecoder.decode` splits it: whole spatial batches per rank (`spatial_batches`);
    each rank's latent-rate stage on the latents behind its frames (`latents_behind`) after its priming, and
    depth to time for its own frames only (`VAEDecoder.frame_features`). One rank: every latent, one priming."""
    latents = -(-frames // stride)
    whole = costs.priming + latents * costs.per_latent + frames * costs.per_frame
    shares = []
    for degree in range(1, MAX_DEGREE + 1):
        ranks = [(b[0][0], b[-1][1]) for b in spatial_batches(frames, frames_per_batch, degree) if b]
        if spatial:
            shares.append(max(end - start for start, end in ranks) / frames)
            continue
        busiest = max(
            costs.priming + costs.per_latent * (last - first) + costs.per_frame * (end - start)
            for (start, end), (first, last) in ((rank, latents_behind(*rank, stride)) for rank in ranks)
        )
        shares.append(busiest / whole)
    return tuple(shares)


def _split_counts(counter: FlopCounterMode) -> tuple[float, float, float, float]:
    """(local, self-attention core, q k v projection, output projection) FLOPs from a counter's per-module
    breakdown (the projections are part of local)."""
    counts = counter.get_flop_counts()
    total = float(sum(counts["Global"].values()))
    attention = sum(
        float(value)
        for module, ops in counts.items()
        if _SELF_ATTENTION.search(module)
        for op, value in ops.items()
        if str(op) not in _LINEAR_OPS
    )

    def module_total(pattern: re.Pattern[str]) -> float:
        return sum(float(sum(ops.values())) for module, ops in counts.items() if pattern.search(module))

    return total - attention, attention, module_total(_QKV), module_total(_OUT)


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
    local, attention, projection, out_projection = _split_counts(counter)
    passes = config.a2v.sampling_steps if a2v else 1
    batch, tokens, dim = shapes[0]
    # The A2V splits its sequence by tokens, the SR in whole attention blocks (their forward's SequenceShard).
    unit = 1 if a2v else config.sr.block_size
    # The output all-gathered at exit: the chunk's latents (A2V), the context latents and the chunk's (SR).
    height, width = shape.low if a2v else shape.high
    out_frames = shape.latents if a2v else config.vae.context_frames + shape.latents
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
        shares=sequence_shares(tokens, unit),
        units=tokens,
        heads=config.a2v.heads if a2v else config.sr.heads,
        tokens=tokens,
        batch=batch,
        dim=dim,
        attention_calls=passes * (config.a2v.layers if a2v else config.sr.layers),
        projection_flops=passes * projection,
        out_projection_flops=passes * out_projection,
        output_bytes=BF16_BYTES * batch * config.latent_channels * out_frames * height * width,
        passes=passes,
        block_bytes=BF16_BYTES * block,
    )


def _decode_work(config: DiTConfig, shape: flops.ChunkShape, rates: Rates) -> tuple[StageWork, StageWork]:
    """The VAE decode as it runs under SP (`decode_shares`): the temporal stage counted as its priming on
    `context_frames` latents plus the chunk's latents, the spatial one per frame."""
    channels, vae = config.latent_channels, config.vae
    with torch.device("meta"):
        decoder = VAEDecoder(vae)
        context = torch.zeros(1, channels, vae.context_frames, *shape.high)
        latents = torch.zeros(1, channels, shape.latents, *shape.high)
    with FlopCounterMode(display=False) as priming, torch.no_grad():
        state = decoder.prime(context) if context.shape[2] else None
    with FlopCounterMode(display=False) as rate, torch.no_grad():
        inputs, _ = decoder.temporal_inputs(latents, state)
    with FlopCounterMode(display=False) as depth, torch.no_grad():
        features = decoder.frame_features(inputs, range(shape.frames))
    with FlopCounterMode(display=False) as spatial, torch.no_grad():
        decoder.spatial(fold(features))
    frame_bytes = 3 * shape.high[0] * shape.high[1] * vae.stride**2  # uint8 RGB (the canvas: a bound)
    conv = rates.conv_tflops  # no attention in the decoder; its element-wise work is not scaled either
    costs = DecodeCosts(
        float(priming.get_total_flops()),
        float(rate.get_total_flops()) / shape.latents,
        float(depth.get_total_flops()) / shape.frames,
    )
    split = (shape.frames, vae.frames_per_batch, vae.temporal_stride, costs)
    return (
        StageWork(
            "decode_temporal",
            local_flops=costs.priming + shape.latents * costs.per_latent + shape.frames * costs.per_frame,
            attention_flops=0.0,
            local_tflops=conv,
            attention_tflops=conv,
            overhead=1.0,
            shares=decode_shares(*split, spatial=False),
            units=shape.high[0],  # latent rows (Layout.BALANCED)
        ),
        StageWork(
            "decode_spatial",
            local_flops=float(spatial.get_total_flops()),
            attention_flops=0.0,
            local_tflops=conv,
            attention_tflops=conv,
            overhead=1.0,
            shares=decode_shares(*split, spatial=True),
            units=shape.frames * shape.high[0] * vae.stride,  # pixel rows of every frame
            output_bytes=shape.frames * frame_bytes,
            gather_rounds=tuple(
                max(len(batches) for batches in spatial_batches(shape.frames, vae.frames_per_batch, degree))
                for degree in range(1, MAX_DEGREE + 1)
            ),
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
