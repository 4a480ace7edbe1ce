"""Live audio at another rate or in stereo, resampled to 16 kHz mono as it arrives.

PyAV is imported only when a client asks for it (a `start` message with another rate or two channels): the
API must run without the media stack (the `api` extra has no av), and such an API refuses those streams,
naming what to send instead. Never import av at module level here."""

from __future__ import annotations

from typing import Any

import numpy as np

from monologue.plan import AUDIO_RATE


class ResamplerMissing(Exception):
    """This API process has no PyAV: it takes 16 kHz mono only."""


class PcmResampler:
    """s16le PCM at `rate` with `channels` in, 16 kHz mono s16 out; keeps the filter's state between messages."""

    def __init__(self, rate: int, channels: int) -> None:
        try:
            import av
        except ImportError:
            raise ResamplerMissing(
                f"this server takes {AUDIO_RATE} Hz mono audio only (it has no resampler: PyAV, the `node` extra);"
                f" send {AUDIO_RATE} Hz mono s16le"
            ) from None
        self._av: Any = av
        self._rate = rate
        self._layout = "mono" if channels == 1 else "stereo"
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)

    def resample(self, pcm: np.ndarray) -> np.ndarray:
        """Interleaved int16 samples in; the 16 kHz mono samples ready so far out."""
        frame = self._av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=self._layout)
        frame.sample_rate = self._rate
        return self._samples(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """What the filter still holds (its delay): the end of the audio."""
        return self._samples(self._resampler.resample(None))

    @staticmethod
    def _samples(frames: list[Any]) -> np.ndarray:
        out = [frame.to_ndarray().reshape(-1) for frame in frames]
        return np.concatenate(out) if out else np.zeros(0, dtype="<i2")
