"""The causal video VAE with 4x temporal compression: chunked decoding with carried or re-created causal
state gives exactly the frames of decoding the whole video, with a state whose size does not depend on how
much has been decoded; nothing ever depends on a later frame."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.models.dit.config import H200, TINY, VAEConfig
from gpu_worker.models.dit.layers import randomise
from gpu_worker.models.dit.vae import DecoderState, VAEDecoder, VAEEncoder

# Two mid blocks at kernel 3: six causal convolutions at the latent rate, twelve latents of context.
CONFIG = VAEConfig(
    latent_channels=4,
    base_channels=8,
    channel_multipliers=(1, 2),
    temporal_stride=4,
    mid_blocks=2,
    temporal_kernel=3,
    norm_groups=4,
)


@pytest.fixture
def decoder() -> VAEDecoder:
    model = VAEDecoder(CONFIG).eval()
    randomise(model, 11)
    return model


def _latents(frames: int) -> torch.Tensor:
    return torch.randn(1, 4, frames, 6, 5, generator=torch.Generator().manual_seed(2))  # (B, C, T, h, w)


def _state_bytes(state: DecoderState) -> int:
    return sum(cache.numel() * cache.element_size() for cache in state)


@pytest.mark.parametrize("splits", [[5, 7, 8, 17], [1, 2, 3, 4, 17], list(range(1, 18))])
def test_decoding_chunk_by_chunk_with_carried_state_is_bit_identical_to_decoding_whole(
    decoder: VAEDecoder, splits: list[int]
) -> None:
    latents = _latents(17)
    with torch.no_grad():
        whole, _ = decoder(latents)
        pieces, state, sizes, start = [], None, [], 0
        for end in splits:  # any latent counts, down to one latent (4 frames) at a time
            frames, state = decoder(latents[:, :, start:end], state)
            pieces.append(frames)
            sizes.append(_state_bytes(state))
            start = end
    assert whole.shape == (1, 3, 4 * 17, 12, 10)
    assert torch.equal(torch.cat(pieces, dim=2), whole)
    assert len(set(sizes)) == 1, f"the causal state must not grow with the video: {sizes} bytes"


def test_state_primed_from_the_last_context_frames_equals_the_carried_state(decoder: VAEDecoder) -> None:
    """What a chunk on another node does: re-create the causal state from the anchors' latents."""
    latents = _latents(20)
    context = CONFIG.context_frames
    assert context == 12
    with torch.no_grad():
        _, carried = decoder(latents[:, :, :15])
        primed = decoder.prime(latents[:, :, 15 - context : 15])
        rest, _ = decoder(latents[:, :, 15:], primed)
        short = decoder.prime(latents[:, :, 15 - context + 1 : 15])
        too_short, _ = decoder(latents[:, :, 15:], short)
        full, _ = decoder(latents)
    assert all(torch.equal(a, b) for a, b in zip(primed, carried, strict=True))
    assert torch.equal(rest, full[:, :, 4 * 15 :])
    # One latent less than the receptive field is not enough: context_frames is the exact requirement.
    assert not torch.allclose(too_short[:, :, :4], full[:, :, 60:64], atol=1e-4)


def test_a_frame_never_depends_on_later_latents(decoder: VAEDecoder) -> None:
    latents = _latents(8)
    changed = latents.clone()
    changed[:, :, 5:] += 1.0
    with torch.no_grad():
        before, _ = decoder(latents)
        after, _ = decoder(changed)
    assert torch.equal(after[:, :, :20], before[:, :, :20])  # latent j decodes frames [4 j, 4 j + 4)
    assert not torch.allclose(after[:, :, 20:24], before[:, :, 20:24])


def test_encoder_compresses_time_4x_causally_at_its_spatial_stride() -> None:
    encoder = VAEEncoder(TINY.vae).eval()
    randomise(encoder, 3)
    video = torch.rand(2, 3, 12, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    changed = video.clone()
    changed[:, :, 6:] = -video[:, :, 6:]  # frames 6.. belong to latents 1 and 2
    with torch.no_grad():
        mean, log_variance = encoder(video)
        latents = encoder.encode(video)
        other = encoder.encode(changed)
        ragged = encoder.encode(video[:, :, :10])  # padded with copies of frame 9
    assert TINY.vae.stride == 8 and TINY.vae.temporal_stride == 4
    assert mean.shape == log_variance.shape == latents.shape == (2, 4, 3, 8, 12)
    assert torch.equal(other[:, :, :1], latents[:, :, :1])
    assert not torch.allclose(other[:, :, 1:2], latents[:, :, 1:2])
    assert ragged.shape[2] == 3 and torch.equal(ragged[:, :, :2], latents[:, :, :2])


def test_a_portrait_is_encoded_as_a_still_four_frame_video() -> None:
    encoder = VAEEncoder(TINY.vae).eval()
    randomise(encoder, 3)
    image = torch.rand(1, 3, 1, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        alone = encoder.encode(image)
        still = encoder.encode(image.expand(-1, -1, 4, -1, -1))
    assert alone.shape == (1, 4, 1, 4, 4) and torch.equal(alone, still)


def test_the_h200_decoder_costs_well_under_two_tflop_per_720p_frame() -> None:
    """Counted on the meta device (no memory, no time): 8 latents → 32 frames of 1280x736."""
    from torch.utils.flop_counter import FlopCounterMode

    config = H200.vae
    with torch.device("meta"):
        model = VAEDecoder(config)
        latents = torch.zeros(1, config.latent_channels, 8, 736 // config.stride, 1280 // config.stride)
        with FlopCounterMode(display=False) as counter:
            frames, _ = model(latents)
    assert frames.shape[2] == 32
    assert counter.get_total_flops() / 32 < 1.3e12


def test_any_run_of_frames_decodes_as_it_does_among_all_of_them(decoder: VAEDecoder) -> None:
    """Depth to time per weight block: the features of frames [a, b) made alone are those frames of the whole
    chunk's, bit for bit (what lets a sequence-parallel rank make only its own frames)."""
    latents = _latents(5)
    with torch.no_grad():
        whole, _ = decoder.temporal(latents, None)
        inputs, _ = decoder.temporal_inputs(latents, None)
        for start, end in [(0, 20), (3, 9), (5, 6), (17, 20), (8, 12)]:
            assert torch.equal(decoder.frame_features(inputs, range(start, end)), whole[:, :, start:end])


def test_priming_costs_the_receptive_fields_triangle_not_four_latents() -> None:
    """Counted on the meta device at 720p (h200): priming from 4 latents runs each causal convolution only on the
    outputs a later cache reads: under half of one latent's decode at the latent rate and depth to time, where
    decoding the 4 latents' latent-rate stage whole cost more than a latent."""
    from torch.utils.flop_counter import FlopCounterMode

    config = H200.vae
    with torch.device("meta"):
        model = VAEDecoder(config)
        context = torch.zeros(1, config.latent_channels, config.context_frames, 92, 160)
        one = torch.zeros(1, config.latent_channels, 1, 92, 160)
        with FlopCounterMode(display=False) as priming, torch.no_grad():
            state = model.prime(context)
        with FlopCounterMode(display=False) as latent, torch.no_grad():
            model.temporal(one, state)
        with FlopCounterMode(display=False) as whole, torch.no_grad():
            model._prime_from_start(context)
    assert priming.get_total_flops() < 0.55 * latent.get_total_flops() < whole.get_total_flops()
