"""FLOPs per output frame of the dit family, counted on the meta device: the budget every preset is held to.

Why count rather than estimate: a hand formula drifts from the models as they change (a new cross-attention,
a register token, a temporal stride), while `torch.utils.flop_counter.FlopCounterMode` counts the matrix
products and attention of the real forwards. The models are built under `torch.device("meta")` and run on
meta tensors of a real chunk's shapes, so nothing is allocated or computed: the h200 preset at 720p is
counted on a laptop CPU in seconds, and the budget (≤ 15 TFLOP per output frame) is a unit test
(tests/gpu_worker/models/dit/test_flop_budget.py).

What is counted, per chunk (`chunk_flops`), as the pipeline runs it (roles.py):
- context: the audio encoder over the chunk's audio and its margins. The prompt's text encoder runs once
  per session (cached) and the reference encoder once per session: neither is a per-chunk cost.
- audio_to_video: one DiT forward on the chunk's latents with its boundary latents (the previous N chunk's
  tail for an N chunk, both anchors for an I chunk), times the sampling steps, times 2 with classifier-free
  guidance (the conditional and unconditional passes are one batch of 2). No prompt (the default).
- super_resolution: one pass over the chunk's latents and the decoder-context latents before it. Its
  frame-window attention is counted on the `windowed` backend, which computes exactly the allowed (query
  frame, key frame) pairs: the useful FLOPs, equal to `sparse_attention.window_stats(...).useful_flops`,
  what the FlexAttention kernel computes with frame-aligned blocks (it skips whole masked blocks). The
  compiled path also pads a sequence to its compile bucket (`SRConfig.frame_buckets`); the h200 preset's
  N and I sequences (15 and 6 latent frames with context and reference) fill theirs exactly, and a shorter
  chunk's padding frames attend only to themselves: not counted here.
- decode: the VAE decoder's causal (temporal) stage over the context latents (priming) and the chunk's
  latents, and its per-frame (spatial) stage over the chunk's output frames.
Matrix products, convolutions and attention are counted (FlopCounterMode's ops: a multiply-add is 2
FLOPs); element-wise work (norms, activations, the STFT) is not, being memory-bound and small.

`flops_per_frame` sums one steady-state N chunk and one I chunk and divides by their frames: a long
video is N I N I …, so that is its average cost per frame. Run `python -m gpu_worker.models.dit.flops
--preset h200 --resolution 720p` for the breakdown. Importable with torch alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT
from gpu_worker.models.dit.audio_encoder import AudioEncoder
from gpu_worker.models.dit.config import PRESETS, DiTConfig, preset
from gpu_worker.models.dit.reference import named_canvas
from gpu_worker.models.dit.roles import chunk_latents
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.models.dit.vae import VAEDecoder, fold
from gpu_worker.pipeline.types import ChunkRequest, OutputSpec
from monologue.contracts import Chunk, ChunkKind, Resolution

# The chunk sizes the budget is set for: the default RenderOptions' chunk_frames and i_frames.
N_FRAMES, I_FRAMES = 40, 4
BUDGET_TFLOP_PER_FRAME = 15.0
# The H200's measured bf16 matrix-product rate (../shared/GPU_NOTES.md): FLOPs / this = the compute floor.
H200_BF16_TFLOPS = 751.0
_META = torch.device("meta")


class Stage(StrEnum):
    """The pipeline stages FLOPs are reported for (decode is the decode_publish stage's model work)."""

    CONTEXT = "context"
    AUDIO_TO_VIDEO = "audio_to_video"
    SUPER_RESOLUTION = "super_resolution"
    DECODE = "decode"


@dataclass(frozen=True)
class ChunkShape:
    """The sizes one chunk's stages run on."""

    kind: ChunkKind
    frames: int  # video frames the chunk shows
    latents: int  # its latent frames, ceil(frames / temporal stride)
    audio_frames: int  # video frames of audio tokens: the latents' span and the margins either side
    low: tuple[int, int]  # (h, w) of the A2V DiT's latents
    high: tuple[int, int]  # (H, W) of the output-resolution latents (SR output, decoder input)


def chunk_shape(config: DiTConfig, resolution: str, n_frames: int, kind: ChunkKind | str) -> ChunkShape:
    kind = ChunkKind(kind)
    stride = config.vae.temporal_stride
    latents = chunk_latents(ChunkRequest(Chunk(kind, 1, 0, n_frames)), stride)
    width, height = named_canvas(config, resolution)
    high = (height // config.vae.stride, width // config.vae.stride)
    low = (high[0] // config.sr.scale, high[1] // config.sr.scale)
    audio_frames = stride * latents + sum(config.audio.margin_frames)
    return ChunkShape(kind, n_frames, latents, audio_frames, low, high)


def _counted(run: Callable[[], object]) -> float:
    """FLOPs of `run()` (a closure over meta tensors)."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        run()
    return float(counter.get_total_flops())


def _context_flops(config: DiTConfig, shape: ChunkShape) -> float:
    audio = config.audio
    samples = shape.audio_frames * audio.sample_rate // OutputSpec().fps
    mel_frames = samples // audio.hop + 1
    with _META:
        encoder = AudioEncoder(audio)
        waveform, pooling = torch.zeros(1, samples), torch.zeros(shape.audio_frames, mel_frames)
    return _counted(lambda: encoder(waveform, pooling))


def _a2v_flops(config: DiTConfig, shape: ChunkShape) -> float:
    a2v, audio = config.a2v, config.audio
    (height, width), channels = shape.low, config.latent_channels
    boundary = a2v.boundary_frames * (2 if shape.kind is ChunkKind.I else 1)
    batch = 1 if a2v.guidance_scale == 1.0 else 2  # guidance: conditional + unconditional in one batch
    with _META:
        model = AudioToVideoDiT(config)
        cond = A2VConditioning(
            reference=torch.zeros(batch, channels, height, width),
            boundary=torch.zeros(batch, channels, boundary, height, width),
            boundary_times=torch.zeros(boundary),
            audio=torch.zeros(batch, shape.audio_frames, audio.tokens_per_frame, audio.dim),
            audio_times=torch.zeros(shape.audio_frames),
            text=torch.zeros(batch, 0, config.text.dim),
            text_mask=torch.zeros(batch, 0, dtype=torch.bool),
            keep_audio=torch.ones(batch, dtype=torch.bool),
        )
        noisy, t = torch.zeros(batch, channels, shape.latents, height, width), torch.zeros(batch)
    # Every sampling step is the same forward on the same shapes: count one, multiply.
    return a2v.sampling_steps * _counted(lambda: model(noisy, t, cond))


def _sr_flops(config: DiTConfig, shape: ChunkShape) -> float:
    # The windowed backend computes the allowed frame pairs only: the useful FLOPs (see the docstring).
    windowed = replace(config, sr=replace(config.sr, attention="windowed"))
    (height, width), channels = shape.low, config.latent_channels
    with _META:
        model = SuperResolutionDiT(windowed)
        latents = torch.zeros(1, channels, config.vae.context_frames + shape.latents, height, width)
        reference = torch.zeros(1, channels, *shape.high)
    return _counted(lambda: model(latents, reference))


def _decode_flops(config: DiTConfig, shape: ChunkShape) -> float:
    channels = config.latent_channels
    with _META:
        decoder = VAEDecoder(config.vae)
        context = torch.zeros(1, channels, config.vae.context_frames, *shape.high)
        latents = torch.zeros(1, channels, shape.latents, *shape.high)

    def run() -> None:
        state = decoder.prime(context) if context.shape[2] else None
        features, _ = decoder.temporal(latents, state)  # (1, C', stride x latents, H, W)
        decoder.spatial(fold(features[:, :, : shape.frames]))  # frames past a ragged end are never decoded

    return _counted(run)


def chunk_flops(config: DiTConfig, resolution: str, n_frames: int, kind: ChunkKind | str) -> dict[str, float]:
    """FLOPs of each stage (`Stage` values) for one chunk of `n_frames` frames at `resolution`: an N chunk
    after the first (it has a previous N chunk to continue from) or an I chunk."""
    shape = chunk_shape(config, resolution, n_frames, kind)
    return {
        Stage.CONTEXT.value: _context_flops(config, shape),
        Stage.AUDIO_TO_VIDEO.value: _a2v_flops(config, shape),
        Stage.SUPER_RESOLUTION.value: _sr_flops(config, shape),
        Stage.DECODE.value: _decode_flops(config, shape),
    }


def flops_per_frame(
    config: DiTConfig, resolution: str, n_frames: int = N_FRAMES, i_frames: int = I_FRAMES
) -> dict[str, float]:
    """TFLOP per output frame of each stage over one N and one I chunk, and their "total"."""
    n_chunk = chunk_flops(config, resolution, n_frames, ChunkKind.N)
    i_chunk = chunk_flops(config, resolution, i_frames, ChunkKind.I) if i_frames else dict.fromkeys(n_chunk, 0.0)
    frames = n_frames + i_frames
    per_frame = {stage: (n_chunk[stage] + i_chunk[stage]) / frames / 1e12 for stage in n_chunk}
    per_frame["total"] = sum(per_frame.values())
    return per_frame


def describe_flops(config: DiTConfig, resolution: str, per_frame: dict[str, float] | None = None) -> str:
    """Lines of text: the per-stage TFLOP per output frame, the total against the budget, and the sizes.
    `per_frame`: `flops_per_frame(config, resolution)` when the caller has it already (counting takes seconds)."""
    per_frame = per_frame or flops_per_frame(config, resolution)
    width, height = named_canvas(config, resolution)
    a2v = config.a2v
    guidance = "" if a2v.guidance_scale == 1.0 else " x 2 (guidance)"
    lines = [
        f"FLOPs per output frame, {config.name} preset at {resolution} (canvas {width}x{height}), one N chunk of "
        f"{N_FRAMES} frames + one I chunk of {I_FRAMES}; A2V {a2v.sampling_steps} steps{guidance}, "
        f"VAE temporal stride {config.vae.temporal_stride}:",
    ]
    for stage in Stage:
        value = per_frame[stage.value]
        lines.append(f"  {stage.value:<17} {value:7.3f} TFLOP/frame  {100 * value / per_frame['total']:5.1f} %")
    verdict = "within" if per_frame["total"] <= BUDGET_TFLOP_PER_FRAME else "OVER"
    lines.append(
        f"  {'total':<17} {per_frame['total']:7.3f} TFLOP/frame  ({verdict} the {BUDGET_TFLOP_PER_FRAME:g} budget)"
    )
    floor_ms = 1000 * per_frame["total"] / H200_BF16_TFLOPS
    lines.append(
        f"  at {H200_BF16_TFLOPS:g} TFLOP/s (H200 bf16 matmul peak): {floor_ms:.1f} ms/frame, "
        f"at most {1000 / floor_ms:.0f} fps on one H200"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--preset", default="h200", choices=sorted(PRESETS))
    parser.add_argument(
        "--resolution", default="720p", choices=[r.value for r in Resolution if r is not Resolution.SOURCE]
    )
    args = parser.parse_args(argv)
    print(describe_flops(preset(args.preset), args.resolution))


if __name__ == "__main__":
    main()
