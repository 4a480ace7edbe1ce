"""Avatars (`/v1/avatars`): a portrait checked once and named by `avatar_id` in renders and live sessions.

The refusals and the tenant scoping run in process on SQLite and local storage without Temporal: each refusal is a
4xx naming the field, and nothing is written. The whole path (an avatar made on a node, renders and a live session
from it, the same frames as from the portrait, a delete refused while in use) runs on the real stack."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from PIL import Image

from cli.main import main
from cli.stack import Stack
from monologue import SAMPLES, keys
from monologue.client import ApiError, AsyncClient, Client
from monologue.db import AvatarRow, SessionRow
from monologue.media import normalise_audio
from monologue.schemas import AssetKind
from tests.api.in_process import key, make_app, stored
from tests.helpers import api_key

AVATAR = "0" * 12 + "a" * 20  # an id as `keys.new_asset_id` makes them


@pytest.fixture
def clients(tmp_path: Path, db_sessions: Any) -> tuple[TestClient, TestClient, Path]:
    """Two tenants' clients of one app, and its storage root."""
    app = make_app(tmp_path, db_sessions)
    return (
        TestClient(app, headers=key(db_sessions, "acme")[1]),
        TestClient(app, headers=key(db_sessions, "other")[1]),
        tmp_path / "objects",
    )


def _avatar_of(db_sessions: Any, root: Path, tenant: str = "acme", avatar_id: str = AVATAR) -> None:
    """An avatar as `POST /v1/avatars` leaves it: its row and its normalised portrait."""
    with db_sessions() as db, db.begin():
        db.add(AvatarRow(id=avatar_id, tenant=tenant, width=64, height=64, portrait_sha256="f" * 64))
    portrait = root / keys.avatar_portrait(keys.avatar_prefix(tenant, avatar_id))
    portrait.parent.mkdir(parents=True)
    portrait.write_bytes(b"png")


def test_creates_that_name_an_avatar_wrongly_are_422s_naming_the_field_and_write_nothing(
    clients: tuple[TestClient, TestClient, Path], db_sessions: Any
) -> None:
    acme, _other, root = clients
    _avatar_of(db_sessions, root, tenant="other")  # another tenant's: no avatar for acme
    audio = {"audio": ("a.wav", b"RIFF")}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"data": {"avatar_id": AVATAR}, "files": {"portrait": ("p.png", b"x"), **audio}}, "portrait, avatar_id"),
        ({"data": {"avatar_id": AVATAR, "portrait_url": "https://example.com/p.png"}, "files": audio}, "avatar_id"),
        ({"files": audio}, "portrait: send the file (portrait) or its URL (portrait_url), or an avatar's id"),
        ({"data": {"avatar_id": AVATAR}, "files": audio}, f"avatar_id: no avatar '{AVATAR}' for this key's tenant"),
        ({"data": {"avatar_id": "../../x"}, "files": audio}, "avatar_id: no avatar"),
        (
            {"json": {"avatar_id": AVATAR, "portrait": {"url": "https://example.com/p.png"}, "text": "hi"}},
            "body.portrait, body.avatar_id",
        ),
        ({"json": {"text": "hi"}}, 'body.portrait: give {"url": …} or {"asset_id": …}, or body.avatar_id'),
        ({"json": {"avatar_id": AVATAR, "text": "hi"}}, "avatar_id: no avatar"),
    ]
    for request, problem in cases:
        answer = acme.post("/v1/renders", **request)
        assert answer.status_code == 422 and problem in answer.json()["detail"], (request, answer.text)
    live = acme.post("/v1/sessions", data={"avatar_id": AVATAR}, files={"portrait": ("p.png", b"x")})
    assert live.status_code == 422 and "portrait, avatar_id" in live.json()["detail"], live.text
    live = acme.post("/v1/sessions", json={"avatar_id": AVATAR})
    assert live.status_code == 422 and "avatar_id: no avatar" in live.json()["detail"], live.text
    with db_sessions() as db:
        assert db.query(SessionRow).count() == 0
    assert not (root / "sessions").exists()


def test_avatars_belong_to_their_tenant_and_bad_creates_keep_nothing(
    clients: tuple[TestClient, TestClient, Path], db_sessions: Any
) -> None:
    acme, other, root = clients
    _avatar_of(db_sessions, root)
    listed = acme.get("/v1/avatars").json()
    assert [item["id"] for item in listed["items"]] == [AVATAR] and listed["limit"] == 50
    assert acme.get(f"/v1/avatars/{AVATAR}").json()["width"] == 64
    assert other.get("/v1/avatars").json()["items"] == []
    for answer in (other.get(f"/v1/avatars/{AVATAR}"), other.delete(f"/v1/avatars/{AVATAR}")):
        assert answer.status_code == 404, answer.text  # not 403: ids of others do not leak
    assert acme.get("/v1/avatars/../x").status_code == 404
    refusals: list[tuple[dict[str, Any], str]] = [
        ({}, "portrait"),
        ({"files": {"portrait": ("p.png", b"")}}, "portrait: the uploaded file is empty"),
        ({"json": {}}, "body.portrait: Field required"),
        ({"json": {"portrait": {"asset_id": "0" * 32}}}, "body.portrait.asset_id: no asset"),
        ({"json": {"portrait": {"url": "https://example.com/p.png", "asset_id": "0" * 32}}}, "body.portrait"),
    ]
    for request, problem in refusals:
        answer = acme.post("/v1/avatars", **request)
        assert answer.status_code == 422 and problem in answer.json()["detail"], (request, answer.text)
    with db_sessions() as db:
        assert db.query(AvatarRow).count() == 1
    assert sorted(path.name for path in root.rglob("*") if path.is_file()) == ["portrait.png"]


def test_an_avatar_in_use_is_not_deleted_until_its_sessions_end(
    clients: tuple[TestClient, TestClient, Path], db_sessions: Any
) -> None:
    acme, _other, root = clients
    _avatar_of(db_sessions, root)
    stored(db_sessions, "s-using")
    with db_sessions() as db, db.begin():
        db.get(SessionRow, "s-using").avatar_id = AVATAR
    refused = acme.delete(f"/v1/avatars/{AVATAR}")
    assert refused.status_code == 409 and "s-using" in refused.json()["detail"], refused.text
    assert acme.get(f"/v1/avatars/{AVATAR}").status_code == 200 and any(root.rglob("portrait.png"))
    with db_sessions() as db, db.begin():
        row = db.get(SessionRow, "s-using")
        row.status, row.finished_at = "completed", datetime.now(UTC)
    assert acme.delete(f"/v1/avatars/{AVATAR}").status_code == 204
    assert acme.get(f"/v1/avatars/{AVATAR}").status_code == 404
    assert not [path for path in root.rglob("*") if path.is_file()]


def test_the_schema_lists_the_avatar_routes_and_fields(clients: tuple[TestClient, TestClient, Path]) -> None:
    schema = clients[0].get("/openapi.json").json()
    paths = schema["paths"]
    assert {"post", "get"} <= set(paths["/v1/avatars"]) and {"get", "delete"} <= set(paths["/v1/avatars/{avatar_id}"])
    for path in ("/v1/renders", "/v1/sessions"):
        content = paths[path]["post"]["requestBody"]["content"]
        assert "avatar_id" in content["application/json"]["schema"]["properties"]
        form = content["multipart/form-data"]["schema"]
        form = schema["components"]["schemas"][form["$ref"].rsplit("/", 1)[1]] if "$ref" in form else form
        assert "avatar_id" in form["properties"]


# On the real stack.


def _frame_hashes(stack: Stack, session_id: str) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    lines = (root / "sessions" / session_id / "out" / "frames.jsonl").read_text().splitlines()
    return [json.loads(line)["sha256"] for line in lines]


def _faceless_png() -> bytes:
    pixels = np.tile(np.linspace(40, 220, 320, dtype=np.uint8), (240, 1))  # a grey ramp: no face anywhere
    out = io.BytesIO()
    Image.fromarray(pixels).convert("RGB").save(out, format="PNG")
    return out.getvalue()


def _avatar_objects(stack: Stack) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    return sorted(str(path.relative_to(root)) for path in (root / "avatars").rglob("*") if path.is_file())


@pytest.mark.slow
def test_renders_from_an_avatar_give_the_frames_of_its_portrait_and_reuse_its_reference(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    options = {"preview": True, "seed": 5}
    with Client(api_url, api_key=api_key(api_url)) as client:
        avatar = client.create_avatar(sample_portrait)
        assert client.avatar(avatar.id) == avatar and avatar in client.avatars()
        direct = client.create_render(portrait=sample_portrait, audio=sample_speech, options=options)
        first = client.create_render(avatar=avatar, audio=sample_speech, options=options)
        assert first.avatar_id == avatar.id and (first.width, first.height) == (direct.width, direct.height)
        for session in (direct, first):
            assert client.wait(session.id, timeout_s=240).status == "completed"
        references = [name for name in _avatar_objects(stack) if f"/{avatar.id}/ref/" in name]
        assert len(references) == 1  # the first session from the avatar encoded it and kept it for the next
        speech = client.upload_asset(sample_speech, kind=AssetKind.AUDIO)  # an asset: the create goes as JSON
        again = client.create_render(avatar=avatar.id, audio=speech, options=options)
        assert client.wait(again.id, timeout_s=240).status == "completed"
        hashes = _frame_hashes(stack, direct.id)
        # What a resume or a rebuild on another node reads: the session's own copies, those of the avatar.
        root = stack.settings.storage.root
        assert root is not None
        reference = root / references[0]  # avatars/<tenant>/<id>/ref/<family>-<tag>.safetensors
        for session in (first, again):
            own = root / "sessions" / session.id
            portrait = (own / "input" / "portrait.png").read_bytes()
            assert portrait == (reference.parent.parent / "portrait.png").read_bytes()
            assert (own / "ref" / "conditioning.safetensors").read_bytes() == reference.read_bytes()
        assert hashes and _frame_hashes(stack, first.id) == hashes and _frame_hashes(stack, again.id) == hashes
        client.delete_avatar(avatar.id)
        assert not [name for name in _avatar_objects(stack) if f"/{avatar.id}/" in name]
        with pytest.raises(ApiError) as gone:
            client.avatar(avatar.id)
        assert gone.value.status == 404


@pytest.mark.slow
def test_a_live_session_from_an_avatar_streams_and_holds_its_avatar_until_it_ends(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    pcm = normalise_audio(sample_speech).wav[44:][: 16_000 * 2 * 2]  # 2 s
    with Client(api_url, api_key=api_key(api_url)) as client:
        avatar = client.create_avatar(sample_portrait)
        session = client.create_live(avatar=avatar)
        assert session.avatar_id == avatar.id and session.kind == "live"
        with pytest.raises(ApiError) as in_use:
            client.delete_avatar(avatar.id)
        assert in_use.value.status == 409 and session.id in str(in_use.value)
        client.stream_audio(session, pcm, speed=4.0)
        done = client.wait(session.id, timeout_s=240)
        assert done.status == "completed" and done.progress.frames_total, done.error
        client.delete_avatar(avatar.id)


@pytest.mark.slow
def test_a_portrait_without_a_face_makes_no_avatar(stack: Stack, api_url: str) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        before, objects = client.avatars(limit=200), _avatar_objects(stack)
        with pytest.raises(ApiError) as refused:
            client.create_avatar(_faceless_png())
        assert refused.value.status == 422 and "portrait: no face found" in str(refused.value)
        assert client.avatars(limit=200) == before and _avatar_objects(stack) == objects


@pytest.mark.slow
def test_the_avatars_commands_create_list_render_and_delete_through_the_api(
    stack: Stack, api_url: str, tmp_path: Path
) -> None:
    runner = CliRunner(env={"MONOLOGUE_API_KEY": api_key(api_url) or ""})
    created = runner.invoke(main, ["avatars", "create", str(SAMPLES / "portrait.jpg"), "--api", api_url])
    assert created.exit_code == 0, created.output
    avatar_id = created.output.strip()
    listed = runner.invoke(main, ["avatars", "list", "--json", "--api", api_url])
    assert avatar_id in [item["id"] for item in json.loads(listed.output)]
    output = tmp_path / "out.mp4"
    rest = ["--preview", "--json", "-o", str(output), "--api", api_url]
    rendered = runner.invoke(main, ["render", "--avatar", avatar_id, str(SAMPLES / "speech.wav"), *rest])
    assert rendered.exit_code == 0, rendered.output
    assert json.loads(rendered.output.splitlines()[-1])["avatar_id"] == avatar_id and output.stat().st_size > 0
    sample = [str(SAMPLES / "portrait.jpg"), str(SAMPLES / "speech.wav")]
    both = runner.invoke(main, ["render", *sample, "--avatar", avatar_id, "--api", api_url])
    assert both.exit_code == 2 and "PORTRAIT or --avatar" in both.output
    assert runner.invoke(main, ["avatars", "delete", avatar_id, "--api", api_url]).exit_code == 0
    shown = runner.invoke(main, ["avatars", "show", avatar_id, "--api", api_url])
    assert shown.exit_code == 1 and "not found" in shown.output


@pytest.mark.slow
async def test_the_async_client_makes_lists_and_deletes_avatars(api_url: str, sample_portrait: bytes) -> None:
    async with AsyncClient(api_url, api_key=api_key(api_url)) as client:
        avatar = await client.create_avatar(sample_portrait)
        assert await client.avatar(avatar.id) == avatar and avatar in await client.avatars(limit=200)
        await client.delete_avatar(avatar.id)
        assert avatar not in await client.avatars(limit=200)
