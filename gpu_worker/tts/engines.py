"""Which engine speaks a voice: `<engine>:<name>` (`RenderOptions.voice`) to the engine and its own name for it.
Cheap to import: Piper's package (and onnxruntime with it) loads only when its voice is first used."""

from __future__ import annotations

from gpu_worker.tts import TtsConfig, TtsEngine
from gpu_worker.tts.espeak import ESPEAK_ENGINE
from gpu_worker.tts.piper import piper_engine
from monologue.errors import InputError

ESPEAK, PIPER = "espeak", "piper"


def engine_for(voice: str, config: TtsConfig) -> tuple[TtsEngine, str]:
    """The engine a voice names and the engine's own name for it; InputError for a voice this node cannot speak."""
    engine, _, name = voice.partition(":")
    if engine == ESPEAK:
        return ESPEAK_ENGINE, name
    if engine == PIPER:
        return piper_engine(config.piper_voice, name), name
    raise InputError(f"voice: {voice!r} names no engine; use espeak:<voice> (e.g. espeak:en-us) or piper")
