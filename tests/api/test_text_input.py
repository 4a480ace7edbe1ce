"""A render's speech as `text` (and a `voice`) instead of audio: the refusals the API makes itself, in process on
SQLite and local storage without Temporal (each a 422 naming the fields, nothing written), and the schema that
lists both. The synthesis on a node, to a finished video, runs on the real stack (tests/test_text_render.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from monologue.contracts.session import TEXT_MAX_CHARS
from monologue.db import SessionRow
from tests.api.in_process import key, make_app

PORTRAIT = ("portrait.png", b"not decoded: refused before any node is asked")
AUDIO = ("speech.wav", b"RIFF")


def test_text_and_audio_voice_and_the_text_s_bounds_are_422s_that_write_nothing(
    tmp_path: Path, db_sessions: Any
) -> None:
    client = TestClient(make_app(tmp_path, db_sessions), headers=key(db_sessions, "acme")[1])
    multipart: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"text": "Hello."}, {"audio": AUDIO}, "text, audio: send the speech as audio or as text"),
        ({"text": "Hello.", "audio_url": "https://example.com/a.wav"}, {}, "text, audio: send the speech"),
        ({"voice": "espeak:en-gb"}, {"audio": AUDIO}, "voice: the voice is what text is spoken in"),
        ({}, {}, "audio: send the file (audio) or its URL (audio_url), or the text to speak (text)"),
        ({"text": "x" * (TEXT_MAX_CHARS + 1)}, {}, "text"),
        ({"text": "Hello.", "voice": "say:hello"}, {}, "voice"),
        ({"text": "Hello.", "voice": "espeak:en us"}, {}, "voice"),
        ({"text": "Bob.", "transcript": "Bob."}, {}, "transcript: a session spoken from text"),
    ]
    for data, files, problem in multipart:
        answer = client.post("/v1/renders", data=data, files={"portrait": PORTRAIT, **files})
        assert answer.status_code == 422 and problem in answer.json()["detail"], (data, answer.text)
    portrait = {"url": "https://example.com/p.jpg"}
    bodies: list[tuple[dict[str, Any], str]] = [
        ({"portrait": portrait}, 'body.audio: give {"url": …} or {"asset_id": …}, or the text to speak (text)'),
        ({"portrait": portrait, "audio": {"url": "https://e.com/a.wav"}, "text": "Hi."}, "text, audio"),
        ({"portrait": portrait, "text": "Hi.", "voice": "piper:a b"}, "body.voice"),
    ]
    for body, problem in bodies:
        answer = client.post("/v1/renders", json=body)
        assert answer.status_code == 422 and problem in answer.json()["detail"], (body, answer.text)
    live = client.post("/v1/sessions", data={"text": "Hello."}, files={"portrait": PORTRAIT})
    assert live.status_code == 422 and "text, voice: a live session speaks the audio" in live.json()["detail"]
    with db_sessions() as db:
        assert db.query(SessionRow).count() == 0
    assert not (tmp_path / "objects" / "sessions").exists()


def test_the_schema_lists_text_and_voice_and_audio_is_optional(tmp_path: Path, db_sessions: Any) -> None:
    client = TestClient(make_app(tmp_path, db_sessions), headers=key(db_sessions, "acme")[1])
    spec = client.get("/openapi.json").json()
    content = spec["paths"]["/v1/renders"]["post"]["requestBody"]["content"]
    found = {}
    for kind in ("multipart/form-data", "application/json"):
        schema = content[kind]["schema"]
        if "$ref" in schema:
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        assert {"text", "voice"} <= set(schema["properties"]), kind
        assert "audio" not in schema.get("required", []), kind
        found[kind] = schema["properties"]
    text, voice = found["application/json"]["text"], found["application/json"]["voice"]
    assert text["anyOf"][0]["maxLength"] == TEXT_MAX_CHARS and "espeak" in voice["anyOf"][0]["pattern"]
