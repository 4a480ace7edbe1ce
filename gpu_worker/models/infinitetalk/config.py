"""The infinitetalk family's architecture and sampling, as frozen configs with named presets.

The real preset is exactly what the original code builds: the DiT from the Wan folder's `config.json` plus
InfiniteTalk's audio-adapter defaults (InfiniteTalk `wan/modules/multitalk_model.py`, WanModel.__init__,
lines 443-468), umT5-XXL (`wan/modules/t5.py` umt5_xxl, lines 461-474), the CLIP ViT-H/14 of open-clip's
xlm-roberta-large-vit-huge-14 (`wan/modules/clip.py` clip_xlm_roberta_vit_h_14, lines 471-498) and the Wan
2.1 VAE (`wan/modules/vae.py` WanVAE). Those three have no config file in the user's folders (the original
hard-codes them), so the preset names them; `tiny` is the same architecture at test widths, and the
checkpoint loader holds every tensor of the files to the preset's shapes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from monologue.contracts import SamplingPreset
from monologue.contracts.frames import INFINITETALK_BUCKETS_480, INFINITETALK_BUCKETS_720

# InfiniteTalk `wan/configs/wan_multitalk_14B.py` line 11: the negative prompt its pipeline uses when none is given.
NEGATIVE_PROMPT = (
    "bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, static, "
    "overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, extra fingers, poorly "
    "drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, fused fingers, still picture, messy "
    "background, three legs, many people in the background, walking backwards"
)

# InfiniteTalk's (height, width) size buckets by aspect ratio h/w: the API checks a requested size with them, so
# they are defined in the contracts (with the original's line numbers).
BUCKETS_480 = INFINITETALK_BUCKETS_480
BUCKETS_720 = INFINITETALK_BUCKETS_720


@dataclass(frozen=True)
class DiTConfig:
    """Wan2.1-I2V-14B's transformer and InfiniteTalk's audio adapter (the WanModel keyword arguments)."""

    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    num_heads: int = 40
    num_layers: int = 40
    in_dim: int = 36  # 16 noisy latent channels + 4 mask channels + 16 channels of the encoded reference video
    out_dim: int = 16
    text_len: int = 512  # umT5 tokens, zero-padded: diffusers' WanAttnProcessor also hard-codes 512
    text_dim: int = 4096
    image_dim: int = 1280  # CLIP ViT-H width (MLPProj(1280, dim): multitalk_model.py line 529)
    eps: float = 1e-6
    patch_size: tuple[int, int, int] = (1, 2, 2)
    # The audio adapter (multitalk_model.py lines 467-475, 533-541; AudioProjModel lines 366-392).
    audio_window: int = 5  # wav2vec2 frames around each video frame
    intermediate_dim: int = 512
    output_dim: int = 768  # audio token width (the audio cross-attention's key/value input)
    context_tokens: int = 32  # audio tokens per latent frame
    vae_scale: int = 4  # the VAE's temporal stride
    audio_blocks: int = 12  # wav2vec2 hidden states stacked (AudioProjModel's default; the encoder's layers)
    audio_channels: int = 768  # wav2vec2 width (AudioProjModel's default)
    norm_input_visual: bool = True  # norm_x before the audio cross-attention
    norm_output_audio: bool = True  # audio_proj.norm

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


@dataclass(frozen=True)
class T5Config:
    """umT5-XXL's encoder (wan/modules/t5.py lines 461-474)."""

    vocab: int = 256384
    dim: int = 4096
    dim_attn: int = 4096
    dim_ffn: int = 10240
    num_heads: int = 64
    num_layers: int = 24
    num_buckets: int = 32


@dataclass(frozen=True)
class ClipConfig:
    """open-clip xlm-roberta-large-vit-huge-14 (wan/modules/clip.py lines 471-498): the visual tower runs, the
    text tower's tensors are in the file and unused by image-to-video."""

    image_size: int = 224
    patch_size: int = 14
    dim: int = 1280
    mlp_ratio: int = 4
    num_heads: int = 16
    num_layers: int = 32  # the original uses the first 31 (`use_31_block`, clip.py line 295)
    embed_dim: int = 1024
    text_vocab: int = 250002
    text_dim: int = 1024
    text_heads: int = 16
    text_layers: int = 24
    text_positions: int = 514
    eps: float = 1e-5


@dataclass(frozen=True)
class VAEConfig:
    """The Wan 2.1 VAE (wan/modules/vae.py: WanVAE_ with dim 96, z_dim 16)."""

    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    spatial_stride: int = 8
    temporal_stride: int = 4


class EncoderPrecision(StrEnum):
    """An encoder's dtype on a node whose `Precision` is below fp32 (a CPU node runs everything in fp32)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"  # the DiT's: half the VAE's activations, off the original's numbers


class Spacing(StrEnum):
    """Where a schedule's `steps` timesteps sit before the shift (then 0 ends it)."""

    WAN = "wan"  # InfiniteTalk's: linspace(1000, 1, steps) (multitalk.py lines 636-643)
    # lightx2v's step-distill scheduler (WanStepDistillScheduler: `denoising_step_list` [1000, 750, 500, 250] at 4
    # steps, the sigmas of linspace(1, 0, 1001) at those indices): 1000 (steps - k) / steps, k < steps.
    DISTILLED = "distilled"


@dataclass(frozen=True)
class SamplingConfig:
    """InfiniteTalk's sampler (`generate_infinitetalk.py` lines 42-52 and its argument defaults; `wan/multitalk.py`
    lines 376-392, 636-776): Euler over the flow-matching ODE on shifted timesteps, three passes per step (two
    with text_scale 1, one with both scales 1: guidance off)."""

    steps: int = 40
    shift_480: float = 7.0  # `--sample_shift` default for infinitetalk-480
    shift_720: float = 11.0  # and for infinitetalk-720
    text_scale: float = 5.0
    audio_scale: float = 4.0
    num_timesteps: int = 1000
    negative_prompt: str = NEGATIVE_PROMPT
    spacing: Spacing = Spacing.WAN

    @property
    def passes(self) -> int:
        """DiT passes per step: text+audio; + negative+audio for text guidance; + negative+silence for audio's."""
        if math.isclose(self.text_scale, 1.0):
            return 1 if math.isclose(self.audio_scale, 1.0) else 2
        return 3


# The `quality` preset: the original's sampler, as above.
QUALITY_SAMPLING = SamplingConfig()
# The `fast` preset: what lightx2v's step/CFG-distilled LoRA for Wan2.1-I2V-14B was distilled to
# (lightx2v configs/distill/wan21/wan_i2v_distill_lora_4step_cfg.json: infer_steps 4, denoising_step_list
# [1000, 750, 500, 250], sample_shift 5, enable_cfg false). Both guidance scales 1: one DiT pass per step with the
# prompt and the audio, no negative prompt. (InfiniteTalk's README runs FusionX at 8 steps, shift 2, audio guidance
# 2: two passes; `sampling_steps` sets the step count, the rest stays this preset's.)
FAST_SAMPLING = SamplingConfig(
    steps=4, shift_480=5.0, shift_720=5.0, text_scale=1.0, audio_scale=1.0, spacing=Spacing.DISTILLED
)


@dataclass(frozen=True)
class StreamConfig:
    """How InfiniteTalk's streaming clips map onto Monologue's chunks (see roles.py)."""

    motion_frames: int = 9  # `--motion_frame` default: the previous clip's last frames, re-encoded, lead each clip
    right_latents: int = 2  # an I chunk's clean right context: N(k+1)'s first latents
    # The Wan decoder's causal receptive field, in latents: priming its cache on this many latents reproduces the
    # cache of a decode from the video's start bit for bit. Each causal 3-tap convolution reaches 2 steps back:
    # 12 at the latent rate (conv_in, 4 in the middle, 6 in the first up block, its time_conv) = 24 latents, 7 at
    # twice the rate = 7, 13 at four times = 6.5: 38 (test_vae.py checks 38 is exact and 37 is not).
    decoder_context: int = 38
    # Decode streams' states a node keeps between chunks (vae.StreamStates: a chunk after one decoded here skips the
    # priming above); each is 3.8 GB at 480p in fp32 (8.7 at 720p). Two hold a session's last two N chunks' (N(k)'s
    # for I(k), N(k+1)'s for N(k+2)); a process serving several sessions at once needs two each to skip every
    # priming. 0: always prime (less memory, the same frames).
    decoder_states: int = 2
    audio_context_frames: int = 25  # wav2vec2's left context before a chunk (1 s)


@dataclass(frozen=True)
class InfiniteTalkConfig:
    name: str
    dit: DiTConfig = field(default_factory=DiTConfig)
    t5: T5Config = field(default_factory=T5Config)
    clip: ClipConfig = field(default_factory=ClipConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    sampling: SamplingConfig = field(default_factory=lambda: QUALITY_SAMPLING)  # the quality preset
    fast: SamplingConfig = field(default_factory=lambda: FAST_SAMPLING)  # the fast preset (needs a distilled LoRA)
    stream: StreamConfig = field(default_factory=StreamConfig)
    # The original's encoder precisions (wan/multitalk.py: the Wan VAE in fp32, CLIP in fp16), whatever the DiT's.
    vae_precision: EncoderPrecision = EncoderPrecision.FP32
    clip_precision: EncoderPrecision = EncoderPrecision.FP16
    # The canvas sizes (h, w) by aspect ratio: 480-class for source/512, 720-class for 720p/1080p.
    buckets_480: dict[float, tuple[int, int]] = field(default_factory=lambda: dict(BUCKETS_480))
    buckets_720: dict[float, tuple[int, int]] = field(default_factory=lambda: dict(BUCKETS_720))

    def sampler(self, preset: SamplingPreset) -> SamplingConfig:
        """The sampling config of a session's preset."""
        return self.fast if preset is SamplingPreset.FAST else self.sampling

    def with_dit(self, values: dict[str, Any], where: str) -> InfiniteTalkConfig:
        """This config with the DiT keyword arguments of a Wan `config.json` (keys starting with "_" are the
        file's bookkeeping; the original passes the rest to WanModel: multitalk.py line 210)."""
        known = {f.name for f in dataclasses.fields(DiTConfig)} | {"model_type", "window_size", "qk_norm"}
        known |= {"cross_attn_norm"}
        given = {key: value for key, value in values.items() if not key.startswith("_")}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"{where} has keys the Wan transformer does not take: {unknown}")
        if given.get("model_type", "i2v") != "i2v":
            raise ValueError(f"{where} is a {given['model_type']!r} model; InfiniteTalk needs Wan's i2v model")
        changes = {key: value for key, value in given.items() if key in {f.name for f in dataclasses.fields(DiTConfig)}}
        if "patch_size" in changes:
            changes["patch_size"] = tuple(changes["patch_size"])
        return dataclasses.replace(self, dit=dataclasses.replace(self.dit, **changes))


WAN_14B = InfiniteTalkConfig(name="wan2.1-i2v-14b")

TINY = InfiniteTalkConfig(
    name="tiny",
    dit=DiTConfig(
        dim=64, ffn_dim=128, freq_dim=32, num_heads=2, num_layers=2, text_dim=32, image_dim=32,
        intermediate_dim=16, output_dim=16, context_tokens=4, audio_blocks=2, audio_channels=16,
    ),
    t5=T5Config(vocab=64, dim=32, dim_attn=32, dim_ffn=64, num_heads=2, num_layers=2, num_buckets=8),
    clip=ClipConfig(dim=32, num_heads=2, num_layers=3, embed_dim=16, text_vocab=40, text_dim=16, text_heads=2,
                    text_layers=1),
    vae=VAEConfig(base_dim=8),
    sampling=SamplingConfig(steps=2),
    buckets_480={0.50: (48, 96), 1.00: (64, 64), 2.00: (96, 48)},
    buckets_720={0.50: (64, 128), 1.00: (96, 96), 2.00: (128, 64)},
)  # fmt: skip

PRESETS = {config.name: config for config in (WAN_14B, TINY)}


def preset(name: str) -> InfiniteTalkConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown infinitetalk preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def bucket(width: int, height: int, table: dict[float, tuple[int, int]]) -> tuple[int, int]:
    """(width, height) of the bucket whose aspect ratio h/w is nearest the portrait's (the first on a tie, as the
    original's sorted key list gives: multitalk.py line 446)."""
    ratio = height / width
    nearest = min(sorted(table), key=lambda key: abs(key - ratio))
    bucket_height, bucket_width = table[nearest]
    return bucket_width, bucket_height


def to_json(config: InfiniteTalkConfig) -> str:
    return json.dumps(dataclasses.asdict(config), indent=2)
