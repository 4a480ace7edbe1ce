"""Captions on the real stack: a render spoken from `text` with `captions=files` has WebVTT and SRT files of the
text's words, in order, within its audio, from the API (key and signed playback link), the typed client and the CLI
(which writes them beside the video). Captions without the words spoken, on a live session, or from a transcript
that does not align are a 422 naming the field, and leave nothing behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import main
from cli.stack import Stack
from gpu_worker.tts.espeak import ESPEAK_ENGINE
from monologue import contracts as c
from monologue.captions import CaptionFormat
from monologue.client import Client
from monologue.media import AUDIO_RATE, encode_wav, normalise_audio
from monologue.schemas import RenderPublic
from tests.api.test_bad_input import _state
from tests.helpers import api_key, get, post

pytestmark = pytest.mark.slow
TEXT = "Bob and his mama buy five blue boots. Then they walk home, slowly!"
OPTIONS = {"text": TEXT, "voice": "espeak:en-us", "preview": True, "captions": "files"}
_VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n((?:.+\n?)+)")


def _vtt_cues(vtt: str) -> list[tuple[float, float, str]]:
    """(start, end, text) of each cue, read back with a parser of the test's own."""
    assert vtt.startswith("WEBVTT\n\n")
    cues = []
    for match in _VTT_CUE.finditer(vtt):
        h1, m1, s1, ms1, h2, m2, s2, ms2 = (int(part) for part in match.groups()[:8])
        cues.append((h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000, match[9].strip()))
    return cues


def test_a_render_from_text_has_captions_of_its_words_through_the_api_the_client_and_the_cli(
    stack: Stack, api_url: str, sample_portrait: bytes, tmp_path: Path
) -> None:
    synthesis = ESPEAK_ENGINE.synthesise(TEXT, "en-us")
    seconds = normalise_audio(encode_wav(synthesis.pcm, synthesis.rate)).samples / AUDIO_RATE
    portrait = tmp_path / "portrait.jpg"
    portrait.write_bytes(sample_portrait)
    runner = CliRunner(env={"MONOLOGUE_API_KEY": api_key(api_url) or ""})
    output = tmp_path / "out.mp4"
    args = ["render", str(portrait), "--text", TEXT, "--preview", "--captions", "files", "-o", str(output)]
    result = runner.invoke(main, [*args, "--json", "--api", api_url])
    assert result.exit_code == 0, result.output
    done = RenderPublic.model_validate_json(result.stdout)
    assert done.status == c.SessionStatus.COMPLETED and output.stat().st_size > 0

    cues = _vtt_cues(output.with_suffix(".vtt").read_text())
    assert " ".join(text.replace("\n", " ") for _, _, text in cues).split() == TEXT.split()
    assert [text for _, _, text in cues] == ["Bob and his mama buy five blue boots.", "Then they walk home, slowly!"]
    assert all(start < end for start, end, _ in cues) and cues[0][1] <= cues[1][0]
    assert 0 < cues[0][0] < 0.5 and seconds - 0.5 < cues[-1][1] <= seconds
    srt = output.with_suffix(".srt").read_text()
    assert srt.startswith("1\n00:00:00,") and "\n\n2\n" in srt and "Then they walk home, slowly!" in srt

    links = done.links.captions
    assert links is not None and done.links.playback is not None and done.links.playback.captions is not None
    with Client(api_url, api_key=api_key(api_url)) as client:
        assert client.captions(done.id) == output.with_suffix(".vtt").read_text()
        assert client.captions(done.id, CaptionFormat.SRT) == srt
    served = get(done.links.playback.captions.vtt, timeout=30)  # a viewer's link: no API key
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/vtt")
    assert served.text == output.with_suffix(".vtt").read_text()


def test_a_render_with_a_transcript_has_captions_of_the_transcript_s_words(
    api_url: str, sample_portrait: bytes
) -> None:
    """Audio and its transcript: the captions exist once the session is created (made while its inputs were
    checked), with the transcript's words as written, within the audio."""
    synthesis = ESPEAK_ENGINE.synthesise(TEXT, "en-us")
    options = {"transcript": TEXT, "captions": "files", "preview": True}
    with Client(api_url, api_key=api_key(api_url)) as client:
        created = client.create_render(
            portrait=sample_portrait, audio=encode_wav(synthesis.pcm, synthesis.rate), options=options
        )
        cues = _vtt_cues(client.captions(created.id))
        client.cancel(created.id)
    assert [text for _, _, text in cues] == ["Bob and his mama buy five blue boots.", "Then they walk home, slowly!"]
    assert cues[0][1] <= cues[1][0] and cues[-1][1] <= (created.audio_seconds or 0)


def test_a_render_without_captions_has_no_caption_links(api_url: str, sample_portrait: bytes) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        created = client.create_render(portrait=sample_portrait, options={"text": "Hi.", "preview": True})
        assert created.links.captions is None and created.links.playback is not None
        assert created.links.playback.captions is None
        client.cancel(created.id)


def test_the_openapi_schema_lists_the_option_the_links_and_the_files(api_url: str) -> None:
    schema = get(f"{api_url}/openapi.json", timeout=30).json()
    components = schema["components"]["schemas"]
    assert set(components["CaptionLinks"]["properties"]) == {"vtt", "srt"}
    assert "captions" in components["RenderLinks"]["properties"]
    assert "captions" in components["PlaybackLinks"]["properties"]
    assert components["CaptionMode"]["enum"] == ["none", "files", "burn"]
    files = schema["paths"]["/v1/renders/{session_id}/{name}"]["get"]["responses"]["200"]["content"]
    assert {"text/vtt", "application/x-subrip"} <= set(files)


def _speech() -> bytes:
    synthesis = ESPEAK_ENGINE.synthesise("Hello there.", "en-us")
    return encode_wav(synthesis.pcm, synthesis.rate)


@pytest.mark.parametrize(
    ("route", "data", "audio", "problem"),
    [
        ("renders", {"captions": "files"}, True, "captions: need the words spoken"),
        ("sessions", {"captions": "files", "transcript": "Hello there."}, False, "captions"),
        ("renders", {"captions": "files", "transcript": "Hello there. " * 30}, True, "transcript: the speech does not"),
        ("renders", {"captions": "subtitles", "text": "Hi."}, False, "captions"),
    ],
)
def test_bad_captions_are_a_422_naming_the_field_that_leaves_nothing(
    route: str, data: dict[str, str], audio: bool, problem: str, stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    before = _state(stack)
    files = {"portrait": ("p.jpg", sample_portrait)} | ({"audio": ("a.wav", _speech())} if audio else {})
    answer = post(f"{api_url}/v1/{route}", files=files, data=data, timeout=60)
    assert answer.status_code == 422 and problem in str(answer.json()["detail"]), answer.text
    assert _state(stack) == before
