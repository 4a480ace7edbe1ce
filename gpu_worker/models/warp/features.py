"""Per-frame speech features for the mouth: how loud, what the spectrum says about the lips' shape, and (with
visemes) the mouth shape the phones around the frame ask for.

Each frame's features come from a window centred on that frame alone, and its phones from the fixed phone
windows that own them (`monologue.phone_windows`), so a frame's values are the same whichever chunk computes
them: what makes the mouth meet itself exactly across chunk seams, live or resumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_worker.models.warp.alignment import AlignedPhones, TranscriptAligner
from gpu_worker.models.warp.phonemes import PhoneRecogniser
from gpu_worker.models.warp.visemes import viseme_targets
from gpu_worker.pipeline.module import ContextGenerator
from gpu_worker.pipeline.types import AudioSource, AudioWindow, ChunkRequest
from gpu_worker.tts import TimedPhone
from monologue.contracts import LipSync
from monologue.errors import InputError


@dataclass(frozen=True)
class FeatureConfig:
    # Analysis window: 40 ms (one frame at 25 fps), long enough for two pitch periods of a low voice.
    window_seconds: float = 0.040
    # Spectral bands (Hz). Rounded back vowels ("oo", "o") keep their energy low (first formant); front
    # vowels ("ee", "ay") push the second formant up; fricatives ("s", "sh", "f") hiss above 4 kHz.
    low_band: tuple[float, float] = (250.0, 1000.0)
    mid_band: tuple[float, float] = (1000.0, 3500.0)
    high_band: tuple[float, float] = (4000.0, 8000.0)
    # Mid-to-low energy ratio (dB) of a neutral vowel, and the ratio change that reads as fully spread or
    # fully rounded lips (measured on espeak-ng and recorded speech: vowels span about -20..+5 dB).
    neutral_ratio_db: float = -6.0
    ratio_scale_db: float = 6.0
    # Level reported for digital silence, well under any floor the mouth uses.
    silence_db: float = -120.0


FEATURES = FeatureConfig()


@dataclass(frozen=True)
class SpeechFeatures:
    """Features for consecutive absolute frames [first_frame, first_frame + len)."""

    fps: int
    first_frame: int
    level_db: np.ndarray  # (F,) loudness, dBFS
    spread: np.ndarray  # (F,) -1 rounded … +1 spread
    hiss: np.ndarray  # (F,) share of energy in the fricative band, 0..1
    # With visemes: (V, 5) mouth targets (`visemes.TARGET_NAMES`) of frames [viseme_first_frame, + V).
    visemes: np.ndarray | None = None
    viseme_first_frame: int = 0
    # (F,) bool: frames whose centre an interrupt dropped (`AudioWindow.silenced`); None when none is.
    cut: np.ndarray | None = None

    def has(self, frame: int) -> bool:
        return self.first_frame <= frame < self.first_frame + self.level_db.size

    def at(self, frame: int) -> tuple[float, float, float]:
        """(level_db, spread, hiss) of an absolute frame that `has` says is present."""
        index = frame - self.first_frame
        return float(self.level_db[index]), float(self.spread[index]), float(self.hiss[index])

    def is_cut(self, frame: int) -> bool:
        """Whether an interrupt dropped this present frame's audio: the mouth closes at once."""
        return self.cut is not None and bool(self.cut[frame - self.first_frame])

    def shape(self, frame: int) -> np.ndarray | None:
        """(5,) the viseme targets of a frame of the chunk, or None when lips follow loudness alone."""
        return None if self.visemes is None else self.visemes[frame - self.viseme_first_frame]

    def to_context(self) -> dict[str, Any]:
        context = {
            "fps": self.fps,
            "first_frame": self.first_frame,
            "level_db": self.level_db,
            "spread": self.spread,
            "hiss": self.hiss,
        }
        if self.visemes is not None:
            context |= {"visemes": self.visemes, "viseme_first_frame": self.viseme_first_frame}
        if self.cut is not None:
            context["cut"] = self.cut
        return context

    @classmethod
    def from_context(cls, context: dict[str, Any]) -> SpeechFeatures:
        return cls(
            fps=int(context["fps"]),
            first_frame=int(context["first_frame"]),
            level_db=context["level_db"],
            spread=context["spread"],
            hiss=context["hiss"],
            visemes=context.get("visemes"),
            viseme_first_frame=int(context.get("viseme_first_frame", 0)),
            cut=context.get("cut"),
        )


def _band(frequencies: np.ndarray, band: tuple[float, float]) -> np.ndarray:
    return (frequencies >= band[0]) & (frequencies < band[1])


def speech_features(
    window: AudioWindow, first_frame: int, end_frame: int, config: FeatureConfig = FEATURES
) -> SpeechFeatures:
    """Features for the frames in [first_frame, end_frame) whose analysis window lies inside the audio
    window (frames at the window's ends whose analysis would need samples it lacks are left out)."""
    length = max(16, round(config.window_seconds * window.rate))
    taper = np.hanning(length + 2)[1:-1]  # (L,) without the zero end points
    frequencies = np.fft.rfftfreq(length, 1.0 / window.rate)
    low, mid, high = (_band(frequencies, band) for band in (config.low_band, config.mid_band, config.high_band))
    samples = window.samples.astype(np.float64)
    kept: list[int] = []
    values: list[tuple[float, float, float]] = []
    for frame in range(first_frame, end_frame):
        centre = (window.frame_start(frame) + window.frame_start(frame + 1)) // 2
        start = centre - length // 2
        if start < 0 or start + length > samples.size:
            continue
        # One frame at a time: the numbers for a frame never depend on which other frames share the call.
        tapered = samples[start : start + length] * taper
        power = np.abs(np.fft.rfft(tapered)) ** 2
        mean_square = float(np.dot(tapered, tapered) / taper.sum())
        level = 10.0 * np.log10(mean_square) if mean_square > 1e-12 else config.silence_db
        energy_low, energy_mid, energy_high = float(power[low].sum()), float(power[mid].sum()), float(power[high].sum())
        ratio_db = 10.0 * np.log10((energy_mid + 1e-12) / (energy_low + 1e-12))
        spread = float(np.tanh((ratio_db - config.neutral_ratio_db) / config.ratio_scale_db))
        hiss = energy_high / (energy_low + energy_mid + energy_high + 1e-12)
        kept.append(frame)
        values.append((max(level, config.silence_db), spread, hiss))
    if kept and kept != list(range(kept[0], kept[0] + len(kept))):
        raise RuntimeError("speech features must cover consecutive frames")
    table = np.array(values, dtype=np.float64).reshape(-1, 3)  # (F, 3)
    cut = _cut_frames(window, kept)
    return SpeechFeatures(
        fps=window.fps,
        first_frame=kept[0] if kept else first_frame,
        level_db=table[:, 0].copy(),
        spread=table[:, 1].copy(),
        hiss=table[:, 2].copy(),
        cut=cut if cut.any() else None,
    )


def _cut_frames(window: AudioWindow, frames: list[int]) -> np.ndarray:
    """(F,) whether an interrupt dropped each frame's centre sample."""
    centres = [window.start_sample + (window.frame_start(f) + window.frame_start(f + 1)) // 2 for f in frames]
    return np.array([any(lo <= c < hi for lo, hi in window.silenced) for c in centres], dtype=bool)


class SpeechContext(ContextGenerator):
    """Per-frame loudness, lip spread and hiss for a chunk and its margins; with visemes, also each of the
    chunk's frames' mouth targets from the phones of the windows that own the steps around it, or, when the
    session has a transcript, from its forced alignment over the whole speech (`prepare`), and when its speech was
    synthesised from text, from the phones the engine spoke (`prepare_phones`).

    The margin before covers the I chunk before an N chunk, so the N chunk can carry the mouth's smoothing
    across that gap on real audio; the margin after is the mouth's look-ahead. Visemes read the whole phone
    windows those frames need (up to 1.3 s past the chunk: `PhoneWindows.lookahead_samples`).
    """

    margin_frames = (8, 2)

    def __init__(self) -> None:
        super().__init__()
        self.recogniser = PhoneRecogniser()
        self.aligner = TranscriptAligner()

    def prepare(self, audio: AudioSource, transcript: str) -> AlignedPhones:
        """The transcript's phones aligned to the whole speech, once per session."""
        return self.aligner.align(audio, transcript)

    def prepare_phones(self, audio: AudioSource, phones: tuple[TimedPhone, ...]) -> AlignedPhones:
        """The phones a text session's speech was synthesised from, on the steps: no recognition, no alignment."""
        if audio.total_samples is None:
            raise InputError("speech from text needs the whole speech: only renders take text")
        return AlignedPhones.from_timed(phones, audio.total_samples, self.recogniser.windows)

    def load(self) -> None:
        """The phone recogniser's models (0.2 s), when the node loads the family: not in a live session's
        first chunk."""
        self.recogniser.load()
        super().load()

    def audio_range(self, chunk: ChunkRequest, fps: int, rate: int) -> tuple[int, int]:
        start, end = super().audio_range(chunk, fps, rate)
        if chunk.lip_sync is not LipSync.VISEMES:
            return start, end
        windows = self.recogniser.windows
        if rate != windows.rate:
            raise ValueError(f"phone windows are laid out at {windows.rate} Hz, the audio is {rate} Hz")
        phone_start, phone_end = windows.audio_for(chunk.first_frame, chunk.end_frame, fps)
        return min(start, phone_start), max(end, phone_end)

    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]:
        """Features for frames [first_frame - 8, end_frame + 2), visemes for the chunk's own frames; no
        randomness (the rng is left untouched)."""
        before, after = self.margin_frames
        features = speech_features(window, chunk.first_frame - before, chunk.end_frame + after)
        context = features.to_context()
        if chunk.lip_sync is LipSync.VISEMES:
            windows = self.recogniser.windows
            first_step, end_step = windows.steps_for(chunk.first_frame, chunk.end_frame, window.fps)
            if isinstance(window.prepared, AlignedPhones):
                phones = window.prepared.between(first_step, end_step)
            else:
                phones = self.recogniser.track(window.samples, window.start_sample, first_step, end_step)
            targets = viseme_targets(phones, first_step, chunk.first_frame, chunk.end_frame, window.fps, windows)
            context |= {"visemes": targets, "viseme_first_frame": chunk.first_frame}
        return context
