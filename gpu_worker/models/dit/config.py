"""The dit family's configuration: one frozen dataclass per model, grouped in `DiTConfig`, and named presets.

A checkpoint folder holds `config.json` (this, as JSON) next to one safetensors file per model, so the
architecture is never guessed from tensor shapes. Sizes that must agree across models (latent channels,
patch sizes, the VAE's stride) are read from one place here rather than repeated in each model.

Presets:
- `tiny`: one- and two-layer models for CPU tests and the smoke-test family. An 8-frame 256x256 chunk
  takes about half a second on one core, nine tenths of it the VAE decoder at full resolution.
- `h200`: sized for one H200 at 720p25: a ~1B-parameter audio-to-video DiT (d=2048, 16 heads of 128) and a
  ~150M super-resolution DiT whose frames are padded to a multiple of 128 tokens (720p: 80x46 = 3680
  tokens + 32 registers = 3712 = 29 x 128), so FlexAttention's 128-blocks never straddle a frame edge.
  With 4 sampling steps and the 4x temporal VAE it makes a 720p frame in 6.3 TFLOP, within the 15 TFLOP
  budget that tests/gpu_worker/models/dit/test_flop_budget.py holds it to (`python -m
  gpu_worker.models.dit.flops` prints the breakdown).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

AttentionBackend = Literal["auto", "flex", "flex_eager", "dense", "windowed"]


@dataclass(frozen=True)
class VAEConfig:
    latent_channels: int = 16
    # Width of the full-resolution level; level i is base_channels * channel_multipliers[i] wide. Narrow at
    # full resolution, wide at low resolution: most of a frame's decoder FLOPs are then at 1/2 to 1/8 size.
    base_channels: int = 64
    # One level per entry; every level after the first halves height and width (stride 2 ** (levels - 1)).
    channel_multipliers: tuple[int, ...] = (1, 2, 4, 8)
    # Video frames per latent frame (a power of two): latent j covers frames [4 j, 4 j + 4), so every chunk
    # but a session's last starts and ends on a multiple of it (monologue.contracts.Family.DIT.temporal_stride).
    temporal_stride: int = 4
    blocks_per_level: int = 1
    # Only the latent-resolution stage mixes time (causal convolutions at the latent rate): it is cheap
    # there, and it keeps the decoder's temporal receptive field (the latents a chunk needs to re-create
    # the causal cache, `context_frames`) short.
    mid_blocks: int = 1
    temporal_kernel: int = 2
    norm_groups: int = 32
    # The decoder's per-frame (upsampling) stage runs this many video frames at a time, so its activations
    # stay bounded at 720p (128 channels x 640 x 368 x 2 bytes = 60 MB per frame at the widest level). Sequence
    # parallelism splits the decode in whole batches (a batch's shape can change a convolution's rounding), so
    # one frame a batch lets 8 ranks share a 40-frame chunk evenly, 5 frames each; each frame is still a large
    # convolution (640 x 368 pixels at the widest level).
    frames_per_batch: int = 1
    # DiT latents = (encoder mean - shift) * scale, so the diffusion models see roughly unit variance.
    latent_shift: float = 0.0
    latent_scale: float = 1.0

    @property
    def stride(self) -> int:
        """The spatial stride: pixels per latent along each side."""
        return int(2 ** (len(self.channel_multipliers) - 1))

    @property
    def context_frames(self) -> int:
        """Latent frames before a chunk that determine its decoded frames exactly: the causal receptive field
        of the decoder's state (conv_in, two convolutions per mid block and the depth-to-time convolution,
        each reaching kernel - 1 latents back)."""
        return (self.temporal_kernel - 1) * (2 + 2 * self.mid_blocks)


@dataclass(frozen=True)
class AudioConfig:
    sample_rate: int = 16_000
    n_fft: int = 400  # 25 ms analysis window
    hop: int = 160  # 10 ms: 4 mel frames per video frame at 25 fps
    n_mels: int = 80
    f_min: float = 0.0
    f_max: float = 8_000.0
    dim: int = 512
    layers: int = 4
    heads: int = 8
    tokens_per_frame: int = 4  # audio tokens per video frame, what the A2V DiT cross-attends to
    # Video frames of audio before and after the chunk: look-behind and look-ahead for the mouth.
    margin_frames: tuple[int, int] = (2, 2)


@dataclass(frozen=True)
class TextConfig:
    dim: int = 512
    layers: int = 4
    heads: int = 8
    max_bytes: int = 256  # UTF-8 bytes kept from the prompt


@dataclass(frozen=True)
class A2VConfig:
    dim: int = 1536
    layers: int = 20
    heads: int = 12
    mlp_ratio: float = 4.0
    patch: int = 2  # spatial patch over the low-resolution latents
    # Clean latent frames of each neighbouring chunk in the token sequence: the previous N chunk's last
    # frames (motion continuity) and, for I chunks, the next N chunk's first frames.
    boundary_frames: int = 2
    audio_window: int = 2  # a frame's tokens cross-attend to the audio of frames within ± this many
    # Few-step sampling: a checkpoint distilled for 4 steps (as Self-Forcing distils Wan to 4 steps).
    # Preview halves it (roles.py): 2 steps.
    sampling_steps: int = 4
    # Classifier-free guidance on audio and text; 1.0 runs one pass per step (a distilled checkpoint needs no
    # more), above 1 two passes (conditional and unconditional) batched together.
    guidance_scale: float = 1.0
    # t' = shift t / (1 + (shift - 1) t) spends more of the steps at high noise, where layout and motion are
    # decided. SD3 uses 3 at 1024 px, Wan 5 at 720p; 5 with 4 steps gives t = 1, 0.9375, 0.833, 0.625 → 0,
    # exactly Self-Forcing's 4-step schedule (its denoising_step_list [1000, 750, 500, 250] warped by shift 5).
    # The last step jumps from 0.625 to data: texture left coarse there is the super-resolution pass's job.
    timestep_shift: float = 5.0
    # Where the reference frame sits in time (RoPE), the same for every chunk, so every chunk sees the
    # reference alike; a type embedding tells it apart from the boundary frames.
    reference_position: float = -16.0
    rope_theta: float = 10_000.0


@dataclass(frozen=True)
class SRConfig:
    dim: int = 1024
    layers: int = 12
    heads: int = 8
    mlp_ratio: float = 4.0
    patch: int = 2  # spatial patch over the output-resolution latents
    scale: int = 2  # output latents are this many times the low-resolution latents per side
    window: int = 1  # each frame attends to frames within ± this many, plus the reference frame
    # Tokens per frame are padded with learned registers to a multiple of this, so attention blocks align
    # with frame edges: every block is wholly inside the window mask or wholly outside it.
    block_size: int = 128
    # auto: compiled FlexAttention on CUDA with 128-blocks, else per-frame windowed SDPA (sparse_attention.py).
    attention: AttentionBackend = "auto"
    # Compiled FlexAttention pads each sequence to the smallest of these frame counts (latents, decoder context
    # and the reference) and compiles each once, at load (sparse_attention.py). With 4 video frames per latent
    # and 4 context latents: a 12-frame first chunk is 3 + 1 = 4, a 4-frame I chunk 1 + 4 + 1 = 6, a 40-frame
    # first chunk 11 (→ 12), a 40-frame N chunk 10 + 4 + 1 = 15; 24 takes N chunks of up to 76 frames.
    frame_buckets: tuple[int, ...] = (4, 6, 12, 15, 24)
    rope_theta: float = 10_000.0


@dataclass(frozen=True)
class DiTConfig:
    name: str = "custom"
    vae: VAEConfig = field(default_factory=VAEConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    text: TextConfig = field(default_factory=TextConfig)
    a2v: A2VConfig = field(default_factory=A2VConfig)
    sr: SRConfig = field(default_factory=SRConfig)

    @property
    def latent_channels(self) -> int:
        return self.vae.latent_channels

    @property
    def canvas_multiple(self) -> int:
        """Frames are generated on a canvas whose sides are multiples of this (then cropped to the output
        size): the low-resolution latents must split into A2V patches and the output latents into SR ones."""
        low = self.sr.scale * self.a2v.patch
        return self.vae.stride * low * self.sr.patch // math.gcd(low, self.sr.patch)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DiTConfig:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"config.json must hold an object, got {type(raw).__name__}")
        sections = {"vae": VAEConfig, "audio": AudioConfig, "text": TextConfig, "a2v": A2VConfig, "sr": SRConfig}
        unknown = set(raw) - set(sections) - {"name"}
        if unknown:
            raise ValueError(f"config.json has unknown sections {sorted(unknown)}; known: name, {', '.join(sections)}")
        parts: dict[str, Any] = {"name": str(raw.get("name", "custom"))}
        for key, section in sections.items():
            parts[key] = _section(section, raw.get(key, {}), key)
        return cls(**parts)


def _section(section: type[Any], values: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(section)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"config.json section {where!r} has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    # JSON has no tuples; the dataclasses do (they are frozen and hashable).
    return section(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


TINY = DiTConfig(
    name="tiny",
    vae=VAEConfig(
        latent_channels=4,
        base_channels=8,
        channel_multipliers=(1, 2, 2, 2),
        mid_blocks=1,
        temporal_stride=4,
        temporal_kernel=2,
        norm_groups=4,
        frames_per_batch=16,
    ),
    audio=AudioConfig(n_mels=32, dim=32, layers=1, heads=2, tokens_per_frame=2, margin_frames=(2, 2)),
    text=TextConfig(dim=32, layers=1, heads=2, max_bytes=64),
    a2v=A2VConfig(dim=64, layers=2, heads=2, boundary_frames=2, audio_window=1, sampling_steps=2),
    sr=SRConfig(dim=64, layers=2, heads=2, block_size=16),
)

# 16 heads of 128 in the A2V DiT (d=2048, 11 layers, 1.03B parameters), 8 in the SR DiT: both split over a
# sequence-parallel degree of 1, 2, 4 or 8 (gpu_worker/distributed/sequence.py).
H200 = DiTConfig(name="h200", vae=VAEConfig(temporal_stride=4), a2v=A2VConfig(dim=2048, layers=11, heads=16))

PRESETS: dict[str, DiTConfig] = {"tiny": TINY, "h200": H200}


def preset(name: str, **changes: Any) -> DiTConfig:
    """A named preset, optionally with whole sections replaced (`preset("tiny", sr=SRConfig(...))`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown dit preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)
