"""The Wan VAE (diffusers' AutoencoderKLWan) as a stream: one causal cache kept across chunks.

diffusers' `AutoencoderKLWan._decode` clears its feature cache on every call and decodes the latents one at a
time (autoencoder_kl_wan.py `_decode`): the first latent of a call is taken as a video's first (its temporal
upsamplers skip it, "Rep", so it makes 1 frame) and every later one makes 4. Decoding chunk by chunk with it
would restart the video at every chunk (wrong frame counts, a seam of cold caches). `DecodeStream` drives the
same decoder with the same one-latent calls and a cache it keeps, so decoding a timeline in pieces is decoding it
whole, bit for bit (test_vae.py).

The cache is activations (the last two inputs of every causal convolution: hundreds of MB at 480p), so it is not
stored: it is rebuilt from latents. The decoder's causal receptive field is `StreamConfig.decoder_context` (38)
latents: a fresh stream fed the 38 latents before a point holds, after them, exactly the cache a decode from
the video's start holds there (measured, test_vae.py), whatever came before. Anchors carry those latents.

Under sequence parallelism (`decode_share`) each rank of the group decodes a contiguous run of a chunk's latents, its
stream primed on the up to `decoder_context` latents before the run (the chunk's context, then the chunk's own
latents before the run; fewer reach back to the one-process stream's start, so the priming is that decode's own
start): by the receptive field, its cache is then the one-process cache there, and every latent goes through the
decoder in the one-process call shapes (one latent a call, the post-quant convolution over the whole context and the
whole chunk as one process makes it), so the frames are the one-process frames bit for bit. The ranks gather them
(roles.py). A rank pays the priming in full: the split shortens a chunk's decode from context + T latents to
context + T / P, so the node splits only where it keeps no decode states (`StreamStates`, from which one stream
decodes the T latents alone: fewer calls than a split rank's at any P).

The VAE runs in its own dtype (`InfiniteTalkConfig.vae_precision`: fp32 as the original's, autocast off) inside a
bf16 module (`runtime.own_precision`).

Latents are normalised as the original's WanVAE does (`wan/modules/vae.py`: (mu - mean) / std per channel,
with the means and deviations diffusers keeps in AutoencoderKLWan's config).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan, WanCausalConv3d
from torch import Tensor

from gpu_worker.distributed.sequence import SPGroup, split_frames
from gpu_worker.lru import LRU
from gpu_worker.models.infinitetalk.runtime import own_precision


def _statistics(vae: AutoencoderKLWan, like: Tensor) -> tuple[Tensor, Tensor]:
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=torch.float32).view(shape)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=torch.float32).view(shape)
    return mean, std


def encode(vae: AutoencoderKLWan, video: Tensor) -> Tensor:
    """video (B, 3, 1 + 4k, H, W) in [-1, 1] → normalised latents (B, z, 1 + k, H/8, W/8) float32: the posterior's
    mean, as the original's encode returns mu (vae.py WanVAE_.encode)."""
    with own_precision(vae, video.device):
        mu = vae.encode(video.to(vae.dtype)).latent_dist.mode().float()
    mean, std = _statistics(vae, mu)
    return (mu - mean) / std


class DecodeStream:
    """One causal decode: `decode` latents in as many calls as you like, `prime` to rebuild the cache."""

    def __init__(self, vae: AutoencoderKLWan) -> None:
        self.vae = vae
        self.cache: list[object] = [None] * sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules())
        self.latents = 0  # latents seen: the first one is the video's first frame

    def features(self, latents: Tensor) -> Tensor:
        """Normalised latents (B, z, T, h, w) → the decoder's inputs (B, z, T, h, w): the post-quant convolution,
        over all T in one call (as `decode` and `prime` make it)."""
        mean, std = _statistics(self.vae, latents)
        raw = (latents.float() * std + mean).to(self.vae.dtype)
        with own_precision(self.vae, raw.device):
            features: Tensor = self.vae.post_quant_conv(raw)
        return features

    def feed(self, features: Tensor, keep: bool) -> list[Tensor]:
        """Run `features` through the decoder one latent a call, the cache carried; their frames if `keep`."""
        outputs = []
        for index in range(features.shape[2]):
            with own_precision(self.vae, features.device):
                frames = self.vae.decoder(
                    features[:, :, index : index + 1],
                    feat_cache=self.cache,
                    feat_idx=[0],
                    first_chunk=self.latents == 0,
                )
            self.latents += 1
            if keep:
                outputs.append(frames)
        return outputs

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents (B, z, T, h, w) → frames (B, 3, F, H, W) in [-1, 1], F = 4 T (1 + 4 (T - 1) if
        they start the stream)."""
        return _frames(self.feed(self.features(latents), keep=True))

    def prime(self, latents: Tensor) -> None:
        """Run `latents` through the cache without keeping their frames (the stream's context)."""
        if latents.shape[2]:
            self.feed(self.features(latents), keep=False)


class StreamStates:
    """Decode streams' causal caches kept on the node after a chunk, by the latents that end the stream (by content):
    a later chunk primed on those latents (N(k+1), then I(k), both on N(k)'s tail context) starts from a copy instead
    of priming them again, 38 latent calls for the chunk's own 18. A primed cache is exactly the whole decode's (the
    receptive field, above), so a hit and a miss give the same frames bit for bit; a node without the state (a resume
    elsewhere, an eviction) primes. `capacity` states, the least recently used dropped; each is the activations of the
    decoder's causal convolutions (3.8 GB at 480p in fp32, 8.7 at 720p), so 0 turns it off."""

    def __init__(self, capacity: int) -> None:
        self.hits = self.misses = 0
        self._kept: LRU[str, tuple[list[object], int]] = LRU(capacity)

    def start(self, vae: AutoencoderKLWan, context: Tensor | None) -> DecodeStream:
        """A stream ready to decode the latents after `context` (B, z, K, h, w): a kept state's copy, else primed."""
        stream = DecodeStream(vae)
        if context is None:
            return stream
        kept = self._kept.get(_content_key(context))
        if kept is None:
            stream.prime(context)
            self.misses += 1
        else:
            cache, stream.latents = kept
            stream.cache = [entry.clone() if isinstance(entry, Tensor) else entry for entry in cache]
            self.hits += 1
        return stream

    def keep(self, stream: DecodeStream, last: Tensor | np.ndarray) -> None:
        """Keep `stream`'s state (it is done with), known by `last`, the up to `decoder_context` latents it ended with
        (z, K, h, w): what the tail anchor's context holds, and the next chunk primes on."""
        if self._kept.capacity > 0:
            self._kept.put(_content_key(last), (stream.cache, stream.latents))

    @property
    def capacity(self) -> int:
        return self._kept.capacity

    def __len__(self) -> int:
        return len(self._kept)


def _content_key(latents: Tensor | np.ndarray) -> str:
    """The latents' values (float32, a batch of one or none) as a key."""
    data = latents.detach().to("cpu", torch.float32).numpy() if isinstance(latents, Tensor) else latents
    data = np.ascontiguousarray(data, dtype=np.float32)
    return f"{tuple(data.shape[-4:])}:{hashlib.sha256(data.tobytes()).hexdigest()}"


def _frames(outputs: list[Tensor]) -> Tensor:
    return torch.cat(outputs, dim=2).float().clamp(-1.0, 1.0)


def frames_made(first: int, count: int, stride: int) -> int:
    """Frames latents [first, first + count) of a decode stream make (the stream's first latent makes one)."""
    return stride * count - (stride - 1 if first == 0 and count else 0)


def decode_share(
    vae: AutoencoderKLWan, context: Tensor | None, latents: Tensor, stride: int, primed: int, sp: SPGroup
) -> tuple[Tensor, Sequence[int]]:
    """This rank's share of `DecodeStream(vae)` primed on `context` (B, z, K, h, w) then decoding `latents` (B, z, T,
    h, w): (its frames (B, 3, F_rank, H, W), every rank's frame count). Its run of latents (`split_frames`) is decoded
    after the up to `primed` (the decoder's receptive field) stream latents before it (see the module docstring)."""
    known = 0 if context is None else context.shape[2]
    ranges = split_frames(latents.shape[2], sp.degree)
    counts = [frames_made(known + start, end - start, stride) for start, end in ranges]
    start, end = ranges[sp.rank]
    stream = DecodeStream(vae)
    if start == end:
        height, width = (size * stream.vae.config.scale_factor_spatial for size in latents.shape[-2:])
        return latents.new_empty((latents.shape[0], 3, 0, height, width)), counts
    parts = [stream.features(context)] if context is not None else []
    features = torch.cat([*parts, stream.features(latents)], dim=2)  # the one-process inputs, whole stream
    stream.feed(features[:, :, max(0, known + start - primed) : known + start], keep=False)
    return _frames(stream.feed(features[:, :, known + start : known + end], keep=True)), counts
