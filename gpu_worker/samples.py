"""The bundled samples (monologue/samples: a portrait and a speech clip) as the pipeline takes them, read with
the standard library, numpy and Pillow alone: the GPU benchmark and render records run where PyAV is absent."""

from __future__ import annotations

import wave

import numpy as np
from PIL import Image

from gpu_worker.pipeline.types import ArrayAudio
from monologue import SAMPLES

SPEECH_RATE = 16_000  # speech.wav: 16 kHz mono 16-bit


def sample_speech(samples: int) -> ArrayAudio:
    """The bundled speech looped to `samples` samples (silence after them)."""
    with wave.open(str(SAMPLES / "speech.wav")) as source:
        pcm = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
    return ArrayAudio(np.resize(pcm.astype(np.float32) / 32768.0, samples), rate=SPEECH_RATE)


def sample_portrait() -> np.ndarray:
    """The bundled portrait, (H, W, 3) uint8 RGB."""
    return np.asarray(Image.open(SAMPLES / "portrait.jpg").convert("RGB"))
