"""A bad output size is a 422 naming the field from both create forms (multipart and JSON), in process (no
Temporal: the refusal comes before any input is checked on a node), and nothing is written; the OpenAPI schema
lists `width` and `height` with their limits; on the real stack, a render asked for at a size through the typed
client comes out at exactly that size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cli.stack import Stack
from monologue.client import Client
from monologue.db import SessionRow
from tests.api.in_process import key, make_app
from tests.helpers import api_key, decode_video

URL = "https://example.com/input"


def test_a_bad_size_is_a_422_naming_the_field_from_a_form_or_a_json_body(tmp_path: Path, db_sessions: Any) -> None:
    client = TestClient(make_app(tmp_path, db_sessions), headers=key(db_sessions, "acme")[1])
    cases: list[tuple[dict[str, Any], str]] = [
        ({"width": 481, "height": 640}, "width: Input should be a multiple of 2"),
        ({"width": 480}, "width and height go together"),
        ({"width": 480, "height": 640, "resolution": "720p"}, "got resolution=720p, width=480, height=640"),
        ({"width": 480, "height": 640, "family": "infinitetalk"}, "the infinitetalk family renders only its own"),
    ]
    for fields, problem in cases:
        form = client.post("/v1/renders", data={"portrait_url": URL, "audio_url": URL, **fields})
        body = client.post("/v1/renders", json={"portrait": {"url": URL}, "audio": {"url": URL}, **fields})
        for answer in (form, body):
            assert answer.status_code == 422 and problem in answer.json()["detail"], (fields, answer.text)
    with db_sessions() as db:
        assert db.query(SessionRow).count() == 0
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"width", "height"} <= set(
        next(v for k, v in schemas.items() if k.startswith("Body_create_render"))["properties"]
    )
    width = next(kind for kind in schemas["RenderOptionsModel"]["properties"]["width"]["anyOf"] if "type" in kind)
    assert (width["type"], width["minimum"], width["maximum"], width["multipleOf"]) == ("integer", 32, 2048, 2)


@pytest.mark.slow
def test_a_render_at_a_size_through_the_typed_client_has_frames_of_exactly_that_size(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes, tmp_path: Path
) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        created = client.create_render(
            portrait=sample_portrait, audio=sample_speech, options={"width": 160, "height": 224, "seed": 5}
        )
        assert (created.options.width, created.options.height) == (160, 224)  # type: ignore[attr-defined]
        done = client.wait(created.id, timeout_s=240)
        assert done.status == "completed", done.error
        client.download(done.id, tmp_path / "out.mp4")
    frames, _, _ = decode_video((tmp_path / "out.mp4").read_bytes())
    assert frames.shape[1:] == (224, 160, 3)
