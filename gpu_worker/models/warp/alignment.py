"""Phones from speech and its transcript (or, for speech synthesised from text, from the engine's own timings:
`AlignedPhones.from_timed`): PocketSphinx's forced alignment of the words over the whole speech,
once per session, before its first chunk (`ContextGenerator.prepare`).

Why the whole speech and not the fixed phone windows the recogniser uses: alignment is a search for one path
through all the words, and a window does not know which of them it holds. A grammar of "any run of the
transcript's phones" per window was tried and costs too much (a 2,000-phone transcript: 600 s of CPU for 11 s
of speech). Aligned once over everything, a frame's phones depend on the whole speech and the transcript and
on nothing else: any chunking, and a session rebuilt on another node (which aligns again), get the same steps.
Live sessions have no whole speech, so they take no transcript (the API refuses one).

Cost: about 0.04 s of CPU per second of speech (docs/benchmarks.md), so a 10-minute render spends ~25 s
aligning before its first chunk; memory is the speech as 16-bit samples plus PocketSphinx's lattice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_worker.models.warp.phonemes import PHONE_IDS, RECOGNISER, SILENCE, RecogniserConfig
from gpu_worker.pipeline.types import AudioSource
from gpu_worker.tts import TimedPhone
from monologue.captions import TimedWord, display_tokens, timed_tokens
from monologue.errors import InputError
from monologue.phone_windows import PHONE_WINDOWS, PhoneWindows

# Typographic apostrophes, which the dictionary spells as "'" (don’t → don't).
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_NOT_A_WORD = re.compile(r"[^a-z']+")
_UNKNOWN_SHOWN = 12
_FILLERS = ("<", "[", "+")  # the alignment's silences and noises (<sil>, <s>, [NOISE], ++…++), not words


def transcript_words(transcript: str) -> list[str]:
    """The words PocketSphinx aligns: lower case, letters and apostrophes; anything else separates words."""
    text = transcript.translate(_APOSTROPHES).lower()
    return [word.strip("'") for word in _NOT_A_WORD.split(text) if word.strip("'")]


@dataclass(frozen=True)
class AlignedPhones:
    """Phone ids (`phonemes.PHONES`) of the session's 10 ms steps from the start of the speech."""

    steps: np.ndarray  # (S,) uint8

    @classmethod
    def from_timed(
        cls, phones: tuple[TimedPhone, ...], total_samples: int, windows: PhoneWindows = PHONE_WINDOWS
    ) -> AlignedPhones:
        """The steps of speech synthesised from text, from the phones the engine spoke: a step takes the phone
        sounding at its start (times rounded to the nearest step), silence where none does."""
        steps = np.full(total_samples // windows.step_samples, SILENCE, dtype=np.uint8)
        per_second = windows.rate / windows.step_samples
        for phone in phones:
            first, end = round(phone.start_s * per_second), round(phone.end_s * per_second)
            steps[first:end] = PHONE_IDS[phone.phone]
        return cls(steps)

    def between(self, first_step: int, end_step: int) -> np.ndarray:
        """(end_step - first_step,) uint8: silence before the speech and after it ends."""
        out = np.zeros(end_step - first_step, dtype=np.uint8)
        lo, hi = max(first_step, 0), min(end_step, self.steps.size)
        if hi > lo:
            out[lo - first_step : hi - first_step] = self.steps[lo:hi]
        return out


def _not_aligned() -> InputError:
    return InputError("transcript: the speech does not align with it (is it the text that is spoken, all of it?)")


class TranscriptAligner:
    """Forced alignment with PocketSphinx's en-US model and CMU dictionary (both in its wheel)."""

    def __init__(self, windows: PhoneWindows = PHONE_WINDOWS, config: RecogniserConfig = RECOGNISER) -> None:
        self.windows = windows
        self.config = config

    def align(self, audio: AudioSource, transcript: str) -> AlignedPhones:
        """The phones of every step of `audio`; InputError when the transcript cannot be aligned to it."""
        samples, alignment = self._search(audio, transcript)
        steps = np.full(samples.size // self.windows.step_samples, SILENCE, dtype=np.uint8)
        for word in alignment:
            for phone in word:
                steps[phone.start : phone.start + phone.duration] = PHONE_IDS.get(phone.name, SILENCE)
        return AlignedPhones(steps)

    def align_words(self, audio: AudioSource, transcript: str) -> tuple[TimedWord, ...]:
        """The transcript's words as written (`captions.display_tokens`), each timed by its aligned words: a token
        spans the words `transcript_words` finds in it ("well-known": two), in order; a token with none ("42", a
        dash) joins its neighbour. InputError (naming `transcript`) when it cannot be aligned."""
        _, alignment = self._search(audio, transcript)
        step, rate = self.windows.step_samples, self.windows.rate
        aligned = [
            (word.start * step / rate, (word.start + word.duration) * step / rate)
            for word in alignment
            if not word.name.startswith(_FILLERS)
        ]
        tokens = [token for _, token in display_tokens(transcript)]
        times: list[tuple[float, float] | None] = []
        for token in tokens:
            count = len(transcript_words(token))
            mine, aligned = aligned[:count], aligned[count:]
            times.append((mine[0][0], mine[-1][1]) if mine else None)
        return timed_tokens(tokens, times)

    def _search(self, audio: AudioSource, transcript: str) -> tuple[np.ndarray, Any]:
        """The speech's samples and PocketSphinx's alignment of the transcript's words over them."""
        total = audio.total_samples
        if total is None:
            raise InputError("a transcript needs the whole speech: only renders take one")
        if audio.rate != self.windows.rate:
            raise InputError(f"alignment runs at {self.windows.rate} Hz, the audio is {audio.rate} Hz")
        words = transcript_words(transcript)
        if not words:
            raise InputError("transcript: it holds no words (letters and apostrophes)")
        decoder = self._decoder()  # its own for each session: sessions may align at once, on their threads
        unknown = [word for word in dict.fromkeys(words) if decoder.lookup_word(word) is None]
        if unknown:
            shown = ", ".join(unknown[:_UNKNOWN_SHOWN]) + (", …" if len(unknown) > _UNKNOWN_SHOWN else "")
            raise InputError(
                f"transcript: {len(unknown)} word(s) are not in the pronunciation dictionary ({shown}); "
                "spell them as they sound in common English words, or leave the transcript out"
            )
        samples = audio.read(0, total)
        return samples, self._align(decoder, samples, " ".join(words))

    def _align(self, decoder: Any, samples: np.ndarray, text: str) -> Any:
        # The same fixed dither as the recogniser's windows (digital silence would otherwise drive the cepstra to
        # log(0)), seeded alike, drawn for the whole speech.
        dither = np.random.Generator(np.random.PCG64(0)).standard_normal(samples.size)
        pcm = np.clip(
            np.round(samples.astype(np.float64) * 32768.0) + np.round(dither * self.config.dither_lsb), -32768, 32767
        )
        wire = pcm.astype("<i2").tobytes()
        decoder.set_align_text(text)
        try:  # PocketSphinx's two passes: the words, then the phones within them
            for phones_pass in (False, True):
                if phones_pass:
                    decoder.set_alignment()  # fails when the word pass found no path through every word
                decoder.reinit_feat()
                decoder.start_utt()
                decoder.process_raw(wire, no_search=False, full_utt=True)
                decoder.end_utt()  # fails when the search lost every path
        except RuntimeError as err:
            raise _not_aligned() from err
        alignment = decoder.get_alignment()
        if alignment is None:
            raise _not_aligned()
        return alignment

    def _decoder(self) -> Any:
        """A fresh decoder per alignment (0.2 s): nothing from one session's search reaches another's."""
        import pocketsphinx  # the node extra

        model = Path(pocketsphinx.get_model_path()) / "en-us"
        return pocketsphinx.Decoder(
            hmm=str(model / "en-us"),
            dict=str(model / "cmudict-en-us.dict"),
            lm=None,
            samprate=self.windows.rate,
            loglevel="FATAL",
        )
