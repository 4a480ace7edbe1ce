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

Latents are normalised as the original's WanVAE does (`wan/modules/vae.py`: (mu - mean) / std per channel,
with the means and deviations diffusers keeps in AutoencoderKLWan's config).
"""

from __future__ import annotations

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan, WanCausalConv3d
from torch import Tensor


def _statistics(vae: AutoencoderKLWan, like: Tensor) -> tuple[Tensor, Tensor]:
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=torch.float32).view(shape)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=torch.float32).view(shape)
    return mean, std


def encode(vae: AutoencoderKLWan, video: Tensor) -> Tensor:
    """video (B, 3, 1 + 4k, H, W) in [-1, 1] → normalised latents (B, z, 1 + k, H/8, W/8) float32: the posterior's
    mean, as the original's encode returns mu (vae.py WanVAE_.encode)."""
    mu = vae.encode(video.to(vae.dtype)).latent_dist.mode().float()
    mean, std = _statistics(vae, mu)
    return (mu - mean) / std


class DecodeStream:
    """One causal decode: `decode` latents in as many calls as you like, `prime` to rebuild the cache."""

    def __init__(self, vae: AutoencoderKLWan) -> None:
        self.vae = vae
        self.cache: list[object] = [None] * sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules())
        self.latents = 0  # latents seen: the first one is the video's first frame

    def _step(self, latents: Tensor, keep: bool) -> list[Tensor]:
        mean, std = _statistics(self.vae, latents)
        raw = (latents.float() * std + mean).to(self.vae.dtype)
        x = self.vae.post_quant_conv(raw)
        outputs = []
        for index in range(x.shape[2]):
            frames = self.vae.decoder(
                x[:, :, index : index + 1], feat_cache=self.cache, feat_idx=[0], first_chunk=self.latents == 0
            )
            self.latents += 1
            if keep:
                outputs.append(frames)
        return outputs

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents (B, z, T, h, w) → frames (B, 3, F, H, W) in [-1, 1], F = 4 T (1 + 4 (T - 1) if
        they start the stream)."""
        return torch.cat(self._step(latents, keep=True), dim=2).float().clamp(-1.0, 1.0)

    def prime(self, latents: Tensor) -> None:
        """Run `latents` through the cache without keeping their frames (the stream's context)."""
        if latents.shape[2]:
            self._step(latents, keep=False)
