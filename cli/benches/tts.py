"""`monologue bench tts`: what speech from text costs the node that checks a new session's inputs, per second of
speech: the synthesis (espeak-ng in its child process, or Piper) and the normalisation an upload gets too, as
`validate_inputs` runs them. Prints wall and CPU seconds (the child's CPU included) per second of speech (figures
for docs/benchmarks.md; nothing here asserts)."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_worker.tts import TtsConfig
from gpu_worker.tts.engines import engine_for
from monologue.media import AUDIO_RATE, encode_wav, normalise_audio

PARAGRAPH = (
    "Every word you hear moves my lips. Monologue turns a portrait and a few sentences into a talking video, "
    "and the speech itself can come from text: the node speaks it, times each sound, and shapes the mouth to match. "
)


@dataclass(frozen=True)
class TtsReport:
    voice: str
    chars: int
    speech_s: float
    wall_s: float
    cpu_s: float

    def line(self) -> str:
        return (
            f"{self.voice}: {self.chars} characters -> {self.speech_s:.1f} s of speech in {self.wall_s:.2f} s "
            f"({self.wall_s / self.speech_s:.4f} s per second of speech; CPU {self.cpu_s / self.speech_s:.4f} s/s)"
        )


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_tts(*, voice: str, chars: int, piper_voice: Path | None = None, repeats: int = 3) -> TtsReport:
    """The best of `repeats` syntheses of `chars` characters of prose in `voice`, normalised as the node does."""
    text = (PARAGRAPH * (chars // len(PARAGRAPH) + 1))[:chars]
    engine, name = engine_for(voice, TtsConfig(piper_voice=piper_voice))
    best: TtsReport | None = None
    for _ in range(repeats):
        started, cpu = time.perf_counter(), _cpu_s()
        synthesis = engine.synthesise(text, name)
        speech = normalise_audio(encode_wav(synthesis.pcm, synthesis.rate))
        report = TtsReport(voice, chars, speech.samples / AUDIO_RATE, time.perf_counter() - started, _cpu_s() - cpu)
        best = report if best is None or report.wall_s < best.wall_s else best
    assert best is not None
    return best
