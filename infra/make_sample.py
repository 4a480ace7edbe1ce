"""Regenerate the bundled sample: monologue/samples/portrait.jpg and monologue/samples/speech.wav.

Why a script: the sample is what demos and end-to-end tests run on, and tests rely on its layout
(speech, an exact-zero silent gap, speech), so how it was made must be reproducible, not a mystery file.

Needs scikit-image (dev extra) and the `espeak-ng` binary (Debian: `apt-get install espeak-ng`).
Run from the repository root: `python -m infra.make_sample`.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data

from monologue import SAMPLES
from monologue.media import AUDIO_RATE, decode_wav, encode_wav, normalise_audio

VOICE, WORDS_PER_MINUTE = "en-us", 170
SENTENCES = ("Hello! I am Monologue, a talking portrait.", "Every word you hear moves my lips.")
# Seconds of exact digital silence: before, between and after the two sentences.
LEAD, GAP, TAIL = 0.6, 1.0, 0.5
MARGIN = 0.02  # keep 20 ms around espeak's voiced part so onsets and releases are not clipped


def speak(text: str) -> np.ndarray:
    """One sentence from espeak-ng, at 16 kHz mono float32, trimmed of espeak's own leading/trailing pause."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.wav"
        cmd = ["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-w", str(out), text]
        subprocess.run(cmd, check=True)
        audio = decode_wav(normalise_audio(out.read_bytes()).wav)
    voiced = np.flatnonzero(np.abs(audio) > 0.01)
    if voiced.size == 0:
        raise SystemExit(f"espeak-ng produced silence for {text!r}")
    margin = round(MARGIN * AUDIO_RATE)
    return audio[max(voiced[0] - margin, 0) : voiced[-1] + margin + 1]


def silence(seconds: float) -> np.ndarray:
    """Exact zeros: tests compare frames in this gap with frames during speech."""
    return np.zeros(round(seconds * AUDIO_RATE), dtype=np.float32)


def main() -> None:
    """Write both files and print where the speech and the silence are."""
    SAMPLES.mkdir(parents=True, exist_ok=True)
    Image.fromarray(data.astronaut()).save(SAMPLES / "portrait.jpg", format="JPEG", quality=90)

    first, second = (speak(s) for s in SENTENCES)
    parts = [silence(LEAD), first, silence(GAP), second, silence(TAIL)]
    (SAMPLES / "speech.wav").write_bytes(encode_wav(np.concatenate(parts)))

    t, names = 0.0, ("silence", "speech 1", "silence (gap)", "speech 2", "silence")
    for name, part in zip(names, parts, strict=True):
        n = len(part) / AUDIO_RATE
        print(f"{t:6.3f} - {t + n:6.3f} s  {name}")
        t += n
    print(f"total {t:.3f} s -> {SAMPLES}")


if __name__ == "__main__":
    main()
