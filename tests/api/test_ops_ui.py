"""The ops UI in a real browser (Debian's Chromium through Playwright) against the real embedded stack:
signing in with the stack's API key, live progress in the sessions table, a session's timeline and live
player while it renders, cancel through the button and its confirmation, the node registry and signing
out. Screenshots go to $MONOLOGUE_TEST_ARTIFACTS (default tests/artifacts/).

The stack is this module's own, like the durability tests': every chunk is stretched by 0.4 s
(`node.chunk_delay_s`) so a render lasts long enough to watch, and the node takes two sessions. The ops
UI is not open on loopback, so every request the pages make must carry the key."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cli.stack import Stack, free_port
from monologue.media import decode_wav, normalise_audio
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from tests.browser import CHROMIUM_ARGS, chromium_path
from tests.helpers import wav_bytes

pytestmark = pytest.mark.slow
NODE = "ops-node"
KEY_ITEM = "monologue-ops-key"  # where the pages keep the key (sessionStorage, per tab)
ARTIFACTS = Path(os.environ.get("MONOLOGUE_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "artifacts"))


@pytest.fixture(scope="module")
def ops_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("ops"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id=NODE, capacity=2, chunk_delay_s=0.4, graceful_shutdown_s=5.0),
    )
    assert not settings.api.ops_open_on_loopback  # the pages must send the key
    stack = Stack(settings)
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def url(ops_stack: Stack) -> str:
    return str(ops_stack.settings.api.public_url)


@pytest.fixture(scope="module")
def long_speech(sample_speech: bytes) -> bytes:
    """The sample ten times over: about 70 s, 79 chunks, at least 30 s of rendering at 0.4 s a chunk. Far longer than
    the tests that watch it take, so that it is still running when they assert that it is (and the cancel
    test's session has not finished before the cancel)."""
    return wav_bytes(np.tile(decode_wav(normalise_audio(sample_speech).wav), 10))


@pytest.fixture(scope="module")
def auth(ops_stack: Stack) -> dict[str, str]:
    """The stack's own key (tenant `local`, scope `ops`): it submits renders and signs in to the pages."""
    return {"Authorization": f"Bearer {ops_stack.api_key}"}


def _submit(url: str, auth: dict[str, str], portrait: bytes, audio: bytes) -> str:
    files = {"portrait": ("portrait.jpg", portrait), "audio": ("speech.wav", audio)}
    response = httpx.post(f"{url}/v1/renders", files=files, headers=auth, timeout=60)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


@pytest.fixture(scope="module")
def watched(url: str, auth: dict[str, str], sample_portrait: bytes, long_speech: bytes) -> str:
    """The session the first tests watch as it renders."""
    return _submit(url, auth, sample_portrait, long_speech)


@pytest.fixture(scope="module")
def browser(ops_stack: Stack) -> Iterator[Any]:
    """Started after the stack: Playwright's sync API runs an event loop in this thread, and the stack's
    readiness check uses asyncio.run, which refuses to run inside one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A laptop-sized page, not signed in; any uncaught script error fails the test."""
    page = browser.new_page(viewport={"width": 1366, "height": 860})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    page.close()
    assert errors == []


@pytest.fixture
def signed_in(page: Any, ops_stack: Stack) -> Any:
    """The page with the key already in its tab's storage, as if signed in earlier (the first test signs in
    through the form). Stored once per tab, so that signing out (which reloads) sticks."""
    page.add_init_script(
        f"""if (!sessionStorage.getItem("test-seeded")) {{
              sessionStorage.setItem("test-seeded", "1");
              sessionStorage.setItem({KEY_ITEM!r}, {ops_stack.api_key!r});
            }}"""
    )
    return page


def _screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _render(url: str, auth: dict[str, str], session_id: str) -> dict[str, Any]:
    render: dict[str, Any] = httpx.get(f"{url}/v1/renders/{session_id}", headers=auth, timeout=10).json()
    return render


def test_signing_in_then_the_sessions_table_shows_a_render_progressing_without_a_reload(
    page: Any, url: str, ops_stack: Stack, watched: str
) -> None:
    page.goto(f"{url}/ops")
    page.evaluate("window.notReloaded = true")
    key = page.get_by_label("API key")  # the API answered 401: the page asks for a key
    key.wait_for(timeout=10_000)
    assert key.get_attribute("type") == "password"
    assert page.evaluate("document.activeElement.id") == "api-key"
    assert page.locator("#sessions-body tr").count() == 0
    key.fill("mk_00000000_not-the-key-at-all-000000")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("alert").filter(has_text="not valid").wait_for(timeout=10_000)  # asked again, saying why
    _screenshot(page, "ops-sign-in.png")
    page.get_by_label("API key").fill(ops_stack.api_key)
    page.keyboard.press("Enter")
    page.locator(".sign-in").wait_for(state="detached", timeout=10_000)
    assert page.locator("#sign-out").is_visible()
    label = page.locator(f'tr[data-session="{watched}"] .progress-label')
    label.wait_for(timeout=20_000)
    page.wait_for_function(
        """([selector]) => { const text = document.querySelector(selector)?.textContent ?? "";
                             return /^[1-9]\\d*\\/\\d+$/.test(text); }""",
        arg=[f'tr[data-session="{watched}"] .progress-label'],
        timeout=30_000,
    )
    first = label.text_content()
    page.wait_for_function(
        "([selector, first]) => document.querySelector(selector).textContent !== first",
        arg=[f'tr[data-session="{watched}"] .progress-label', first],
        timeout=30_000,
    )
    assert page.evaluate("window.notReloaded") is True  # signing in did not reload the page either
    row = page.locator(f'tr[data-session="{watched}"]')
    assert row.locator(".badge").text_content() == "running"
    assert NODE in (row.text_content() or "")
    page.wait_for_function(  # the Queue table below: the render holds one of the node's slots
        """() => Number(document.querySelector('#queue-body tr[data-class="normal"] td.running')?.textContent) >= 1""",
        timeout=10_000,
    )
    _screenshot(page, "ops-sessions.png")
    page.select_option("select[name=status]", "completed")  # filters apply at once and land in the URL
    row.wait_for(state="detached", timeout=10_000)
    assert "status=completed" in page.url
    page.select_option("select[name=status]", "running")
    row.wait_for(timeout=10_000)


def test_session_page_draws_the_timeline_and_plays_while_rendering(
    signed_in: Any, url: str, auth: dict[str, str], watched: str
) -> None:
    page = signed_in
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{url}/ops/sessions/{watched}")
    total = _render(url, auth, watched)["progress"]["chunks_total"]
    page.wait_for_function(f"document.querySelectorAll('#timeline .chunk').length === {total}", timeout=20_000)
    assert page.locator("#timeline .chunk.kind-I").count() == total // 2  # N0 I0 N1 … N(last): one I between two Ns
    assert page.locator('#timeline .chunk[data-status="done"]').count() >= 1
    page.wait_for_function("document.getElementById('player').currentTime > 1", timeout=30_000)
    assert _render(url, auth, watched)["status"] == "running"  # it played before the render ended
    assert page.locator("#events li").count() >= 1
    assert page.locator(".sign-in").count() == 0  # the stored key was sent with every request
    called = [request for request in requests if request.startswith(url)]
    assert any(f"/ops/api/sessions/{watched}/stream/seg-" in request for request in called)
    assert any(request.endswith(f"/ops/api/sessions/{watched}/events") for request in called)
    assert not [request for request in called if "/v1/" in request]  # only /ops, which the ops key opens
    link = page.locator("#temporal-link").get_attribute("href")
    assert link is not None and link.endswith(f"/namespaces/default/workflows/render-{watched}")
    page.locator("#timeline .chunk").first.hover()
    assert "context" in (page.locator("#chunk-detail").text_content() or "")  # per-stage timings
    _screenshot(page, "ops-session.png")


def test_cancel_button_asks_first_then_cancels(
    signed_in: Any, url: str, auth: dict[str, str], sample_portrait: bytes, long_speech: bytes
) -> None:
    page = signed_in
    session_id = _submit(url, auth, sample_portrait, long_speech)
    page.goto(f"{url}/ops/sessions/{session_id}")
    cancel = page.locator("#cancel")
    cancel.wait_for()
    page.wait_for_function("!document.getElementById('cancel').disabled", timeout=20_000)
    cancel.focus()
    page.keyboard.press("Enter")  # a real button: the keyboard opens the dialog too
    dialog = page.locator("#confirm")
    dialog.wait_for(state="visible")
    page.keyboard.press("Escape")  # …and Escape backs out without cancelling
    dialog.wait_for(state="hidden")
    assert _render(url, auth, session_id)["status"] in ("queued", "running")
    cancel.click()
    _screenshot(page, "ops-cancel-dialog.png")
    with page.expect_response(lambda response: response.request.method == "POST") as cancelled:
        page.locator("#confirm-yes").click()
    assert cancelled.value.url == f"{url}/ops/api/sessions/{session_id}/cancel" and cancelled.value.status == 202
    page.wait_for_function("document.getElementById('status').textContent === 'cancelled'", timeout=30_000)
    assert _render(url, auth, session_id)["status"] == "cancelled"
    assert page.locator("#resume").is_enabled() and page.locator("#cancel").is_disabled()


def test_nodes_page_lists_the_node_and_signing_out_asks_for_the_key_again(
    signed_in: Any, url: str, watched: str
) -> None:
    page = signed_in
    page.goto(f"{url}/ops/nodes")
    row = page.locator(f'tr[data-node="{NODE}"]')
    row.wait_for(timeout=10_000)
    text = row.text_content() or ""
    assert "up" in text and "/2" in text and "MB" in text and "ago" in text
    _screenshot(page, "ops-nodes.png")
    page.get_by_role("button", name="Sign out").click()
    page.get_by_label("API key").wait_for(timeout=10_000)
    assert page.evaluate(f"sessionStorage.getItem({KEY_ITEM!r})") is None


def test_session_page_of_a_render_with_captions_plays_them(
    signed_in: Any, url: str, auth: dict[str, str], sample_portrait: bytes
) -> None:
    """A session with captions plays its multivariant playlist, so the player shows the subtitle rendition."""
    data = {"text": "Hello there. These words are captions.", "captions": "files", "preview": "true"}
    response = httpx.post(
        f"{url}/v1/renders", files={"portrait": ("portrait.jpg", sample_portrait)}, data=data, headers=auth, timeout=60
    )
    assert response.status_code == 201, response.text
    session_id = response.json()["id"]
    page = signed_in
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{url}/ops/sessions/{session_id}")
    shown = """[...document.getElementById('player').textTracks].some(
        t => t.kind === 'subtitles' && t.mode === 'showing' && t.cues && t.cues.length >= 2)"""
    page.wait_for_function(shown, timeout=60_000)
    assert f"{url}/ops/api/sessions/{session_id}/stream/main.m3u8" in requests
    assert f"{url}/ops/api/sessions/{session_id}/stream/captions.vtt" in requests


def test_session_page_of_a_live_webrtc_session_plays_it_over_webrtc(
    signed_in: Any, url: str, auth: dict[str, str], sample_portrait: bytes
) -> None:
    """A live session with delivery=webrtc plays in its own player page (WHEP, a signed link) inside the ops page."""
    from cli.benches.webrtc import AudioSender, speech_with_onsets
    from monologue import SAMPLES

    response = httpx.post(
        f"{url}/v1/sessions",
        files={"portrait": ("portrait.jpg", sample_portrait)},
        data={"delivery": "webrtc"},
        headers=auth,
        timeout=60,
    )
    assert response.status_code == 201, response.text
    session = response.json()
    pcm, _ = speech_with_onsets(SAMPLES / "speech.wav", bursts=1)
    sender = AudioSender(session["audio_ticket"]["url"], pcm)
    sender.start()
    page = signed_in
    page.goto(f"{url}/ops/sessions/{session['id']}")
    page.wait_for_selector("iframe.webrtc-player", timeout=30_000)
    player = _frame_loading(page, "/player")
    assert f"/v1/live/{session['id']}/player?link=" in player.url
    player.wait_for_function("window.monologuePlayer && window.monologuePlayer.firstFrameAt !== null", timeout=60_000)
    sender.join(timeout=60)


def _frame_loading(page: Any, part: str, timeout_s: float = 30.0) -> Any:
    """The page's frame whose URL holds `part`, once the iframe has navigated there (it starts at about:blank)."""
    deadline = time.monotonic() + timeout_s
    while not (found := [frame for frame in page.frames if part in frame.url]):
        assert time.monotonic() < deadline, f"no frame at {part} within {timeout_s:g} s: {[f.url for f in page.frames]}"
        page.wait_for_timeout(100)
    return found[0]
