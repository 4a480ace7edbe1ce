"""Chunk-invariant 3× upsampling (16 kHz → 48 kHz) with a fixed polyphase windowed-sinc filter.

Output sample m = 3q + r is Σ_d x[q - d] · h(3d + r) over a fixed set of d, accumulated tap by tap in a fixed
order with element-wise numpy operations (no reductions, no BLAS), so its value depends only on the input samples
near q, never on which slice it was computed from: segments resampled separately agree exactly with the whole.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

FACTOR = 3
_HALF_WIDTH = 24  # input samples on each side of the output position
_KAISER_BETA = 8.0  # about 80 dB of image rejection
# Taps are rounded to multiples of 2^-30 so that tiny libm differences between machines cannot change them.
_TAP_QUANTUM = 2.0**-30


class AudioSource(Protocol):
    """A session's speech: mono float32 at `rate`, readable by sample range, zeros outside [0, total)."""

    rate: int
    total_samples: int | None  # None while a live session's audio is still arriving

    def read(self, start: int, end: int) -> np.ndarray:
        """Samples [start, end) as float32 (end - start,); zeros outside [0, total_samples)."""
        ...


def _bessel_i0(x: float) -> float:
    term = total = 1.0
    k = 0
    while term > 1e-18 * total:
        k += 1
        term *= (x / (2 * k)) ** 2
        total += term
    return total


def _taps() -> np.ndarray:
    """(3, 2 × HALF_WIDTH) taps: row r, column d + HALF_WIDTH holds h(3d + r), d in [-HALF_WIDTH, HALF_WIDTH)."""
    span = FACTOR * _HALF_WIDTH
    taps = np.zeros((FACTOR, 2 * _HALF_WIDTH), dtype=np.float64)
    for phase in range(FACTOR):
        for column, offset in enumerate(range(-_HALF_WIDTH, _HALF_WIDTH)):
            t = FACTOR * offset + phase
            if abs(t) >= span:
                continue  # the window is zero there
            sinc = 1.0 if t == 0 else math.sin(math.pi * t / FACTOR) / (math.pi * t / FACTOR)
            window = _bessel_i0(_KAISER_BETA * math.sqrt(1.0 - (t / span) ** 2)) / _bessel_i0(_KAISER_BETA)
            taps[phase, column] = round(sinc * window / _TAP_QUANTUM) * _TAP_QUANTUM
    return taps


_TAPS = _taps()  # (3, 48)


def upsample(audio: AudioSource, start: int, end: int) -> np.ndarray:
    """Samples [start, end) of `audio` upsampled 3×, float32 (end - start,).

    Output samples before 0 or at or past 3 × total_samples (when known) are exact silence.
    """
    if end < start:
        raise ValueError(f"upsample: end={end} is before start={start}")
    first_input = start // FACTOR  # floor, also for negative positions
    end_input = -(-end // FACTOR)
    count = end_input - first_input
    source = audio.read(first_input - _HALF_WIDTH, end_input + _HALF_WIDTH).astype(np.float64)  # (count + 48,)
    if source.shape != (count + 2 * _HALF_WIDTH,):
        raise ValueError(f"audio.read returned shape {source.shape}, expected ({count + 2 * _HALF_WIDTH},)")
    phases = np.empty((count, FACTOR), dtype=np.float64)  # (count, 3): column r holds outputs 3q + r
    for phase in range(FACTOR):
        accumulator = np.zeros(count, dtype=np.float64)
        for column, offset in enumerate(range(-_HALF_WIDTH, _HALF_WIDTH)):
            # x[q - offset] for q in [first_input, end_input) sits at source index q - offset - first_input + HALF
            low = _HALF_WIDTH - offset
            accumulator += _TAPS[phase, column] * source[low : low + count]
        phases[:, phase] = accumulator
    output = phases.reshape(-1)[start - FACTOR * first_input : end - FACTOR * first_input]  # (end - start,)
    silent_before = min(max(0, -start), output.shape[0])
    output[:silent_before] = 0.0
    if audio.total_samples is not None:
        output[max(0, FACTOR * audio.total_samples - start) :] = 0.0
    return output.astype(np.float32)
