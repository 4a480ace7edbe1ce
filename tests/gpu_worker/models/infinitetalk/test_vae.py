"""The Wan VAE decodes a timeline chunk by chunk with one causal cache exactly as diffusers decodes it whole, and
a cache rebuilt from the 38 latents before a chunk (an anchor's context) is that cache, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.vae import DecodeStream

LATENTS = 50


@pytest.fixture(scope="module")
def decoded(tiny_weights: Path) -> tuple[object, torch.Tensor, torch.Tensor]:
    vae = InfiniteTalkWeights(TINY, Locations.under(tiny_weights)).build("vae")
    latents = torch.randn(1, 16, LATENTS, 4, 4, generator=torch.Generator().manual_seed(5))  # normalised
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        whole = vae.decode(latents * std + mean).sample  # diffusers' own decode of the whole timeline
    return vae, latents, whole


def test_chunked_decode_with_one_cache_is_diffusers_whole_decode_bit_for_bit(decoded: tuple) -> None:  # type: ignore[type-arg]
    vae, latents, whole = decoded
    assert whole.shape[2] == 1 + 4 * (LATENTS - 1)  # the first latent is one frame
    stream = DecodeStream(vae)
    with torch.no_grad():
        pieces = [stream.decode(latents[:, :, a:b]) for a, b in ((0, 11), (11, 12), (12, 30), (30, LATENTS))]
    assert [p.shape[2] for p in pieces] == [41, 4, 72, 80]
    assert torch.equal(torch.cat(pieces, dim=2), whole)
    with torch.no_grad():  # naive: every call a new video, as AutoencoderKLWan.decode is
        naive = vae.decode(latents[:, :, 11:12]).sample
    assert naive.shape[2] == 1


@pytest.mark.parametrize("context", [38, 46])
def test_a_cache_primed_on_38_latents_is_the_cache_of_the_whole_decode(decoded: tuple, context: int) -> None:  # type: ignore[type-arg]
    vae, latents, whole = decoded
    start = LATENTS - 4
    stream = DecodeStream(vae)
    with torch.no_grad():
        stream.prime(latents[:, :, start - context : start])
        chunk = stream.decode(latents[:, :, start:])
    assert torch.equal(chunk, whole[:, :, 1 + 4 * (start - 1) :])


def test_fewer_latents_than_the_receptive_field_do_not_rebuild_it(decoded: tuple) -> None:  # type: ignore[type-arg]
    """Why StreamConfig.decoder_context is 38: with 37 the cache still remembers where the priming began."""
    vae, latents, whole = decoded
    start = LATENTS - 4
    stream = DecodeStream(vae)
    with torch.no_grad():
        stream.prime(latents[:, :, start - 37 : start])
        chunk = stream.decode(latents[:, :, start:])
    assert not torch.equal(chunk, whole[:, :, 1 + 4 * (start - 1) :])
    assert TINY.stream.decoder_context == 38
