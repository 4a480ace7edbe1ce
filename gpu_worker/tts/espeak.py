"""espeak-ng, the embedded default engine: Debian's libespeak-ng (package libespeak-ng1, which the `espeak-ng`
command also uses), driven through its C API in a child process (`espeak_child.py` says why both).

Its phoneme events give the sample at which each phone starts in the same audio, so a phone lasts until the next
one starts; they are named in IPA and mapped onto the warp family's phones (`ipa.py`). The same text and voice give
the same samples, byte for byte, on any node with the same espeak-ng (the tests check it). Cost: about 3 ms per
second of speech, plus 0.1 s to start the child (docs/benchmarks.md, `monologue bench tts`).
"""

from __future__ import annotations

import bisect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpu_worker.tts import Synthesis, TimedPhone
from gpu_worker.tts.ipa import SILENCE, warp_phone
from monologue.captions import TimedWord, display_tokens, timed_tokens
from monologue.errors import InputError

CHILD = Path(__file__).with_name("espeak_child.py")
NO_VOICE, NO_LIBRARY = 2, 3  # the child's exit status for an unknown voice, and without libespeak-ng
TIMEOUT_S = 120.0  # the longest text the API takes is spoken in a few seconds


class EspeakEngine:
    """espeak-ng's voices (`espeak-ng --voices`: en-us, en-gb, de, fr, …, with variants such as en-us+f3)."""

    def synthesise(self, text: str, voice: str) -> Synthesis:
        """The speech and its phones' timings; InputError for a voice espeak-ng does not have."""
        # -I: the child sees neither the environment's PYTHON* variables nor the working folder's modules.
        done = subprocess.run(
            [sys.executable, "-I", str(CHILD), voice], input=text.encode(), capture_output=True, timeout=TIMEOUT_S
        )
        if done.returncode == NO_VOICE:
            raise InputError(done.stderr.decode(errors="replace").strip())
        if done.returncode == NO_LIBRARY:  # the deployment's to fix; the caller can send audio meanwhile
            raise InputError(f"text: {done.stderr.decode(errors='replace').strip()}; send audio instead")
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"espeak-ng failed (exit {done.returncode}): {error[-1] if error else 'no message'}")
        header, _, samples = done.stdout.partition(b"\n")
        found = json.loads(header)
        rate = int(found["rate"])
        pcm = np.frombuffer(samples, dtype=np.int16).copy()
        events = [(int(sample), str(name)) for sample, name in found["events"]]
        phones = timed_phones(events, pcm.size, rate)
        words = [(int(sample), int(character)) for sample, character in found["words"]]
        return Synthesis(pcm=pcm, rate=rate, phones=phones, words=timed_words(text, words, phones, pcm.size, rate))


def timed_phones(events: list[tuple[int, str]], total: int, rate: int) -> tuple[TimedPhone, ...]:
    """Each phone from its event's sample to the next phone's (the last to the end of the audio); marks without a
    phone of their own extend the phone before, and a run of pauses is one silence."""
    starts: list[tuple[int, str]] = []
    for sample, name in events:
        phone = warp_phone(name)
        if phone is None or (starts and starts[-1][1] == phone == SILENCE):
            continue
        starts.append((min(max(sample, 0), total), phone))
    ends = [sample for sample, _ in starts[1:]] + [total]
    return tuple(
        TimedPhone(phone, start / rate, end / rate)
        for (start, phone), end in zip(starts, ends, strict=True)
        if end > start
    )


def timed_words(
    text: str, events: list[tuple[int, int]], phones: tuple[TimedPhone, ...], total: int, rate: int
) -> tuple[TimedWord, ...]:
    """The text's words as written (`captions.display_tokens`), each from its first spoken phone to its last: a
    word event gives the sample where espeak-ng starts a word and its first character (1-based); the word lasts
    until the next word's event, and within that its phones other than silence say when it sounds. A token with
    no event of its own (a dash) joins its neighbour; one with several (espeak-ng says "42" as two words) spans
    them all."""
    tokens = display_tokens(text)
    starts = [offset for offset, _ in tokens]
    firsts: dict[int, int] = {}  # token -> the sample of its first word event
    for sample, character in events:
        token = bisect.bisect_right(starts, character - 1) - 1
        firsts.setdefault(max(token, 0), min(max(sample, 0), total))
    bounds = sorted(firsts.items())
    spans: dict[int, tuple[float, float]] = {}
    for number, (token, first) in enumerate(bounds):
        end = bounds[number + 1][1] if number + 1 < len(bounds) else total
        sounding = [p for p in phones if p.phone != SILENCE and first / rate <= p.start_s < end / rate]
        spans[token] = (sounding[0].start_s, sounding[-1].end_s) if sounding else (first / rate, end / rate)
    return timed_tokens([token for _, token in tokens], [spans.get(number) for number in range(len(tokens))])


ESPEAK_ENGINE = EspeakEngine()
