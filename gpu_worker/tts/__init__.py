"""Speech from text, on the node: a render may give `text` (and a `voice`) instead of audio; `validate_inputs`
synthesises it once, stores the audio where an upload's normalised audio goes (`keys.audio`) and the phones'
timings beside it (`keys.speech_phones`), so every chunk, a resume and a session rebuilt on another node read the
same speech and lips.

Engines (one `TtsEngine` each, chosen by `engines.engine_for`): `espeak.py`, the embedded default (Debian's
libespeak-ng, whose phoneme events time every phone exactly), and `piper.py` (Piper's neural voices, an optional
extra, with the operator's voice file). A voice is `<engine>:<name>` (`RenderOptions.voice`): `espeak:en-us`,
`espeak:de`, `piper` (the operator's voice file), `piper:<its name>`.

What it must never do: be imported by the API (it loads native libraries), or keep anything from one synthesis
for the next (a voice's parameters are set again every time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from monologue.captions import TimedWord


@dataclass(frozen=True)
class TimedPhone:
    """One phone of the synthesised speech, as the warp family names them (`phonemes.PHONES`), and when it sounds
    (seconds from the start of the audio)."""

    phone: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Synthesis:
    """What an engine made: mono int16 samples at the engine's own rate (normalised to 16 kHz like an upload, by
    `monologue.media.normalise_audio`) and the phones' timings; None when the engine cannot time them (a Piper voice
    exported without alignments), and the node then recognises the phones as it does an upload's; and the words'
    timings (espeak-ng's word events) for captions."""

    pcm: np.ndarray  # (N,) int16
    rate: int
    phones: tuple[TimedPhone, ...] | None
    # The text's words as written, with when each is spoken (captions); None when the engine cannot time them
    # (Piper), and the node then aligns the speech to the text.
    words: tuple[TimedWord, ...] | None = None

    @property
    def seconds(self) -> float:
        return self.pcm.size / self.rate


class TtsEngine(Protocol):
    """Speech from text in one of the engine's voices. Deterministic where the engine is (espeak-ng is; Piper's
    voices sample noise), which is why the audio is synthesised once and stored."""

    def synthesise(self, text: str, voice: str) -> Synthesis: ...


@dataclass(frozen=True)
class TtsConfig:
    """The node's engines (`MONOLOGUE_TTS__*`): the Piper voice file the operator provides, if any."""

    piper_voice: Path | None = None


def phones_json(phones: tuple[TimedPhone, ...]) -> bytes:
    """The stored form of a synthesis' phones (`keys.speech_phones`): JSON floats round-trip exactly."""
    return json.dumps({"phones": [[p.phone, p.start_s, p.end_s] for p in phones]}, separators=(",", ":")).encode()


def read_phones(data: bytes) -> tuple[TimedPhone, ...]:
    return tuple(TimedPhone(str(name), float(start), float(end)) for name, start, end in json.loads(data)["phones"])
