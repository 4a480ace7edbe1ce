"""Piper (`piper-tts`, the `piper` extra: it brings onnxruntime, so no node has it unless its operator installs it)
with the one voice the operator provides: `MONOLOGUE_TTS__PIPER_VOICE`, the path of a voice's `.onnx` file with
its `.onnx.json` config beside it. A session asks for it as `voice=piper` or `voice=piper:<the file's name>`.

Timings: Piper reports how many samples each phone took only for voices exported with alignments
(`python -m piper.patch_voice_with_alignment`); with another voice the synthesis has no phones and the node
recognises them from the audio, as for an upload. Piper samples noise, so its speech differs from one synthesis to
the next: the audio is synthesised once and stored (a resume reads it back).

What it must never do: import `piper` before a session asks for it (the import loads onnxruntime), or load the
voice more than once per process.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from gpu_worker.tts import Synthesis, TimedPhone
from gpu_worker.tts.ipa import SILENCE, warp_phone
from monologue.errors import InputError

SETTING = "MONOLOGUE_TTS__PIPER_VOICE"
EXTRA = "pip install 'monologue[piper]'"


class PiperEngine:
    """One Piper voice, loaded on first use."""

    def __init__(self, model: Path, *, import_module: Callable[[str], ModuleType] = importlib.import_module) -> None:
        self.model = model
        self.config = Path(f"{model}.json")
        self._import = import_module  # a test gives one that fails, as on a node without the extra
        self._voice: Any = None
        self._lock = threading.Lock()  # one onnxruntime session; synthesise one text at a time

    def load(self) -> Any:
        """The voice (PiperVoice); InputError naming the setting, the file or the extra for what is missing."""
        if self._voice is not None:
            return self._voice
        for path, what in ((self.model, "voice file"), (self.config, "voice config")):
            if not path.is_file():
                raise InputError(
                    f"voice: this deployment's Piper {what} {path} does not exist ({SETTING} names "
                    f"{self.model}, with its .onnx.json beside it); use voice=espeak:<voice> or tell the operator"
                )
        try:
            piper = self._import("piper")
        except ImportError as err:
            raise InputError(
                f"voice: Piper is not installed on this node ({EXTRA}; it needs onnxruntime); "
                "use voice=espeak:<voice> or tell the operator"
            ) from err
        try:
            self._voice = piper.PiperVoice.load(str(self.model), config_path=str(self.config))
        except Exception as err:  # onnxruntime and json errors of a damaged or foreign file
            raise InputError(f"voice: {self.model} ({SETTING}) is not a Piper voice: {err}") from err
        return self._voice

    def synthesise(self, text: str, voice: str) -> Synthesis:
        del voice  # one voice per node: `piper_engine` checked the name
        with self._lock:
            loaded = self.load()
            chunks = list(loaded.synthesize(text, include_alignments=True))
        rate = int(loaded.config.sample_rate)
        pcm = np.concatenate([chunk.audio_int16_array for chunk in chunks]) if chunks else np.zeros(0, np.int16)
        return Synthesis(pcm=pcm, rate=rate, phones=_aligned(chunks, rate))


def _aligned(chunks: list[Any], rate: int) -> tuple[TimedPhone, ...] | None:
    """The phones of every sentence in turn, from each one's sample counts; None when a sentence has none."""
    if any(chunk.phoneme_alignments is None for chunk in chunks):
        return None
    phones: list[TimedPhone] = []
    start = 0
    for alignment in itertools.chain.from_iterable(chunk.phoneme_alignments for chunk in chunks):
        end = start + int(alignment.num_samples)
        phone = warp_phone(alignment.phoneme)
        if phone is None and phones:  # stress and length marks: the phone before lasts longer
            phones[-1] = TimedPhone(phones[-1].phone, phones[-1].start_s, end / rate)
        elif end > start:
            phones.append(TimedPhone(phone or SILENCE, start / rate, end / rate))
        start = end
    return tuple(phones)


_ENGINES: dict[Path, PiperEngine] = {}
_ENGINES_LOCK = threading.Lock()


def piper_engine(model: Path | None, name: str) -> PiperEngine:
    """The node's Piper engine for `voice=piper[:name]`; InputError naming the setting when the operator gave no
    voice file, or naming the voice it did give when another is asked for."""
    if model is None:
        raise InputError(
            f"voice: this deployment has no Piper voice ({SETTING} is not set); use voice=espeak:<voice>, "
            "e.g. espeak:en-us"
        )
    if name and name != _voice_name(model):
        raise InputError(
            f"voice: this deployment's Piper voice is piper:{_voice_name(model)} ({SETTING}), not {name!r}"
        )
    with _ENGINES_LOCK:
        return _ENGINES.setdefault(model, PiperEngine(model))


@functools.cache
def _voice_name(model: Path) -> str:
    """`en_US-lessac-medium` for …/en_US-lessac-medium.onnx."""
    return model.name.removesuffix(".onnx")
