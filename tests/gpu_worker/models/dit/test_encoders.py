"""The conditioning encoders: the log-mel front end (our own filterbank), per-frame pooling, and the
byte-level text encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_worker.models.dit.audio_encoder import AudioEncoder, LogMel, frame_pooling, mel_filterbank, mel_to_hz
from gpu_worker.models.dit.config import TINY, AudioConfig
from gpu_worker.models.dit.text_encoder import TextEncoder, byte_tokens


def test_mel_filters_are_unit_area_triangles_in_rising_order() -> None:
    bank = mel_filterbank(n_fft=400, n_mels=40, sample_rate=16_000, f_min=0.0, f_max=8_000.0)
    assert bank.shape == (40, 201)
    assert bool((bank >= 0).all())
    peaks = bank.argmax(dim=1)
    assert bool((peaks[1:] >= peaks[:-1]).all()) and int(peaks[-1]) > 150
    # Slaney normalisation: each triangle integrates to ~1 over Hz (bins are 40 Hz apart).
    areas = bank.sum(dim=1) * 40.0
    assert torch.allclose(areas[5:], torch.ones_like(areas[5:]), atol=0.08)


def test_a_pure_tone_lights_the_filter_centred_nearest_to_it() -> None:
    config = AudioConfig(n_mels=40)
    mel = LogMel(config)
    tone = torch.sin(2 * torch.pi * 1000.0 * torch.arange(16_000) / 16_000)[None]
    features = mel(tone)  # (1, M, 40)
    assert features.shape == (1, 16_000 // 160 + 1, 40)
    centres = mel_to_hz(torch.linspace(0.0, 2595.0 * np.log10(1 + 8000 / 700), 42, dtype=torch.float64))[1:-1]
    loudest = int(features[0, 50].argmax())
    assert loudest == int((centres - 1000.0).abs().argmin())


def test_log_mel_of_a_frame_does_not_depend_on_the_rest_of_the_clip() -> None:
    """A fixed floor and scale (no per-clip normalisation): louder audio elsewhere changes nothing here."""
    mel = LogMel(AudioConfig(n_mels=32))
    quiet = 0.01 * torch.randn(1, 8_000, generator=torch.Generator().manual_seed(0))
    loud = quiet.clone()
    loud[:, 6_000:] *= 50.0
    torch.testing.assert_close(mel(loud)[:, :30], mel(quiet)[:, :30])


@pytest.mark.parametrize(("fps", "counts"), [(25, {4}), (30, {3, 4}), (200, {1})])
def test_frame_pooling_averages_the_mel_frames_of_each_video_frame(fps: int, counts: set[int]) -> None:
    frames, rate, hop = 12, 16_000, 160
    edges = np.array([frame * rate // fps for frame in range(frames + 1)])
    mel_frames = edges[-1] // hop + 1
    pooling = frame_pooling(edges, hop, mel_frames)
    assert pooling.shape == (frames, mel_frames)
    np.testing.assert_allclose(pooling.sum(axis=1), 1.0, rtol=1e-6)
    assert {int((row > 0).sum()) for row in pooling} <= counts


def test_audio_encoder_gives_tokens_per_video_frame() -> None:
    config = TINY.audio
    encoder = AudioEncoder(config).eval()
    samples = torch.randn(1, 6_400)  # 0.4 s: 10 frames at 25 fps
    edges = np.arange(11) * 640
    pooling = torch.from_numpy(frame_pooling(edges, config.hop, 6_400 // config.hop + 1))
    with torch.inference_mode():
        tokens = encoder(samples, pooling)
    assert tokens.shape == (1, 10, config.tokens_per_frame, config.dim)
    assert bool(torch.isfinite(tokens).all())


def test_prompts_become_byte_tokens() -> None:
    assert byte_tokens("hé", 16).tolist() == [ord("h") + 1, 0xC3 + 1, 0xA9 + 1]
    assert byte_tokens("  ", 16).size == 0
    assert byte_tokens("abcdef", 4).size == 4


def test_text_encoder_ignores_padding() -> None:
    encoder = TextEncoder(TINY.text).eval()
    tokens = torch.from_numpy(byte_tokens("smiling, warm light", 64))[None]
    padded = torch.cat([tokens, torch.zeros(1, 5, dtype=torch.int64)], dim=1)
    with torch.inference_mode():
        plain, mask = encoder(tokens)
        with_padding, padded_mask = encoder(padded)
    assert bool(mask.all()) and int(padded_mask.sum()) == tokens.shape[1]
    torch.testing.assert_close(with_padding[:, : tokens.shape[1]], plain, atol=1e-5, rtol=1e-5)
