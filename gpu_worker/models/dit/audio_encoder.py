"""Speech → per-video-frame audio tokens: a log-mel front end and a small transformer.

The mel filterbank is built here in torch (HTK mel scale, Slaney area normalisation) rather than taken
from librosa or torchaudio: the GPU machine has neither, and the numbers must not change with a
library's version. Log-mel values use a fixed floor and scale (not Whisper's per-clip "max - 8" range),
so a frame's features depend only on the samples around it, never on how loud the rest of the chunk is.

The transformer runs at the mel rate (100 Hz); its outputs are averaged over each video frame's audio
interval (a pooling matrix built outside the forward, since frame edges fall on fractional mel frames
at fps that do not divide 100) and projected to `tokens_per_frame` tokens per frame.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from gpu_worker.models.dit.config import AudioConfig
from gpu_worker.models.dit.layers import TransformerBlock, rope_table


def hz_to_mel(frequency: float) -> float:
    return 2595.0 * math.log10(1.0 + frequency / 700.0)


def mel_to_hz(mel: Tensor) -> Tensor:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(n_fft: int, n_mels: int, sample_rate: int, f_min: float, f_max: float) -> Tensor:
    """(n_mels, n_fft // 2 + 1) triangular filters, equally spaced on the mel scale, each of unit area in Hz
    (Slaney normalisation), so a filter's output does not grow with its width."""
    bins = torch.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1, dtype=torch.float64)  # (F,) bin centres
    edges = mel_to_hz(torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # each (n_mels, 1)
    rising = (bins[None] - lower) / (centre - lower)
    falling = (upper - bins[None]) / (upper - centre)
    triangles = torch.clamp(torch.minimum(rising, falling), min=0.0)  # (n_mels, F)
    return (triangles * (2.0 / (upper - lower))).float()


class LogMel(nn.Module):
    """Samples (B, S) at 16 kHz → log-mel (B, M, n_mels) with M = S // hop + 1, frame m centred on sample m hop."""

    window: Tensor
    filterbank: Tensor

    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("window", torch.hann_window(config.n_fft), persistent=False)
        filterbank = mel_filterbank(config.n_fft, config.n_mels, config.sample_rate, config.f_min, config.f_max)
        self.register_buffer("filterbank", filterbank, persistent=False)

    def forward(self, samples: Tensor) -> Tensor:
        config = self.config
        spectrum = torch.stft(
            samples.float(),
            config.n_fft,
            config.hop,
            window=self.window,
            center=True,
            pad_mode="constant",
            return_complex=True,
        )  # (B, F, M)
        power = spectrum.real**2 + spectrum.imag**2
        mel = torch.einsum("nf,bfm->bmn", self.filterbank, power)  # (B, M, n_mels)
        # A fixed floor (-100 dB) and scale: roughly [-1, 1.5] for speech at -1..1 full scale.
        return (torch.log10(torch.clamp(mel, min=1e-10)) + 4.0) / 4.0


def frame_pooling(frame_starts: np.ndarray, hop: int, mel_frames: int) -> np.ndarray:
    """(Ta, M) averaging matrix: row f averages the mel frames centred in [frame_starts[f], frame_starts[f+1]).

    frame_starts: (Ta + 1,) sample offsets of the video frames' edges in the analysed samples. A frame too
    short to hold a mel centre (fps above 100) takes the nearest mel frame."""
    frames = len(frame_starts) - 1
    pooling = np.zeros((frames, mel_frames), dtype=np.float32)
    for frame in range(frames):
        first = min(mel_frames - 1, math.ceil(frame_starts[frame] / hop))
        end = min(mel_frames, max(first + 1, math.ceil(frame_starts[frame + 1] / hop)))
        pooling[frame, first:end] = 1.0 / (end - first)
    return pooling


class AudioEncoder(nn.Module):
    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.mel = LogMel(config)
        self.stem = nn.Sequential(nn.Linear(config.n_mels, config.dim), nn.GELU(approximate="tanh"))
        self.blocks = nn.ModuleList(TransformerBlock(config.dim, config.heads) for _ in range(config.layers))
        self.norm_out = nn.LayerNorm(config.dim)
        self.to_tokens = nn.Linear(config.dim, config.tokens_per_frame * config.dim)

    def forward(self, samples: Tensor, pooling: Tensor) -> Tensor:
        """samples (B, S), pooling (Ta, M) from `frame_pooling` → audio tokens (B, Ta, K, dim)."""
        config = self.config
        x = self.stem(self.mel(samples))  # (B, M, dim)
        positions = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)[:, None]  # (M, 1)
        rope = rope_table(positions, config.dim // config.heads, 10_000.0)
        for block in self.blocks:
            x = block(x, rope)
        per_frame = torch.einsum("fm,bmd->bfd", pooling.to(x.dtype), self.norm_out(x))  # (B, Ta, dim)
        tokens: Tensor = self.to_tokens(per_frame).view(x.shape[0], -1, config.tokens_per_frame, config.dim)
        return tokens  # (B, Ta, K, dim)
