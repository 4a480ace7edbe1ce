"""Speech from text (`gpu_worker/tts/`): espeak-ng's audio and phone timings, the same bytes for the same text, the
phones on the warp family's set driving the visemes with no recognition, and Piper's loading code up to the voice
file it cannot have here (every way a node without one fails names what to set or install)."""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpu_worker.models.warp.alignment import AlignedPhones
from gpu_worker.models.warp.features import SpeechContext
from gpu_worker.models.warp.phonemes import PHONE_IDS, PHONES
from gpu_worker.models.warp.visemes import TARGET_NAMES
from gpu_worker.pipeline import ArrayAudio, ChunkRequest
from gpu_worker.pipeline.types import AudioWindow
from gpu_worker.tts import TimedPhone, TtsConfig, phones_json, read_phones
from gpu_worker.tts.engines import engine_for
from gpu_worker.tts.espeak import CHILD, ESPEAK_ENGINE
from gpu_worker.tts.ipa import SILENCE, warp_phone
from gpu_worker.tts.piper import SETTING, PiperEngine, _aligned, piper_engine
from monologue.contracts import Chunk, LipSync
from monologue.errors import InputError
from monologue.media import decode_wav, encode_wav, normalise_audio

TEXT = "Mama buys five blue boots. We see the moon!"
# Every English sound, and most of Spanish (for the voices' phone names, as their phoneme events give them).
PANGRAMS = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! She sells sea shells; "
    "thirty-three thieves thought they thrilled the throne. Roses, measure, azure, vision, church, judge, singing, "
    "button, bottle, water, hurry, fire, hour, poor, air, ear, boy, cow, law, father, cot, caught, book, bird, usual."
)


@pytest.fixture(scope="module")
def spoken() -> Any:
    return ESPEAK_ENGINE.synthesise(TEXT, "en-us")


def test_espeak_gives_speech_and_phones_that_tile_it(spoken: Any) -> None:
    """Each phone starts where the one before ends, inside the audio, the last at its end; and the speech is
    under the phones: nearly every loud 10 ms of the audio lies in a phone that is not silence."""
    phones = spoken.phones
    assert spoken.rate == 22_050 and 2.0 < spoken.seconds < 5.0 and spoken.pcm.dtype == np.int16
    assert phones[0].start_s >= 0 and phones[-1].end_s == pytest.approx(spoken.seconds)
    assert all(a.end_s == b.start_s and a.start_s < a.end_s for a, b in itertools.pairwise(phones))
    assert {phone.phone for phone in phones} <= set(PHONES)
    step = spoken.rate // 100
    loud = [
        index * step / spoken.rate
        for index in range(spoken.pcm.size // step)
        if np.abs(spoken.pcm[index * step : (index + 1) * step].astype(np.int32)).max() > 2000
    ]
    voiced = [t for t in loud if any(p.start_s <= t < p.end_s and p.phone != SILENCE for p in phones)]
    assert len(loud) > 100 and len(voiced) >= 0.97 * len(loud)
    words = [phone.phone for phone in phones if phone.phone != SILENCE]
    assert words[:6] == ["M", "AA", "M", "AH", "B", "AY"] and "F" in words and "UW" in words


def test_the_same_text_and_voice_give_the_same_bytes(spoken: Any) -> None:
    again = ESPEAK_ENGINE.synthesise(TEXT, "en-us")
    assert hashlib.sha256(again.pcm.tobytes()).digest() == hashlib.sha256(spoken.pcm.tobytes()).digest()
    assert again.phones == spoken.phones
    assert ESPEAK_ENGINE.synthesise(TEXT, "en-gb").pcm.tobytes() != spoken.pcm.tobytes()  # the voice matters
    assert read_phones(phones_json(spoken.phones)) == spoken.phones  # stored and read back exactly


@pytest.mark.parametrize("voice", ["en-us", "en-gb", "es"])
def test_every_ipa_phone_espeak_speaks_has_a_warp_phone(voice: str) -> None:
    """The IPA names of every phoneme event the voice gives for the pangrams (from the child, before mapping)."""
    done = subprocess.run([sys.executable, "-I", str(CHILD), voice], input=PANGRAMS.encode(), capture_output=True)
    names = {str(name) for _, name in json.loads(done.stdout.partition(b"\n")[0])["events"]}
    spoken = {name for name in names if any(ch.isalpha() for ch in name)}
    assert len(spoken) > 25 and not [name for name in spoken if warp_phone(name) not in PHONES]
    assert warp_phone("") == SILENCE and warp_phone(" ") == SILENCE and warp_phone(",") == SILENCE
    assert warp_phone("ˈ") is None and warp_phone("ː") is None  # marks: the phone before goes on
    assert [warp_phone(name) for name in ("ø", "ɾ", "ã", "tʃ")] == ["OW", "D", "AA", "CH"]


def test_an_unknown_voice_or_engine_is_an_input_error() -> None:
    with pytest.raises(InputError, match="voice: espeak-ng has no voice 'xx-nowhere'"):
        ESPEAK_ENGINE.synthesise("Hello.", "xx-nowhere")
    with pytest.raises(InputError, match="voice: 'say:it' names no engine"):
        engine_for("say:it", TtsConfig())


def test_the_synthesised_phones_drive_the_visemes_without_recognition(spoken: Any) -> None:
    """A text session's steps are its engine's phones, and the context of a chunk reads them: the lips close on
    the m of "Mama" and no window goes through the recogniser."""
    speech = normalise_audio(encode_wav(spoken.pcm, spoken.rate))
    samples = decode_wav(speech.wav)
    context = SpeechContext()
    prepared = context.prepare_phones(ArrayAudio(samples), spoken.phones)
    assert isinstance(prepared, AlignedPhones) and prepared.steps.size == samples.size // 160
    for phone in spoken.phones:
        middle = round((phone.start_s + phone.end_s) / 2 * 100)
        assert prepared.steps[middle] == PHONE_IDS[phone.phone], phone
    fps, frames = 25, 30
    start, end = context.audio_range(ChunkRequest(Chunk("N", 0, 0, frames), lip_sync=LipSync.VISEMES), fps, 16_000)
    window = AudioWindow(ArrayAudio(samples).read(start, end), start, 16_000, fps, prepared=prepared)
    found = context.context(window, ChunkRequest(Chunk("N", 0, 0, frames), lip_sync=LipSync.VISEMES), None)  # type: ignore[arg-type]
    press = found["visemes"][:, TARGET_NAMES.index("press")]  # (frames,)
    first_m = next(phone for phone in spoken.phones if phone.phone == "M")
    assert press[round((first_m.start_s + first_m.end_s) / 2 * fps)] > 0.5
    assert context.recogniser.decoded == 0


def test_piper_without_a_voice_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"no Piper voice \\({SETTING} is not set\\)"):
        engine_for("piper", TtsConfig())
    model = tmp_path / "en_US-test-low.onnx"
    with pytest.raises(InputError, match=f"Piper voice file {model} does not exist \\({SETTING}"):
        engine_for("piper:en_US-test-low", TtsConfig(piper_voice=model))[0].synthesise("Hi.", "")
    model.write_bytes(b"not onnx")
    with pytest.raises(InputError, match=r"Piper voice config .*en_US-test-low\.onnx\.json does not exist"):
        PiperEngine(model).load()
    with pytest.raises(InputError, match=r"Piper voice is piper:en_US-test-low .*, not 'other'"):
        piper_engine(model, "other")


def test_piper_s_loading_code_names_the_extra_and_a_file_that_is_no_voice(tmp_path: Path) -> None:
    """The real package (the dev extra has it) refuses a file that is no voice, with its config or its model; a node
    without the package (an importer that fails, as there) hears which extra to install."""
    model = tmp_path / "voice.onnx"
    model.write_bytes(b"not onnx")
    config = Path(f"{model}.json")
    config.write_text("{}")
    with pytest.raises(InputError, match=f"voice.onnx \\({SETTING}\\) is not a Piper voice"):
        PiperEngine(model).load()
    espeak = {"voice": "en-us"}
    config.write_text(
        json.dumps(
            {"num_symbols": 2, "num_speakers": 1, "audio": {"sample_rate": 22050}}
            | {"espeak": espeak, "phoneme_id_map": {"_": [0]}}
        )
    )
    with pytest.raises(InputError, match=r"is not a Piper voice: .*(INVALID_PROTOBUF|protobuf)"):
        PiperEngine(model).load()

    def missing(name: str) -> ModuleType:
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(InputError, match=r"Piper is not installed on this node \(pip install 'monologue\[piper\]'"):
        PiperEngine(model, import_module=missing).load()


def test_piper_s_alignments_become_timed_phones() -> None:
    """Piper's answer (per sentence, the samples of each phone, BOS and EOS included) on the timeline: marks
    lengthen the phone before; a sentence without alignments leaves the phones to recognition."""

    def chunk(*aligned: tuple[str, int]) -> Any:
        return SimpleNamespace(phoneme_alignments=[SimpleNamespace(phoneme=p, num_samples=n) for p, n in aligned])

    first = chunk(("^", 100), ("b", 200), ("ˈ", 50), ("ɑ", 400), ("b", 250), ("$", 0))
    second = chunk(("^", 100), ("m", 300), (" ", 100), ("$", 100))
    phones = _aligned([first, second], rate=1000)
    assert phones == (
        TimedPhone("SIL", 0.0, 0.1),
        TimedPhone("B", 0.1, 0.35),
        TimedPhone("AA", 0.35, 0.75),
        TimedPhone("B", 0.75, 1.0),
        TimedPhone("SIL", 1.0, 1.1),
        TimedPhone("M", 1.1, 1.4),
        TimedPhone("SIL", 1.4, 1.5),
        TimedPhone("SIL", 1.5, 1.6),
    )
    assert _aligned([first, SimpleNamespace(phoneme_alignments=None)], rate=1000) is None
