"""The causal video VAE: frames (B, 3, T, H, W) in [-1, 1] ↔ latents (B, C, T, H/s, W/s).

Why it is built this way:
- Spatial work (down/upsampling, most of the FLOPs) is per frame; only the latent-resolution stage mixes
  time, with causal 3D convolutions (a frame sees itself and the frames before it, never after). So
  decoding a video chunk by chunk gives the frames of decoding it whole, provided each chunk starts from
  the right causal state.
- That state is, per causal convolution, the last `kernel - 1` input frames (`DecoderState`). At 720p it
  is tens of MB of activations per convolution, too big for a checkpoint; but it is a pure function of the
  last `VAEConfig.context_frames` latent frames, which are kilobytes. `VAEDecoder.prime` rebuilds it from
  them, so a session's decoder state lives in its anchors as latents and survives a move to another node.
- Norms are per frame (GroupNorm with time folded into the batch): a norm over time would make a frame
  depend on the chunk it was decoded in.
- There is no temporal compression: chunks have any length, so one latent frame per video frame.

Never: statistics across frames, look-ahead in time, or state kept in the module between calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_worker.models.dit.config import VAEConfig

# One cache per causal convolution, in the order the decoder runs them: each (B, C, kernel - 1, h, w).
DecoderState = list[Tensor]


def fold(x: Tensor) -> Tensor:
    """(B, C, T, H, W) → (B T, C, H, W): frames as a batch, for per-frame layers."""
    batch, channels, frames, height, width = x.shape
    return x.transpose(1, 2).reshape(batch * frames, channels, height, width)


def unfold(x: Tensor, batch: int) -> Tensor:
    """(B T, C, H, W) → (B, C, T, H, W)."""
    channels, height, width = x.shape[1:]
    return x.view(batch, -1, channels, height, width).transpose(1, 2)


class CausalConv3d(nn.Module):
    """3x3 in space, `kernel` frames in time, of which all but the current one are in the past."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv3d(in_channels, out_channels, (kernel, 3, 3), padding=(0, 1, 1))

    def forward(self, x: Tensor, cache: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (B, C, T, H, W) → (y (B, C', T, H, W), the cache for the next call (B, C, kernel - 1, H, W)).

        `cache` is the previous call's; None starts a video, padding with copies of its first frame."""
        history = x[:, :, :1].expand(-1, -1, self.kernel - 1, -1, -1) if cache is None else cache
        padded = torch.cat([history, x], dim=2)  # (B, C, kernel - 1 + T, H, W)
        # A copy, not a view: a view would keep the whole chunk's input alive for as long as the cache.
        return self.conv(padded), padded[:, :, padded.shape[2] - (self.kernel - 1) :].clone()


class FrameNorm(nn.GroupNorm):
    """GroupNorm over each frame on its own."""

    def forward(self, x: Tensor) -> Tensor:
        return unfold(super().forward(fold(x)), x.shape[0])


class CausalResBlock(nn.Module):
    def __init__(self, channels: int, groups: int, kernel: int) -> None:
        super().__init__()
        self.norm1 = FrameNorm(groups, channels)
        self.conv1 = CausalConv3d(channels, channels, kernel)
        self.norm2 = FrameNorm(groups, channels)
        self.conv2 = CausalConv3d(channels, channels, kernel)

    def forward(self, x: Tensor, caches: DecoderState | None) -> tuple[Tensor, DecoderState]:
        first, second = (None, None) if caches is None else caches
        h, first = self.conv1(F.silu(self.norm1(x)), first)
        h, second = self.conv2(F.silu(self.norm2(h)), second)
        return x + h, [first, second]


class SpatialResBlock(nn.Module):
    """A per-frame residual block over (N, C, H, W)."""

    def __init__(self, in_channels: int, out_channels: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        out: Tensor = self.skip(x) + h
        return out


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return out


def _channels(config: VAEConfig) -> list[int]:
    return [config.base_channels * multiplier for multiplier in config.channel_multipliers]


class VAEEncoder(nn.Module):
    """Frames → latents (the posterior's mean and log-variance); the reference encoder uses the mean."""

    def __init__(self, config: VAEConfig) -> None:
        super().__init__()
        self.config = config
        channels, groups = _channels(config), config.norm_groups
        self.conv_in = nn.Conv2d(3, channels[0], 3, padding=1)
        levels: list[nn.Module] = []
        previous = channels[0]
        for level, width in enumerate(channels):
            for _ in range(config.blocks_per_level):
                levels.append(SpatialResBlock(previous, width, groups))
                previous = width
            if level < len(channels) - 1:
                levels.append(nn.Conv2d(width, width, 3, stride=2, padding=1))
        self.levels = nn.Sequential(*levels)
        self.mid = nn.ModuleList(
            CausalResBlock(channels[-1], groups, config.temporal_kernel) for _ in range(config.mid_blocks)
        )
        self.norm_out = nn.GroupNorm(groups, channels[-1])
        self.conv_out = nn.Conv2d(channels[-1], 2 * config.latent_channels, 3, padding=1)

    def forward(self, video: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 3, T, H, W) in [-1, 1] → (mean, log-variance), each (B, C, T, H/s, W/s), VAE units."""
        batch = video.shape[0]
        x = self.levels(self.conv_in(fold(video)))  # (B T, C, h, w)
        x = unfold(x, batch)  # (B, C, T, h, w)
        for block in self.mid:
            x, _ = block(x, None)
        moments = self.conv_out(F.silu(self.norm_out(fold(x))))  # (B T, 2 C, h, w)
        mean, log_variance = unfold(moments, batch).chunk(2, dim=1)
        return mean, log_variance

    def encode(self, video: Tensor) -> Tensor:
        """(B, 3, T, H, W) in [-1, 1] → the DiTs' normalised latents (B, C, T, H/s, W/s)."""
        mean, _ = self(video)
        latents: Tensor = (mean - self.config.latent_shift) * self.config.latent_scale
        return latents


class VAEDecoder(nn.Module):
    """Latents → frames, streaming: `temporal` carries a DecoderState from chunk to chunk, `spatial` is per
    frame and can run any number of frames at a time."""

    def __init__(self, config: VAEConfig) -> None:
        super().__init__()
        self.config = config
        channels, groups, kernel = _channels(config), config.norm_groups, config.temporal_kernel
        self.conv_in = CausalConv3d(config.latent_channels, channels[-1], kernel)
        self.mid = nn.ModuleList(CausalResBlock(channels[-1], groups, kernel) for _ in range(config.mid_blocks))
        levels: list[nn.Module] = []
        previous = channels[-1]
        for level in reversed(range(len(channels))):
            for _ in range(config.blocks_per_level):
                levels.append(SpatialResBlock(previous, channels[level], groups))
                previous = channels[level]
            if level > 0:
                levels.append(Upsample(previous))
        self.levels = nn.Sequential(*levels)
        self.norm_out = nn.GroupNorm(groups, channels[0])
        self.conv_out = nn.Conv2d(channels[0], 3, 3, padding=1)

    def temporal(self, latents: Tensor, state: DecoderState | None) -> tuple[Tensor, DecoderState]:
        """Normalised latents (B, C, T, h, w) → features (B, C', T, h, w) and the state after the last frame.

        `state` None starts a video; otherwise it is what the previous chunk (or `prime`) returned."""
        latents = latents / self.config.latent_scale + self.config.latent_shift
        caches: list[Tensor | None] = [None] * (1 + 2 * len(self.mid)) if state is None else list(state)
        x, first = self.conv_in(latents, caches[0])
        out = [first]
        for index, block in enumerate(self.mid):
            block_caches = caches[1 + 2 * index : 3 + 2 * index]
            x, new = block(x, None if block_caches[0] is None else block_caches)
            out.extend(new)
        return x, out

    def spatial(self, features: Tensor) -> Tensor:
        """Per-frame features (N, C', h, w) → pixels (N, 3, H, W), roughly in [-1, 1]."""
        pixels: Tensor = self.conv_out(F.silu(self.norm_out(self.levels(features))))
        return pixels

    def prime(self, context: Tensor) -> DecoderState:
        """The state after decoding `context` (B, C, K, h, w), the latent frames before a chunk, without
        running their (discarded) per-frame stage. With K >= config.context_frames the chunk then decodes
        exactly as it would inside the whole video."""
        _, state = self.temporal(context, None)
        return state

    def forward(self, latents: Tensor, state: DecoderState | None = None) -> tuple[Tensor, DecoderState]:
        """(B, C, T, h, w) → (frames (B, 3, T, H, W), state). Whole chunks at once: for training and tests;
        the decoder module batches `spatial` itself to bound memory."""
        features, state = self.temporal(latents, state)
        return unfold(self.spatial(fold(features)), latents.shape[0]), state
