"""The ops UI in a real browser (Debian's Chromium through Playwright) against the real embedded stack:
live progress in the sessions table, a session's timeline and live player while it renders, cancel
through the button and its confirmation, and the node registry. Screenshots go to
$MONOLOGUE_TEST_ARTIFACTS (default tests/artifacts/).

The stack is this module's own, like the durability tests': every chunk is stretched by 0.4 s
(`node.chunk_delay_s`) so a render lasts long enough to watch, and the node takes two sessions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from monologue.media import decode_wav, normalise_audio
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from monologue.stack import Stack, free_port
from tests.browser import CHROMIUM_ARGS, chromium_path
from tests.helpers import submit, wav_bytes

pytestmark = pytest.mark.slow
NODE = "ops-node"
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
    stack = Stack(settings)
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def url(ops_stack: Stack) -> str:
    return str(ops_stack.settings.api.public_url)


@pytest.fixture(scope="module")
def long_speech(sample_speech: bytes) -> bytes:
    """The sample three times over: about 20 s, 25 chunks."""
    return wav_bytes(np.tile(decode_wav(normalise_audio(sample_speech).wav), 3))


@pytest.fixture(scope="module")
def watched(url: str, sample_portrait: bytes, long_speech: bytes) -> str:
    """The session the first tests watch as it renders."""
    response = submit(url, sample_portrait, long_speech)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


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
    """A laptop-sized page; any uncaught script error fails the test."""
    page = browser.new_page(viewport={"width": 1366, "height": 860})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    page.close()
    assert errors == []


def _screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _render(url: str, session_id: str) -> dict[str, Any]:
    render: dict[str, Any] = httpx.get(f"{url}/v1/renders/{session_id}", timeout=10).json()
    return render


def test_sessions_table_shows_a_render_progressing_without_a_reload(page: Any, url: str, watched: str) -> None:
    page.goto(f"{url}/ops")
    page.evaluate("window.notReloaded = true")
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
    assert page.evaluate("window.notReloaded") is True
    row = page.locator(f'tr[data-session="{watched}"]')
    assert row.locator(".badge").text_content() == "running"
    assert NODE in (row.text_content() or "")
    _screenshot(page, "ops-sessions.png")
    page.select_option("select[name=status]", "completed")  # filters apply at once and land in the URL
    row.wait_for(state="detached", timeout=10_000)
    assert "status=completed" in page.url
    page.select_option("select[name=status]", "running")
    row.wait_for(timeout=10_000)


def test_session_page_draws_the_timeline_and_plays_while_rendering(page: Any, url: str, watched: str) -> None:
    page.goto(f"{url}/ops/sessions/{watched}")
    total = _render(url, watched)["progress"]["chunks_total"]
    page.wait_for_function(f"document.querySelectorAll('#timeline .chunk').length === {total}", timeout=20_000)
    assert page.locator("#timeline .chunk.kind-I").count() == total // 2  # N0 I0 N1 … N12
    assert page.locator('#timeline .chunk[data-status="done"]').count() >= 1
    page.wait_for_function("document.getElementById('player').currentTime > 1", timeout=30_000)
    assert _render(url, watched)["status"] == "running"  # it played before the render ended
    assert page.locator("#events li").count() >= 1
    link = page.locator("#temporal-link").get_attribute("href")
    assert link is not None and link.endswith(f"/namespaces/default/workflows/render-{watched}")
    page.locator("#timeline .chunk").first.hover()
    assert "context" in (page.locator("#chunk-detail").text_content() or "")  # per-stage timings
    _screenshot(page, "ops-session.png")


def test_cancel_button_asks_first_then_cancels(page: Any, url: str, sample_portrait: bytes, long_speech: bytes) -> None:
    session_id = submit(url, sample_portrait, long_speech).json()["id"]
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
    assert _render(url, session_id)["status"] in ("queued", "running")
    cancel.click()
    _screenshot(page, "ops-cancel-dialog.png")
    page.locator("#confirm-yes").click()
    page.wait_for_function("document.getElementById('status').textContent === 'cancelled'", timeout=30_000)
    assert _render(url, session_id)["status"] == "cancelled"
    assert page.locator("#resume").is_enabled() and page.locator("#cancel").is_disabled()


def test_nodes_page_lists_the_node(page: Any, url: str, watched: str) -> None:
    page.goto(f"{url}/ops/nodes")
    row = page.locator(f'tr[data-node="{NODE}"]')
    row.wait_for(timeout=10_000)
    text = row.text_content() or ""
    assert "up" in text and "/2" in text and "MB" in text and "ago" in text
    _screenshot(page, "ops-nodes.png")
