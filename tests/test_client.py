"""`monologue.client` against the real stack: the async client makes a render from bytes, follows it on its event
stream, downloads the progressive MP4 and gets the API's refusals as ApiError with problem details; the CLI's
`webhooks` commands go through it. (The sync client's live helper and its reconnects: tests/test_live.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import main
from monologue.client import ApiError, AsyncClient, Layout
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
        size = await client.download(done.id, tmp_path / "out.mp4", layout=Layout.PROGRESSIVE)
        data = (tmp_path / "out.mp4").read_bytes()
        assert size == len(data) and [box.kind for box in iter_boxes(data)] == [b"ftyp", b"moov", b"mdat"]
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
