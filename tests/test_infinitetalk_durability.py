"""An infinitetalk render survives its node being SIGKILLed mid-chunk: the node restarted takes the session over
after the lease timeout, rebuilds the session from the stored reference and checkpoint (the decoder's causal cache
from the anchor's latents) and the video has the frames, hash for hash, of an uninterrupted render."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.stack import Stack, free_port
from gpu_worker.models import FAMILIES
from monologue.contracts import Family
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from tests.helpers import get, register_api, submit, wait_done, wav_bytes

pytestmark = pytest.mark.slow
NODE = "talk-a"
OPTIONS = {"family": "infinitetalk", "chunk_frames": 16, "i_frames": 4, "seed": 5}


@pytest.fixture(scope="module")
def talk_stack(tmp_path_factory: pytest.TempPathFactory, infinitetalk_weights: Path) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("talk-durable"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id=NODE, lease_timeout_s=3.0, chunk_delay_s=0.4, graceful_shutdown_s=10.0),
    )
    infinitetalk = FAMILIES[Family.INFINITETALK]
    env = {infinitetalk.env("weights"): str(infinitetalk_weights), infinitetalk.env("preset"): "tiny"}
    stack = Stack(settings, env=env)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


def _hashes(stack: Stack, session_id: str) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    lines = (root / "sessions" / session_id / "out" / "frames.jsonl").read_text().splitlines()
    return [json.loads(line)["sha256"] for line in lines]


def test_a_node_killed_mid_render_resumes_to_identical_frames(
    talk_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(talk_stack.settings.api.public_url)
    samples = np.frombuffer(sample_speech[44:], dtype="<i2")[: int(16_000 * 1.2)] / 32768.0
    speech = wav_bytes(samples)  # 1.2 s: N0 (17 frames), N1 (9), I0 (4)
    baseline = wait_done(url, submit(url, sample_portrait, speech, **OPTIONS).json()["id"])
    assert baseline["status"] == "completed", baseline["error"]
    session_id = submit(url, sample_portrait, speech, **OPTIONS).json()["id"]
    deadline = time.monotonic() + 120
    while get(f"{url}/v1/renders/{session_id}", timeout=10).json()["progress"]["chunks_done"] < 1:
        assert time.monotonic() < deadline, "N0 never finished"
        time.sleep(0.05)
    node: Any = next(c.process for c in talk_stack.children if c.name == f"node-{NODE}" and c.process.poll() is None)
    node.send_signal(signal.SIGKILL)  # during N1 (each chunk is held 0.4 s at least)
    talk_stack.start_node(NODE)
    render = wait_done(url, session_id, timeout_s=180)
    assert render["status"] == "completed", render["error"]
    assert render["progress"]["chunks_total"] == 3
    assert _hashes(talk_stack, session_id) == _hashes(talk_stack, baseline["id"])
