"""Headless Chromium (Debian's package) driven by Playwright, for tests that need a real browser."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

import pytest

from cli.chromium import CHROMIUM_ARGS

if TYPE_CHECKING:
    from cli.benches.webrtc import WebrtcFigures
    from cli.stack import Stack


def chromium_path() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("Debian's chromium is not installed: run the suite with `bash infra/test.sh`, which installs it")
    return found


def play_video(url: str, *, seconds: float = 1.5, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Load `url` in a <video> element, play it for `seconds`, and report what the browser saw. `headers` go
    with every request the page makes (an API key, say)."""
    from playwright.sync_api import sync_playwright

    page_html = f'<video id="video" src="{url}" muted playsinline></video>'
    script = """async (seconds) => {
        const video = document.getElementById('video');
        try { await video.play(); } catch (error) { return {played: false, error: String(error),
            mediaError: video.error && video.error.message}; }
        await new Promise(resolve => setTimeout(resolve, seconds * 1000));
        return {played: true, currentTime: video.currentTime, duration: video.duration,
                width: video.videoWidth, height: video.videoHeight, mediaError: video.error && video.error.message};
    }"""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(extra_http_headers=headers)
            page.set_content(page_html)
            result: dict[str, Any] = page.evaluate(script, seconds)
        finally:
            browser.close()
    return result


def watch_live(stack: Stack, *, bursts: int, **given: Any) -> WebrtcFigures:
    """A live WebRTC session of `stack` watched in headless Chromium while `bursts` onsets of the bundled speech go in
    (cli/benches/webrtc.py's `measure`; `given`: its other options, e.g. whip=True, kill=…); its figures printed."""
    from cli.benches.webrtc import local_store, measure
    from monologue import SAMPLES
    from tests.helpers import api_key

    url = str(stack.settings.api.public_url)
    figures = measure(
        url,
        api_key(url),
        SAMPLES / "portrait.jpg",
        SAMPLES / "speech.wav",
        bursts=bursts,
        chromium=chromium_path(),
        store=local_store(stack.settings),
        **given,
    )
    print("\n".join(figures.lines()))
    return figures
