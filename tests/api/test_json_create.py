"""JSON create bodies beside multipart, and the assets they name (`POST /v1/assets`).

The refusals run in process on SQLite and local storage without Temporal: each is a 422 naming the field, and
nothing is written (no session row, no staged upload). The whole path, asset uploads through the typed client to a
finished video, runs on the real stack."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cli.stack import Stack
from monologue import contracts as c
from monologue.client import Client
from monologue.db import SessionRow
from monologue.problems import ProblemCode
from monologue.schemas import AssetKind
from tests.api.in_process import key, make_app
from tests.helpers import api_key


@pytest.fixture
def clients(tmp_path: Path, db_sessions: Any) -> tuple[TestClient, TestClient, Path]:
    """Two tenants' clients of one app, and its storage root."""
    app = make_app(tmp_path, db_sessions)
    return (
        TestClient(app, headers=key(db_sessions, "acme")[1]),
        TestClient(app, headers=key(db_sessions, "other")[1]),
        tmp_path / "objects",
    )


def _asset(client: TestClient, kind: str, data: bytes = b"file") -> str:
    answer = client.post("/v1/assets", data={"kind": kind}, files={"file": ("f", data)})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_bad_json_bodies_are_422s_naming_the_field_and_write_nothing(
    clients: tuple[TestClient, TestClient, Path], db_sessions: Any
) -> None:
    acme, other, root = clients
    portrait, audio = _asset(acme, "portrait"), _asset(acme, "audio")
    theirs = _asset(other, "portrait")
    url = {"url": "https://example.com/speech.wav"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"portrait": {"url": "https://example.com/p.jpg", "asset_id": portrait}, "audio": url}, "body.portrait"),
        ({"portrait": {}, "audio": url}, "body.portrait: give its url or its asset_id"),
        ({"audio": url}, 'body.portrait: give {"url": …} or {"asset_id": …}, or body.avatar_id'),
        ({"portrait": {"asset_id": "0" * 32}, "audio": url}, "body.portrait.asset_id: no asset"),
        ({"portrait": {"asset_id": theirs}, "audio": url}, "body.portrait.asset_id: no asset"),  # another tenant's
        ({"portrait": {"asset_id": "../../x"}, "audio": url}, "body.portrait.asset_id: no asset"),
        ({"portrait": {"asset_id": audio}, "audio": url}, "kind=audio; this input needs one of kind=portrait"),
        ({"portrait": {"asset_id": portrait}, "audio": url, "colour": "red"}, "body.colour: Extra inputs"),
        ({"portrait": {"asset_id": portrait}, "audio": url, "fps": 1000}, "body.fps"),
    ]
    for body, problem in cases:
        answer = acme.post("/v1/renders", json=body)
        assert answer.status_code == 422 and problem in answer.json()["detail"], (body, answer.text)
        assert answer.json()["code"] == ProblemCode.INVALID_REQUEST.value
    live = acme.post("/v1/sessions", json={"portrait": {"asset_id": audio}})
    assert live.status_code == 422 and "kind=portrait" in live.json()["detail"]
    for raw in ("{", "[" * 5000, '{"portrait": ' + "[" * 5000 + "}"):
        answer = acme.post("/v1/renders", content=raw, headers={"Content-Type": "application/json"})
        assert answer.status_code == 422 and answer.json()["detail"].startswith("body: "), answer.text
    with db_sessions() as db:
        assert db.query(SessionRow).count() == 0
    assert not (root / "sessions").exists()


def test_assets_belong_to_their_tenant(clients: tuple[TestClient, TestClient, Path]) -> None:
    acme, other, root = clients
    asset = _asset(acme, "audio", b"speech")
    assert other.delete(f"/v1/assets/{asset}").status_code == 404  # not 403: ids of others do not leak
    assert [path.name for path in root.rglob("*") if path.is_file()] == ["audio"]
    assert acme.delete(f"/v1/assets/{asset}").status_code == 204
    assert acme.delete(f"/v1/assets/{asset}").status_code == 404
    assert not [path for path in root.rglob("*") if path.is_file()]
    bad_kind = acme.post("/v1/assets", data={"kind": "video"}, files={"file": ("f", b"x")})
    assert bad_kind.status_code == 422 and "kind" in bad_kind.json()["detail"]
    empty = acme.post("/v1/assets", data={"kind": "audio"}, files={"file": ("f", b"")})
    assert empty.status_code == 422 and "empty" in empty.json()["detail"]


def test_the_schema_shows_both_content_types_for_creates(clients: tuple[TestClient, TestClient, Path]) -> None:
    paths = clients[0].get("/openapi.json").json()["paths"]
    for path in ("/v1/renders", "/v1/sessions"):
        content = paths[path]["post"]["requestBody"]["content"]
        assert set(content) == {"multipart/form-data", "application/json"}
        fields = content["application/json"]["schema"]["properties"]
        assert {"portrait"} | {spec.name for spec in dataclasses.fields(c.RenderOptions)} <= set(fields)


@pytest.mark.slow
def test_a_render_from_uploaded_assets_through_the_typed_client_completes(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        portrait = client.upload_asset(sample_portrait, kind=AssetKind.PORTRAIT)
        audio = client.upload_asset(sample_speech, kind=AssetKind.AUDIO)
        created = client.create_render(portrait=portrait, audio=audio, options={"preview": True, "seed": 3})
        assert created.options.seed == 3  # type: ignore[attr-defined]
        done = client.wait(created.id, timeout_s=240)
        assert done.status == "completed" and done.progress.frames_total, done.error
        client.delete_asset(portrait.id)
