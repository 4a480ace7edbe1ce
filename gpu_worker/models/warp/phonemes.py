"""Phones from speech: PocketSphinx's phone recogniser (allphone search: its en-US acoustic model and phonetic
language model ship in the wheel, so nothing is downloaded), run on the fixed windows of
`monologue.phone_windows`, one 10 ms step at a time.

What it must never do: let anything but a window's own samples decide that window's phones. The decoder keeps
front-end state (its noise estimate) from one utterance to the next, so it is reset before every window; a
window's phones are then the same on any node, in any order, cached or not (tests check all three).
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_worker.lru import LRU
from monologue.phone_windows import PHONE_WINDOWS, PhoneWindows

# The en-US model's phones; a step's phone is its index here (0, silence, also for fillers and noise).
PHONES = tuple(
    "SIL AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH T TH UH UW V W Y Z ZH".split()  # noqa: SIM905
)
SILENCE = 0
PHONE_IDS = {name: index for index, name in enumerate(PHONES)}


@dataclass(frozen=True)
class RecogniserConfig:
    # Language-model weight of the phone trigram against the acoustics: 2 instead of PocketSphinx's 6.5 agreed
    # best with forced alignment on espeak-ng speech (74 % of speech steps in the right viseme class, from 50 %).
    language_weight: float = 2.0
    # A fixed dither (1 LSB = 1/32768) added to every window: digital silence (espeak-ng's pauses, gated
    # recordings) drives the cepstra to log(0), after which the recogniser hears silence inside speech too.
    dither_lsb: float = 16.0


class WindowCache(LRU[bytes, np.ndarray]):
    """Phones of recently recognised windows, by the SHA-256 of the samples the decoder was given: an entry can
    only ever be the answer the decoder would give again, so results never depend on it. Consecutive chunks
    share the windows at their seams (an N chunk's margins are the I chunk's frames), and a session regenerated
    on the same node finds them again. Shared by the node's pipelines (about 100 bytes an entry)."""

    def __init__(self, capacity: int = 256) -> None:
        super().__init__(capacity)


WINDOW_CACHE = WindowCache()


RECOGNISER = RecogniserConfig()


class PhoneRecogniser:
    """Phone ids per 10 ms step of the absolute timeline, from the windows that own the steps."""

    def __init__(
        self,
        windows: PhoneWindows = PHONE_WINDOWS,
        config: RecogniserConfig = RECOGNISER,
        cache: WindowCache = WINDOW_CACHE,
    ) -> None:
        self.windows = windows
        self.config = config
        self.cache = cache
        self._decoder: Any = None  # loaded on first use: a node that never renders visemes never loads it
        self._lock = threading.Lock()  # one decoder, one utterance at a time
        dither = np.random.Generator(np.random.PCG64(0)).standard_normal(windows.window_samples)
        self._dither = np.round(dither * config.dither_lsb)  # (window_samples,) the same for every window
        self.decoded = 0  # windows actually run through the decoder (the rest came from the cache or were silent)
        self.decode_cpu_s = 0.0  # CPU seconds the decoder took (the benchmark's recognition cost)

    def track(self, samples: np.ndarray, start_sample: int, first_step: int, end_step: int) -> np.ndarray:
        """(end_step - first_step,) uint8 phone ids; `samples` (float32 in [-1, 1], the first at absolute sample
        `start_sample`) must hold every window that owns one of the steps."""
        windows = self.windows
        out = np.zeros(end_step - first_step, dtype=np.uint8)
        for window in range(windows.owner(first_step), windows.owner(end_step - 1) + 1):
            start, end = windows.samples(window)
            if start < start_sample or end > start_sample + samples.size:
                raise ValueError(
                    f"phone window {window} needs samples [{start}, {end}), the audio given holds "
                    f"[{start_sample}, {start_sample + samples.size})"
                )
            owned = self.window(samples[start - start_sample : end - start_sample])  # (core_steps,)
            owned_first = window * windows.core_steps
            lo, hi = max(first_step, owned_first), min(end_step, owned_first + windows.core_steps)
            out[lo - first_step : hi - first_step] = owned[lo - owned_first : hi - owned_first]
        return out

    def window(self, samples: np.ndarray) -> np.ndarray:
        """The phones of one window's owned steps, (core_steps,) uint8, from its samples alone."""
        if samples.size != self.windows.window_samples:
            raise ValueError(f"a phone window is {self.windows.window_samples} samples, got {samples.size}")
        pcm = np.clip(np.round(samples.astype(np.float64) * 32768.0), -32768, 32767)
        if not pcm.any():  # silence (also before the audio starts and after it ends): nothing to hear
            return np.zeros(self.windows.core_steps, dtype=np.uint8)
        wire = np.clip(pcm + self._dither, -32768, 32767).astype("<i2").tobytes()
        key = hashlib.sha256(wire).digest()
        owned = self.cache.get(key)
        if owned is None:
            with self._lock:
                owned = self._decode(wire)
            self.cache.put(key, owned)
        return owned

    def _decode(self, wire: bytes) -> np.ndarray:
        """One utterance through the decoder (holding the lock): phone per step, owned steps only."""
        decoder = self.load()
        started = time.thread_time()
        decoder.reinit_feat()  # forget the noise estimate of the previous window
        _start_utterance(decoder)
        try:
            decoder.process_raw(wire, no_search=False, full_utt=True)
        finally:
            decoder.end_utt()
        windows = self.windows
        steps = np.zeros(windows.window_samples // windows.step_samples, dtype=np.uint8)
        for segment in decoder.seg():
            steps[segment.start_frame : segment.end_frame + 1] = PHONE_IDS.get(segment.word, SILENCE)
        self.decoded += 1
        self.decode_cpu_s += time.thread_time() - started
        owned: np.ndarray = steps[windows.before_steps : windows.before_steps + windows.core_steps].copy()
        return owned

    def load(self) -> Any:
        """The decoder, loaded once (PocketSphinx's models from its wheel)."""
        if self._decoder is None:
            import pocketsphinx  # the node extra; a GPU-only machine without it never renders warp visemes

            model = Path(pocketsphinx.get_model_path()) / "en-us"
            self._decoder = pocketsphinx.Decoder(
                hmm=str(model / "en-us"),
                allphone=str(model / "en-us-phone.lm.bin"),
                lm=None,
                lw=self.config.language_weight,
                samprate=self.windows.rate,
                loglevel="FATAL",
            )
        return self._decoder


def _start_utterance(decoder: Any) -> None:
    """Start an utterance, first ending one an interrupted decode left open: Temporal cancels a sync activity by
    raising inside its thread, which can land between `start_utt` and `end_utt`, and the node's one decoder would
    then refuse every later window ("Failed to start utterance processing")."""
    try:
        decoder.start_utt()
    except RuntimeError:
        decoder.end_utt()
        decoder.reinit_feat()
        decoder.start_utt()
