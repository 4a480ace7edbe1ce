"""`monologue.client` against the real stack: the async client makes a render from bytes, follows it on its event
stream, downloads the progressive MP4 and gets the API's refusals as ApiError with problem details; a create is
retried with its Idempotency-Key into one session; the CLI's `webhooks` commands go through it. (The sync client's
live helper and its reconnects: tests/test_live.py; the client installed alone: tests/test_client_dist.py.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import main
from monologue.client import ApiError, AsyncClient, Client, Layout
from monologue.client._common import CREATE_ATTEMPTS
from monologue.mp4.boxes import iter_boxes
from monologue.schemas import RenderPublic
from tests.helpers import api_key, wav_bytes

pytestmark = pytest.mark.slow


async def test_the_async_client_renders_follows_downloads_and_reports_refusals(
    api_url: str, sample_portrait: bytes, tmp_path: Path
) -> None:
    seen: list[RenderPublic] = []
    async with AsyncClient(api_url, api_key=api_key(api_url)) as client:
        created = await client.create_render(
            portrait=sample_portrait, audio=wav_bytes(np.zeros(16_000)), options={"seed": 3}
        )
        assert created.options.seed == 3 and created.links.playback is not None
        done = await client.wait(created.id, on_progress=seen.append)
        assert done.status == "completed" and seen[-1].status == "completed"
        progress: list[tuple[int, int | None]] = []
        size = await client.download(
            done.id, tmp_path / "out.mp4", layout=Layout.PROGRESSIVE, on_progress=lambda *at: progress.append(at)
        )
        data = (tmp_path / "out.mp4").read_bytes()
        assert size == len(data) and [box.kind for box in iter_boxes(data)] == [b"ftyp", b"moov", b"mdat"]
        assert progress[-1] == (size, size) and [done for done, _ in progress] == sorted({d for d, _ in progress})
        assert created.id in {session.id for session in await client.list_sessions(limit=20)}
        with pytest.raises(ApiError) as refused:
            await client.cancel(done.id)
        assert refused.value.status == 409 and refused.value.problem["title"] == "Conflict"
        assert "already completed" in str(refused.value)


def test_the_webhooks_commands_create_list_and_delete_through_the_api(api_url: str) -> None:
    runner = CliRunner(env={"MONOLOGUE_API_KEY": api_key(api_url) or ""})
    created = runner.invoke(
        main, ["webhooks", "create", "http://127.0.0.1:9/cli", "--event", "session.failed", "--api", api_url]
    )
    assert created.exit_code == 0, created.output
    assert "whsec_" in created.output and "session.failed" in created.output
    endpoint = created.output.split()[1]
    listed = runner.invoke(main, ["webhooks", "list", "--api", api_url])
    assert endpoint in listed.output and "whsec_" not in listed.output
    assert runner.invoke(main, ["webhooks", "delete", endpoint, "--api", api_url]).exit_code == 0
    refused = runner.invoke(main, ["webhooks", "create", "http://10.0.0.1/x", "--api", api_url])
    assert refused.exit_code == 1 and "MONOLOGUE_WEBHOOKS__ALLOWED_URLS" in refused.output


class LossyNetwork(httpx.BaseTransport):
    """The way to the real API, losing things on creates: the first is refused for now (503, Retry-After: 0, as a
    proxy in front of a restarting API answers), the answer to the second is lost after the API made the session,
    and the third passes."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.keys: list[str | None] = []  # each create's Idempotency-Key
        self.replayed: list[str | None] = []  # Idempotent-Replayed of the answers that got through

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return self.inner.handle_request(request)
        self.keys.append(request.headers.get("Idempotency-Key"))
        if len(self.keys) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"detail": "restarting"})
        response = self.inner.handle_request(request)
        response.read()
        if len(self.keys) == 2:
            raise httpx.ReadError("the connection dropped before the answer came", request=request)
        self.replayed.append(response.headers.get("Idempotent-Replayed"))
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_create_refused_for_now_or_whose_answer_is_lost_is_retried_into_one_session(
    api_url: str, sample_portrait: bytes
) -> None:
    network = LossyNetwork()
    with Client(api_url, api_key=api_key(api_url), transport=network) as client:
        before = {session.id for session in client.list_sessions(limit=200)}
        created = client.create_render(portrait=sample_portrait, audio=wav_bytes(np.zeros(8_000)))
        made = {session.id for session in client.list_sessions(limit=200)} - before
    assert made == {created.id}, "the retries made no second session"
    assert len(network.keys) == 3 and len(set(network.keys)) == 1 and network.replayed == ["true"]


async def test_creates_are_retried_while_refused_for_a_short_wait_and_no_longer() -> None:
    """503s with a short Retry-After are sent again, with the same key, up to CREATE_ATTEMPTS in all (or as many
    as the client is told); a refusal asking for a longer wait than the client waits is raised at once, with it."""
    answers = [(503, "0"), (503, "0"), (429, "3600")]
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        status, retry_after = answers[min(len(sent), len(answers)) - 1]
        return httpx.Response(status, headers={"Retry-After": retry_after}, json={"detail": "not now"})

    async with AsyncClient("http://api.test", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ApiError) as refused:
            await client.create_render(portrait_url="https://example.com/p.jpg", audio_url="https://example.com/a.wav")
        assert len(sent) == 3 and len({request.headers["Idempotency-Key"] for request in sent}) == 1
        assert refused.value.status == 429 and refused.value.retry_after_s == 3600

        answers[:] = [(503, "0")]
        sent.clear()
        with pytest.raises(ApiError) as refused:
            await client.create_live(portrait_url="https://example.com/p.jpg")
        assert len(sent) == CREATE_ATTEMPTS and refused.value.status == 503

    sent.clear()
    async with AsyncClient("http://api.test", create_attempts=1, transport=httpx.MockTransport(answer)) as once:
        with pytest.raises(ApiError):
            await once.create_live(portrait_url="https://example.com/p.jpg")
    assert len(sent) == 1
