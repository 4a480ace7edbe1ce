"""The causal video VAE: frames (B, 3, T, H, W) in [-1, 1] ↔ latents (B, C, T/4, H/s, W/s).

Why it is built this way:
- Time is compressed 4x (`VAEConfig.temporal_stride`): latent frame j covers video frames [4j, 4j + 4).
  The DiTs then see a quarter of the tokens, and every per-latent cost is shared by four output frames.
- All mixing in time happens at the latent resolution, where it is cheap; everything at higher resolution
  is per frame. The encoder compresses time with causal stride-2 convolutions after its spatial levels;
  the decoder expands it with one causal convolution that writes 4 C channels per latent and reshapes
  them into 4 frames of C ("depth to time"), then upsamples each frame on its own. (Wan's and LTX's VAEs
  mix time at every resolution; keeping it at the latent resolution makes the streaming state small and
  its exact context a handful of latents, at the price of no temporal filtering above 1/s resolution.)
- Causal: a latent sees its own frames and earlier ones, a frame its own latent and earlier ones, never a
  later one. The start of a video has no past: each causal convolution replicates its first input into it.
  A video whose length is not a multiple of 4 is padded at its end by repeating its last frame (a lone
  portrait is encoded as 4 copies of itself, one latent).
- Depth to time runs by weight block (`frame_features`: the k-th frame of every latent is one convolution with
  the k-th block of weights), so a frame's features do not depend on which other frames are decoded with it;
  a sequence-parallel rank makes only its own frames, exactly.
- Streaming: the decoder's causal state (`DecoderState`) is, per causal convolution, its last
  `kernel - 1` inputs, all at the latent rate; its size does not depend on how much was decoded. Decoding
  latents chunk by chunk while carrying the state gives exactly the frames of decoding them all at once.
  The state is a pure function of the last `VAEConfig.context_frames` latents (4 in the h200 preset: under
  1 MB as low-resolution anchors at 720p, where the state is 45 MB of activations in bf16, 90 in fp32):
  `VAEDecoder.prime` rebuilds it from them, so a session's decoder state lives in its anchors as latents
  and survives a move to another node.
- Norms are per frame (GroupNorm with time folded into the batch): a norm over time would make a frame
  depend on the chunk it was decoded in.
- Cheap at 720p: the decoder's full-resolution level is narrow (64 channels in the h200 preset) and each
  upsampling convolution narrows to the next level's width, so most FLOPs run at low resolution.

Never: statistics across frames, look-ahead in time, or state kept in the module between calls.
"""

from __future__ import annotations

from typing import cast

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
    """3x3 in space, `kernel` frames in time ending at the current one (or, with stride 2, at the later of
    the two frames an output covers)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        if kernel < stride:
            raise ValueError(f"a causal convolution of stride {stride} needs a temporal kernel of {stride} or more")
        self.kernel, self.stride = kernel, stride
        self.conv = nn.Conv3d(in_channels, out_channels, (kernel, 3, 3), stride=(stride, 1, 1), padding=(0, 1, 1))

    def history(self, x: Tensor, cache: Tensor | None) -> Tensor:
        """The inputs before x: the cache, or for the start of a video its first frame replicated."""
        if cache is not None:
            return cache
        return x[:, :, :1].expand(-1, -1, self.kernel - self.stride, -1, -1)

    def forward(self, x: Tensor, cache: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (B, C, T, H, W) → (y (B, C', T / stride, H, W), the cache for the next call (B, C, kernel - 1, H, W)).

        `cache` is the previous call's (stride 1 only); None starts a video."""
        padded = torch.cat([self.history(x, cache), x], dim=2)
        return self.conv(padded), self.next_cache(padded)

    def next_cache(self, padded: Tensor) -> Tensor:
        """The last kernel - 1 inputs. A copy, not a view: a view would keep the whole chunk's input alive."""
        return padded[:, :, padded.shape[2] - (self.kernel - 1) :].clone()


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

    def prime(self, x: Tensor, history: int) -> tuple[Tensor, DecoderState]:
        """The block on frames x (B, C, T, h, w) without history ("valid"): its output on the last T - 2 history
        frames, which both convolutions reach, and the caches it leaves (see `VAEDecoder.prime`)."""
        first = F.silu(self.norm1(x))
        second = F.silu(self.norm2(self.conv1.conv(first)))
        return x[:, :, 2 * history :] + self.conv2.conv(second), [
            self.conv1.next_cache(first),
            self.conv2.next_cache(second),
        ]


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
    """2x nearest, then a 3x3 convolution that narrows to the next (higher-resolution) level's width."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return out


def _channels(config: VAEConfig) -> list[int]:
    return [config.base_channels * multiplier for multiplier in config.channel_multipliers]


def _temporal_halvings(config: VAEConfig) -> int:
    stride = config.temporal_stride
    if stride < 1 or stride & (stride - 1):
        raise ValueError(f"VAEConfig.temporal_stride must be a power of two, got {stride}")
    return stride.bit_length() - 1


def pad_to_stride(video: Tensor, stride: int) -> Tensor:
    """(B, C, T, H, W) with T rounded up to a multiple of `stride` by repeating the last frame (causal:
    the padding changes no latent before the last)."""
    missing = -video.shape[2] % stride
    if not missing:
        return video
    return torch.cat([video, video[:, :, -1:].expand(-1, -1, missing, -1, -1)], dim=2)


class VAEEncoder(nn.Module):
    """Frames → latents (the posterior's mean and log-variance); the reference encoder uses the mean."""

    def __init__(self, config: VAEConfig) -> None:
        super().__init__()
        self.config = config
        channels, groups, kernel = _channels(config), config.norm_groups, config.temporal_kernel
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
        # Time is compressed at the latent resolution: each causal stride-2 convolution halves the frame rate.
        self.downsample_time = nn.ModuleList(
            CausalConv3d(channels[-1], channels[-1], max(kernel, 2), stride=2)
            for _ in range(_temporal_halvings(config))
        )
        self.mid = nn.ModuleList(CausalResBlock(channels[-1], groups, kernel) for _ in range(config.mid_blocks))
        self.norm_out = nn.GroupNorm(groups, channels[-1])
        self.conv_out = nn.Conv2d(channels[-1], 2 * config.latent_channels, 3, padding=1)

    def forward(self, video: Tensor) -> tuple[Tensor, Tensor]:
        """(B, 3, T, H, W) in [-1, 1] → (mean, log-variance), each (B, C, ceil(T / 4), H/s, W/s), VAE units."""
        batch = video.shape[0]
        video = pad_to_stride(video, self.config.temporal_stride)
        x = unfold(self.levels(self.conv_in(fold(video))), batch)  # (B, C, T, h, w)
        for downsample in self.downsample_time:
            x, _ = downsample(F.silu(x), None)  # (B, C, T / 2, h, w)
        for block in self.mid:
            x, _ = block(x, None)
        moments = self.conv_out(F.silu(self.norm_out(fold(x))))  # (B T', 2 C, h, w)
        mean, log_variance = unfold(moments, batch).chunk(2, dim=1)
        return mean, log_variance

    def encode(self, video: Tensor) -> Tensor:
        """(B, 3, T, H, W) in [-1, 1] → the DiTs' normalised latents (B, C, ceil(T / 4), H/s, W/s)."""
        mean, _ = self(video)
        latents: Tensor = (mean - self.config.latent_shift) * self.config.latent_scale
        return latents


class VAEDecoder(nn.Module):
    """Latents → frames, streaming: `temporal` carries a DecoderState from chunk to chunk and expands each
    latent into `temporal_stride` frames of features; `spatial` is per frame and can run any number of
    frames at a time."""

    def __init__(self, config: VAEConfig) -> None:
        super().__init__()
        self.config = config
        channels, groups, kernel = _channels(config), config.norm_groups, config.temporal_kernel
        _temporal_halvings(config)
        self.conv_in = CausalConv3d(config.latent_channels, channels[-1], kernel)
        self.mid = nn.ModuleList(CausalResBlock(channels[-1], groups, kernel) for _ in range(config.mid_blocks))
        self.norm_time = FrameNorm(groups, channels[-1])
        # Depth to time: stride x C channels per latent, reshaped into stride frames of C.
        self.to_time = CausalConv3d(channels[-1], config.temporal_stride * channels[-1], kernel)
        levels: list[nn.Module] = []
        previous = channels[-1]
        for level in reversed(range(len(channels))):
            for _ in range(config.blocks_per_level):
                levels.append(SpatialResBlock(previous, channels[level], groups))
                previous = channels[level]
            if level > 0:
                levels.append(Upsample(previous, channels[level - 1]))
                previous = channels[level - 1]
        self.levels = nn.Sequential(*levels)
        self.norm_out = nn.GroupNorm(groups, channels[0])
        self.conv_out = nn.Conv2d(channels[0], 3, 3, padding=1)

    def _latent_rate(self, latents: Tensor, caches: list[Tensor | None]) -> tuple[Tensor, DecoderState]:
        """conv_in and the mid blocks on normalised latents, from their caches (all but to_time's)."""
        latents = latents / self.config.latent_scale + self.config.latent_shift
        x, first = self.conv_in(latents, caches[0])
        state = [first]
        for index, block in enumerate(self.mid):
            block_caches = caches[1 + 2 * index : 3 + 2 * index]
            x, new = block(x, None if block_caches[0] is None else block_caches)
            state.extend(new)
        return F.silu(self.norm_time(x)), state

    def _caches(self, state: DecoderState | None) -> list[Tensor | None]:
        count = 2 + 2 * len(self.mid)
        if state is not None and len(state) != count:
            raise ValueError(f"a decoder state of this VAE has {count} caches, got {len(state)}")
        return [None] * count if state is None else list(state)

    def temporal(self, latents: Tensor, state: DecoderState | None) -> tuple[Tensor, DecoderState]:
        """Normalised latents (B, C, T, h, w) → features (B, C', stride T, h, w) and the state after them.

        `state` None starts a video; otherwise it is what the previous chunk (or `prime`) returned."""
        inputs, state = self.temporal_inputs(latents, state)
        return self.frame_features(inputs, range(self.config.temporal_stride * latents.shape[2])), state

    def temporal_inputs(self, latents: Tensor, state: DecoderState | None) -> tuple[Tensor, DecoderState]:
        """The latent-rate part of `temporal`: the depth-to-time convolution's input for `latents`, its history
        first (B, C', kernel - 1 + T, h, w), and the state after them. `frame_features` makes frames from it."""
        caches = self._caches(state)
        x, new_state = self._latent_rate(latents, caches)
        inputs = torch.cat([self.to_time.history(x, caches[-1]), x], dim=2)
        return inputs, [*new_state, self.to_time.next_cache(inputs)]

    def frame_features(self, inputs: Tensor, frames: range) -> Tensor:
        """Features (B, C', len(frames), h, w) of the consecutive video frames `frames` (0: the first latent's
        first frame).

        Depth to time by weight block: frame stride j + k is channel block k of the causal convolution at
        latent j, so each block k is one convolution with its own C' output channels over the latents whose
        frame k is wanted, and the blocks' frames are then interleaved. A frame's features therefore do not
        depend on which other frames are decoded with it (a convolution over more or fewer latents computes each
        output the same way; over more output channels it may not), so a rank of a sequence-parallel decode
        that makes only its own frames gets the one-rank frames exactly, and skips the other blocks (3/4 of
        this convolution, the temporal stage's largest part, for a rank with a quarter of a latent's frames)."""
        stride, kernel = self.config.temporal_stride, self.to_time.kernel
        width = self.to_time.conv.out_channels // stride
        weight, bias = self.to_time.conv.weight, self.to_time.conv.bias
        batch, _, _, height, columns = inputs.shape
        out = inputs.new_empty(batch, width, len(frames), height, columns)
        for block in range(stride):
            first = -(-(frames.start - block) // stride)  # the first latent whose frame `block` is wanted
            last = (frames.stop - 1 - block) // stride
            if last < first:
                continue
            channels = slice(block * width, (block + 1) * width)
            window = inputs[:, :, first : last + kernel]  # (B, C', kernel - 1 + n, h, w)
            made = F.conv3d(window, weight[channels], None if bias is None else bias[channels], padding=(0, 1, 1))
            out[:, :, stride * first + block - frames.start :: stride] = made
        return out

    def spatial(self, features: Tensor) -> Tensor:
        """Per-frame features (N, C', h, w) → pixels (N, 3, H, W), roughly in [-1, 1]."""
        pixels: Tensor = self.conv_out(F.silu(self.norm_out(self.levels(features))))
        return pixels

    def prime(self, context: Tensor) -> DecoderState:
        """The state after decoding `context` (B, C, K, h, w), the latent frames before a chunk, without
        producing their (discarded) frames. With K >= config.context_frames the chunk then decodes exactly
        as it would inside the whole video.

        Only the last `context_frames` latents matter then, and of each causal convolution only the outputs a
        later cache reads: each runs without history ("valid", kernel - 1 frames shorter than its input), so
        priming costs the receptive field's triangle (with kernel 2 and one mid block: 3, 2 and 1 latent-rate
        convolutions of the 4 latents' worth the full run would do), about a third of one latent's decode.
        With fewer latents the video's start lies within the context, and the caches are its own start."""
        needed = self.config.context_frames
        if context.shape[2] < needed:
            return self._prime_from_start(context)
        history = self.config.temporal_kernel - 1
        latents = context[:, :, context.shape[2] - needed :] / self.config.latent_scale + self.config.latent_shift
        state = [self.conv_in.next_cache(latents)]
        x = self.conv_in.conv(latents)  # (B, C', K - history, h, w)
        for block in cast("list[CausalResBlock]", list(self.mid)):
            x, caches = block.prime(x, history)
            state.extend(caches)
        return [*state, self.to_time.next_cache(F.silu(self.norm_time(x)))]

    def _prime_from_start(self, context: Tensor) -> DecoderState:
        """`prime` on fewer latents than the receptive field: the whole decode of `context` from the video's start."""
        caches = self._caches(None)
        x, state = self._latent_rate(context, caches)
        return [*state, self.to_time.next_cache(torch.cat([self.to_time.history(x, None), x], dim=2))]

    def forward(self, latents: Tensor, state: DecoderState | None = None) -> tuple[Tensor, DecoderState]:
        """(B, C, T, h, w) → (frames (B, 3, stride T, H, W), state). Whole chunks at once: for training and
        tests; the decoder module batches `spatial` itself to bound memory."""
        features, state = self.temporal(latents, state)
        return unfold(self.spatial(fold(features)), latents.shape[0]), state


class SpatialStage(nn.Module):
    """A decoder's per-frame stage (`VAEDecoder.spatial`) as a module of its own: the unit the node compiles
    (gpu_worker/compiled.py, `MONOLOGUE_COMPILE_DECODER`), its parameters the decoder's."""

    def __init__(self, decoder: VAEDecoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, features: Tensor) -> Tensor:
        return self.decoder.spatial(features)
