"""A live session watched over WebRTC in headless Chromium (Debian's package, fake media devices): the player page
connects through WHEP with the session's playback link, shows the avatar's frames, and the mouth moves after each
known speech onset (`cli/benches/webrtc.py` reads the frames in the page; its figures are printed, not asserted:
`monologue bench live --webrtc` records them). With an audio ticket the page also talks: its "Talk" button sends
Chromium's fake microphone (a WAV with known onsets) over WHIP."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin

import numpy as np
import pytest

from cli.benches.webrtc import BURST_S, GAP_S, LEAD_S, local_store, measure, speech_with_onsets
from cli.chromium import CHROMIUM_ARGS
from cli.stack import Stack, free_port
from monologue import SAMPLES, repo
from monologue.client import Client
from monologue.db import make_engine, make_sessionmaker
from monologue.live_audio import stored_live_audio
from monologue.media import decode_wav
from monologue.plan import AUDIO_RATE
from monologue.schemas import RenderPublic
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from monologue.storage import LocalStore
from tests.browser import chromium_path, watch_live
from tests.helpers import api_key, node_media_stats, register_api
from tests.test_webrtc_whip import _stored_wav

pytestmark = pytest.mark.timeout(300)
CONNECTED = "window.monologuePlayer.pc && window.monologuePlayer.pc.connectionState === 'connected'"
REFUSED = "document.getElementById('state').textContent.startsWith('refused')"


def test_chromium_plays_a_live_session_over_whep_and_the_mouth_follows_the_speech(stack: Stack, api_url: str) -> None:
    figures = watch_live(stack, bursts=3)
    assert figures.frames > 25 and figures.ttff_ms is not None
    assert len(figures.glass_ms) == 3 and min(figures.glass_ms) > 0, figures.lines()  # the mouth opens after each onset
    assert len(figures.sync_ms) > 10  # the browser played both tracks in one sync group (its stats say where)


def test_the_player_talks_over_whip_with_a_ticket_and_the_mouth_follows_the_microphone(
    stack: Stack, api_url: str
) -> None:
    """The page opened with `ticket=` sends Chromium's fake microphone (speech bursts with known onsets) over WHIP:
    the node stores it as acknowledged pieces (the whole speech, then the end), the avatar's mouth opens after each
    onset in the WHEP video the same page plays, and the session completes."""
    bursts = 2
    key = api_key(api_url)
    figures = measure(
        api_url,
        key,
        SAMPLES / "portrait.jpg",
        SAMPLES / "speech.wav",
        bursts=bursts,
        chromium=chromium_path(),
        store=local_store(stack.settings),
        whip=True,
    )
    print("\n".join(figures.lines()))
    root = stack.settings.storage.root
    assert root is not None
    stored, ended = stored_live_audio(LocalStore(root), figures.session_id)
    speech_s = LEAD_S + bursts * (BURST_S + GAP_S)
    assert ended and stored >= (speech_s - 0.5) * AUDIO_RATE, stored  # all the speech, whatever the page added
    samples = np.abs(decode_wav(_stored_wav(root, figures.session_id)))
    # The WAV, not Chromium's default beeps (one every 500 ms): loud, with the silence between bursts in it. (Its lead
    # may be cut short: what the microphone gave before the connection was up is not sent.)
    assert samples.max() > 0.1 and _longest_quiet_s(samples) > GAP_S - 0.5, _longest_quiet_s(samples)
    assert figures.frames > 25 and len(figures.glass_ms) == bursts and min(figures.glass_ms) > 0, figures.lines()
    with Client(api_url, api_key=key) as client:
        done = client.wait(figures.session_id, timeout_s=120)
    assert done.status == "completed", done.error


def _longest_quiet_s(samples: np.ndarray) -> float:
    """The longest run of near-silence between the first and the last loud sample, in seconds."""
    loud = np.flatnonzero(samples >= 0.05 * samples.max())
    gaps = np.diff(loud) if len(loud) > 1 else np.zeros(1, np.int64)
    return float(gaps.max()) / AUDIO_RATE


def test_the_player_has_no_talk_button_without_a_ticket(stack: Stack, api_url: str) -> None:
    with _player_page(api_url) as (client, session, page):
        assert not page.is_visible("#talk")
        assert page.evaluate("window.monologuePlayer.talkState") == "none"
        client.cancel(session.id)


@contextlib.contextmanager
def _player_page(api_url: str) -> Iterator[tuple[Client, RenderPublic, Any]]:
    """A new live WebRTC session (no ticket in the URL) and its player page open in headless Chromium."""
    from playwright.sync_api import sync_playwright

    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc"})
        assert session.links.playback is not None and session.links.playback.player is not None
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.goto(urljoin(api_url, session.links.playback.player))
                yield client, session, page
            finally:
                browser.close()


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
        store=local_store(settings),
    )
    print("\n".join(figures.lines()))
    (stall,) = figures.stalls_ms
    assert stall == stall and stall > 0  # frames came again after the kill (not NaN)
    # Every onset is accounted for: seen, or spoken while no node sent frames (how many fall in the stall depends on
    # the machine's speed, so the test does not count them); the frames after the stall are the new node's.
    assert len(figures.glass_ms) + figures.missed == 4 and figures.glass_ms, figures.lines()


def test_a_page_whose_frames_stop_offers_again_and_leaves_no_viewer_behind(stack: Stack, api_url: str) -> None:
    """Its client stops sending audio (not realtime), so the session makes no more frames: the page offers again after
    a second without frames and twice as long each time (api/player/player.html), each time giving its old place up
    (DELETE), so the node never holds more than this one viewer; once the session has ended (its idle timeout) the
    page stops."""
    speech, _ = speech_with_onsets(SAMPLES / "speech.wav", bursts=1)
    pcm = speech[: 3 * AUDIO_RATE].tobytes()  # 2 s of silence and 1 s of speech
    with _player_page(api_url) as (client, session, page):
        sender = threading.Thread(target=client.stream_audio, args=(session, pcm), kwargs={"end": False})
        sender.start()  # 3 s in real time, then nothing
        # Two offers in a row with no frames flowing between them (a new connection brings one frame).
        page.wait_for_function("window.monologuePlayer.quietReoffers >= 2", timeout=60_000)
        page.wait_for_function(CONNECTED, timeout=30_000)
        assert node_media_stats(stack)["peer_connections"] == 1  # the old places were given up
        sender.join(timeout=120)
        assert client.wait(session.id, timeout_s=120).status == "completed"
        page.wait_for_function(REFUSED, timeout=60_000)
        assert node_media_stats(stack)["peer_connections"] == 0
