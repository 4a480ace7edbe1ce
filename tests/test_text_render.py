"""Text in, on the real stack: a render given `text` instead of audio is spoken by espeak-ng on a node, stored where
an upload's audio goes (so a resume reads the same speech), and becomes a video whose audio track is the synthesised
speech; through the typed client and the CLI. A voice the node cannot speak is a 422 naming what to set, and leaves
nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import main
from cli.stack import Stack
from gpu_worker.tts import phones_json
from gpu_worker.tts.espeak import ESPEAK_ENGINE
from monologue import contracts as c
from monologue.client import Client
from monologue.media import AUDIO_RATE, encode_wav, normalise_audio
from monologue.schemas import RenderPublic
from tests.api.test_bad_input import _state
from tests.helpers import api_key, decode_video, get, post

pytestmark = pytest.mark.slow
TEXT = "Bob and his mama buy five blue boots."
OPTIONS = {"text": TEXT, "voice": "espeak:en-us", "preview": True, "seed": 5}


def _inputs(stack: Stack, session_id: str) -> Path:
    root = stack.settings.storage.root
    assert root is not None
    return root / "sessions" / session_id / "input"


def test_a_render_from_text_speaks_the_synthesised_audio_through_the_client_and_the_cli(
    stack: Stack, api_url: str, sample_portrait: bytes, tmp_path: Path
) -> None:
    synthesis = ESPEAK_ENGINE.synthesise(TEXT, "en-us")  # what the node must have made: espeak-ng is deterministic
    speech = normalise_audio(encode_wav(synthesis.pcm, synthesis.rate))
    seconds = speech.samples / AUDIO_RATE
    with Client(api_url, api_key=api_key(api_url)) as client:
        created = client.create_render(portrait=sample_portrait, options=OPTIONS)
        assert created.audio_seconds == pytest.approx(seconds, abs=1e-3)
        done = client.wait(created.id, timeout_s=240)
        assert done.status == c.SessionStatus.COMPLETED, done.error
    stored = _inputs(stack, created.id)
    assert (stored / "audio.wav").read_bytes() == speech.wav  # stored like an upload: what every chunk reads
    assert (stored / "phones.json").read_bytes() == phones_json(synthesis.phones or ())
    video = get(done.links.video, timeout=60)  # type: ignore[union-attr]
    frames, video_seconds, audio_seconds = decode_video(video.content)
    assert abs(audio_seconds - seconds) <= 0.040 and abs(video_seconds - seconds) <= 0.080
    assert abs(len(frames) - round(seconds * 25)) <= 1

    portrait = tmp_path / "portrait.jpg"
    portrait.write_bytes(sample_portrait)
    runner = CliRunner(env={"MONOLOGUE_API_KEY": api_key(api_url) or ""})
    neither = runner.invoke(main, ["render", str(portrait), "--api", api_url])
    assert neither.exit_code == 2 and "give AUDIO or --text" in neither.output
    rest = ["--text", TEXT, "--voice", "espeak:en-us", "--preview", "--no-wait", "--json", "--api", api_url]
    result = runner.invoke(main, ["render", str(portrait), *rest])
    assert result.exit_code == 0, result.output
    again = RenderPublic.model_validate_json(result.stdout)
    with Client(api_url, api_key=api_key(api_url)) as client:
        assert client.wait(again.id, timeout_s=240).status == c.SessionStatus.COMPLETED
    assert (_inputs(stack, again.id) / "audio.wav").read_bytes() == speech.wav  # another session, the same speech


@pytest.mark.parametrize(
    ("voice", "problem"),
    [
        ("piper", "voice: this deployment has no Piper voice (MONOLOGUE_TTS__PIPER_VOICE is not set)"),
        ("espeak:xx-nowhere", "voice: espeak-ng has no voice 'xx-nowhere'"),
    ],
)
def test_a_voice_the_node_cannot_speak_is_a_422_that_leaves_nothing(
    voice: str, problem: str, stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    before = _state(stack)
    data = {"text": "Hello there.", "voice": voice}
    answer = post(f"{api_url}/v1/renders", files={"portrait": ("p.jpg", sample_portrait)}, data=data, timeout=60)
    assert answer.status_code == 422 and problem in answer.json()["detail"], answer.text
    assert _state(stack) == before
