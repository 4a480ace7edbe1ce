"""A live session watched over WebRTC in headless Chromium (Debian's package, fake media devices): the player page
connects through WHEP with the session's playback link, shows the avatar's frames, and the mouth moves after each
known speech onset (`cli/benches/webrtc.py` reads the frames in the page; its figures are printed, not asserted:
`monologue bench live --webrtc` records them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.benches.webrtc import local_reference, measure
from cli.stack import Stack, free_port
from monologue import SAMPLES, repo
from monologue.db import make_engine, make_sessionmaker
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from tests.browser import chromium_path
from tests.helpers import api_key, register_api

pytestmark = pytest.mark.timeout(300)


def test_chromium_plays_a_live_session_over_whep_and_the_mouth_follows_the_speech(stack: Stack, api_url: str) -> None:
    figures = measure(
        api_url,
        api_key(api_url),
        SAMPLES / "portrait.jpg",
        SAMPLES / "speech.wav",
        bursts=3,
        chromium=chromium_path(),
        reference=local_reference(stack.settings),
    )
    print("\n".join(figures.lines()))
    assert figures.frames > 25 and figures.ttff_ms is not None
    assert len(figures.glass_ms) == 3 and min(figures.glass_ms) > 0, figures.lines()  # the mouth opens after each onset


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own with two nodes and a short lease timeout, so a killed node's session moves soon."""
    settings = Settings(
        home=tmp_path_factory.mktemp("webrtc-move"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id="webrtc-a", capacity=1, lease_timeout_s=3.0),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    stack.start_node("webrtc-b")
    yield stack
    stack.stop()


def test_the_player_reconnects_through_the_same_url_after_the_node_is_killed(two_nodes: Stack) -> None:
    """The node holding the session is SIGKILLed mid-speech: the page offers again, the API routes it to the
    session's new node, and the frames (and the mouth) come back; the stall is printed."""
    settings = two_nodes.settings
    url = str(settings.api.public_url)

    def kill(session_id: str) -> None:
        with make_sessionmaker(make_engine(settings.db_url))() as db:
            row = repo.get_session(db, session_id=session_id)
        assert row is not None and row.node_id is not None
        two_nodes.kill(f"node-{row.node_id}")

    figures = measure(
        url,
        api_key(url),
        SAMPLES / "portrait.jpg",
        SAMPLES / "speech.wav",
        bursts=4,
        chromium=chromium_path(),
        kill=kill,
        reference=local_reference(settings),
    )
    print("\n".join(figures.lines()))
    (stall,) = figures.stalls_ms
    assert stall == stall and stall > 0  # frames came again after the kill (not NaN)
    assert len(figures.glass_ms) == 4, figures.lines()  # the mouth followed the onsets after the move too
