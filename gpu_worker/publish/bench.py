"""Encoding throughput of SegmentWriter (a benchmark, not a test): `python -m gpu_worker.publish.bench`."""

from __future__ import annotations

import time

import numpy as np

from .segment import SegmentWriter, init_segment
from .stream_format import StreamFormat

_CHUNK_FRAMES = 40
_SOURCE_RATE = 16_000


class _Speech:
    """A tone standing in for speech: the AAC encoder's cost hardly depends on the content."""

    rate = _SOURCE_RATE

    def __init__(self, seconds: float) -> None:
        self.total_samples: int | None = round(seconds * _SOURCE_RATE)

    def read(self, start: int, end: int) -> np.ndarray:
        positions = np.arange(start, end)
        tone = 0.2 * np.sin(2 * np.pi * 220 * positions / _SOURCE_RATE)
        inside = (positions >= 0) & (positions < (self.total_samples or 0))
        return np.where(inside, tone, 0.0).astype(np.float32)


def _synthetic_frames(width: int, height: int, count: int) -> np.ndarray:
    """Smooth moving gradients plus mild noise, closer to rendered faces than flat colour."""
    rows = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    columns = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    noise = np.random.default_rng(0).normal(0, 4, (height, width)).astype(np.float32)
    frames = np.empty((count, height, width, 3), dtype=np.uint8)  # (T, H, W, 3)
    for index in range(count):
        phase = index / 10
        for channel in range(3):
            wave = 128 + 100 * np.sin(6 * rows + 4 * columns * (channel + 1) + phase + channel)
            frames[index, :, :, channel] = np.clip(wave + noise, 0, 255).astype(np.uint8)
    return frames


def encode_rate(width: int, height: int, frames: int, preset: str) -> float:
    """Frames per second SegmentWriter sustains (video + audio, 40-frame chunks) over synthetic frames."""
    fmt = StreamFormat(width=width, height=height, fps=25, preset=preset)
    images = _synthetic_frames(width, height, min(frames, _CHUNK_FRAMES))  # (≤40, H, W, 3)
    speech = _Speech(frames / fmt.fps)
    init_segment(fmt)  # cached per format: not part of the per-chunk cost
    started = time.perf_counter()
    for first in range(0, frames, _CHUNK_FRAMES):
        count = min(_CHUNK_FRAMES, frames - first)
        writer = SegmentWriter(fmt, first_frame=first, audio=speech)
        writer.write(images[:count])
        writer.finish()
    return frames / (time.perf_counter() - started)


if __name__ == "__main__":
    for name in ("superfast", "veryfast", "ultrafast"):
        print(f"1280x720 {name}: {encode_rate(1280, 720, 400, name):.1f} fps")
