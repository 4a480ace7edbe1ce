"""The causal video VAE: chunked decoding with carried or re-created causal state gives the frames of
decoding the whole video, with a state whose size does not depend on how much has been decoded."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.models.dit.config import TINY, VAEConfig
from gpu_worker.models.dit.layers import randomise
from gpu_worker.models.dit.vae import VAEDecoder, VAEEncoder

# Two mid blocks at kernel 3: five causal convolutions, ten frames of receptive field.
CONFIG = VAEConfig(
    latent_channels=4, base_channels=8, channel_multipliers=(1, 2), mid_blocks=2, temporal_kernel=3, norm_groups=4
)


@pytest.fixture
def decoder() -> VAEDecoder:
    model = VAEDecoder(CONFIG).eval()
    randomise(model, 11)
    return model


def _latents(frames: int) -> torch.Tensor:
    return torch.randn(1, 4, frames, 6, 5, generator=torch.Generator().manual_seed(2))  # (B, C, T, h, w)


def test_decoding_chunk_by_chunk_with_carried_state_equals_decoding_whole(decoder: VAEDecoder) -> None:
    latents = _latents(17)
    with torch.inference_mode():
        whole, _ = decoder(latents)
        pieces, state, shapes = [], None, []
        for start, end in [(0, 5), (5, 7), (7, 8), (8, 17)]:  # any sizes, including a single frame
            frames, state = decoder(latents[:, :, start:end], state)
            pieces.append(frames)
            shapes.append([tuple(cache.shape) for cache in state])
    assert whole.shape == (1, 3, 17, 12, 10)
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, atol=1e-5, rtol=1e-5)
    assert all(entry == shapes[0] for entry in shapes), "the causal state must not grow with the video"


def test_state_primed_from_the_last_context_frames_equals_the_carried_state(decoder: VAEDecoder) -> None:
    """What a chunk on another node does: re-create the causal state from the anchors' latents."""
    latents = _latents(20)
    context = CONFIG.context_frames
    assert context == 10
    with torch.inference_mode():
        whole, _ = decoder(latents)
        primed = decoder.prime(latents[:, :, 14 - context : 14])
        tail, _ = decoder(latents[:, :, 14:], primed)
        short = decoder.prime(latents[:, :, 14 - context + 1 : 14])
        too_short, _ = decoder(latents[:, :, 14:], short)
    torch.testing.assert_close(tail, whole[:, :, 14:], atol=1e-5, rtol=1e-5)
    # One frame less than the receptive field is not enough: context_frames is the exact requirement.
    assert not torch.allclose(too_short[:, :, :1], whole[:, :, 14:15], atol=1e-4)


def test_a_frame_never_depends_on_later_frames(decoder: VAEDecoder) -> None:
    latents = _latents(8)
    changed = latents.clone()
    changed[:, :, 5:] += 1.0
    with torch.inference_mode():
        before, _ = decoder(latents)
        after, _ = decoder(changed)
    torch.testing.assert_close(after[:, :, :5], before[:, :, :5])
    assert not torch.allclose(after[:, :, 5:], before[:, :, 5:])


def test_encoder_maps_frames_to_latents_at_its_stride() -> None:
    encoder = VAEEncoder(TINY.vae).eval()
    video = torch.rand(2, 3, 3, 64, 96) * 2 - 1
    with torch.inference_mode():
        mean, log_variance = encoder(video)
        latents = encoder.encode(video)
    assert TINY.vae.stride == 8
    assert mean.shape == log_variance.shape == latents.shape == (2, 4, 3, 8, 12)
