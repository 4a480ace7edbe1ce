"""Signed playback links on the real stack: a session's stream, segments, video (fragmented and progressive) and
events open without an API key, for that session only, until they expire, read-only; pages at the configured
origin read them from scripts (CORS); a plain <video> and an hls.js page in Chromium play them with no key."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest

from api.links import link_key, sign
from cli.stack import Stack
from monologue import keys
from monologue.contracts import TERMINAL
from monologue.media import decode_wav, normalise_audio
from monologue.mp4.boxes import iter_boxes
from monologue.settings import Settings
from tests.browser import CHROMIUM_ARGS, chromium_path, play_video
from tests.helpers import api_key, get, poll, post, submit, wait_done, wav_bytes
from tests.local_server import Answer, LocalServer

pytestmark = pytest.mark.slow
HLS_JS = Path(__file__).resolve().parents[2] / "api" / "ops" / "static" / "vendor" / "hls.min.js"


@pytest.fixture(scope="module")
def played(api_url: str, sample_portrait: bytes, sample_speech: bytes) -> dict[str, Any]:
    """A completed render of 2.2 s of the sample speech (N0 I0 N1: three segments), as the API shows it now."""
    speech = wav_bytes(decode_wav(normalise_audio(sample_speech).wav)[: int(2.2 * 16_000)])
    render = wait_done(api_url, submit(api_url, sample_portrait, speech).json()["id"])
    assert render["status"] == "completed", render["error"]
    answer: dict[str, Any] = get(render["links"]["self"], timeout=10).json()
    return answer


def _events(url: str, headers: dict[str, str] | None = None, *, until: Any = None) -> tuple[int, list[str]]:
    """Status and the lines of an event stream, read until it ends or `until(lines)` holds."""
    lines: list[str] = []
    with httpx.stream("GET", url, headers=headers or {}, timeout=30) as response:
        for line in response.iter_lines():
            lines.append(line)
            if until is not None and until(lines):
                break
        return response.status_code, lines


def test_the_links_open_the_stream_segments_video_and_events_without_a_key(played: dict[str, Any]) -> None:
    links = played["links"]["playback"]
    assert httpx.get(played["links"]["stream"], timeout=10).status_code == 401  # the keyed link needs a key
    playlist = httpx.get(links["stream"], timeout=10)  # no Authorization header at all
    assert playlist.status_code == 200 and playlist.text.rstrip().endswith("#EXT-X-ENDLIST")
    names = ["init.mp4", *(line for line in playlist.text.splitlines() if line.startswith("seg-"))]
    assert len(names) == 4
    for name in names:  # the playlist's relative links resolve under the signed path
        assert httpx.get(urljoin(links["stream"], name), timeout=10).status_code == 200, name
    video = httpx.get(links["video"], timeout=30)
    assert video.status_code == 200 and video.content == get(played["links"]["video"], timeout=30).content
    status, lines = _events(links["events"])
    progress = [i for i, line in enumerate(lines) if line == "event: progress"]
    assert status == 200 and len(progress) == 1
    data, event_id = lines[progress[0] + 1], lines[progress[0] + 2]
    assert json.loads(data.removeprefix("data: "))["status"] == "completed" and event_id.startswith("id: ")
    again = httpx.get(links["events"], headers={"Last-Event-ID": event_id.removeprefix("id: ")}, timeout=10)
    assert again.status_code == 204  # ended, nothing new: EventSource stops reconnecting


def test_a_link_opens_nothing_else_after_it_expires_or_when_changed(
    played: dict[str, Any], stack_settings: Settings
) -> None:
    stream = played["links"]["playback"]["stream"]
    base, token = stream.rsplit("/", 2)[0], stream.rsplit("/", 2)[1]
    session_id, expires, signature = token.split(".")
    other = "0123456789abcdef0123456789abcdef"
    key = link_key(stack_settings)
    refusals = {
        "expired": f"{base}/{sign(key, session_id, int(time.time()) - 1)}/stream.m3u8",
        "another session": f"{base}/{other}.{expires}.{signature}/stream.m3u8",
        "a later expiry": f"{base}/{session_id}.{int(expires) + 86_400}.{signature}/stream.m3u8",
    }
    for reason, url in refusals.items():
        refused = httpx.get(url, timeout=10)
        assert refused.status_code == 403, reason
        assert refused.headers["content-type"] == "application/problem+json"
        assert ("expired" in refused.json()["detail"]) == (reason == "expired"), refused.json()
    assert httpx.post(stream, timeout=10).status_code == 405  # read-only
    assert httpx.get(f"{base}/{token}/../../v1/renders", timeout=10).status_code in (401, 404)  # no way out


def test_cors_lets_the_configured_origin_read_the_links_and_nothing_more(
    played: dict[str, Any], stack_settings: Settings
) -> None:
    stream = played["links"]["playback"]["stream"]
    origin = stack_settings.links.cors_origins[0]
    allowed = httpx.get(stream, headers={"Origin": origin}, timeout=10)
    assert allowed.headers["access-control-allow-origin"] == origin
    assert "access-control-allow-credentials" not in allowed.headers
    foreign = httpx.get(stream, headers={"Origin": "https://elsewhere.example"}, timeout=10)
    assert "access-control-allow-origin" not in foreign.headers
    preflight = {"Origin": origin, "Access-Control-Request-Method": "GET"}
    with_key = httpx.options(stream, headers=preflight | {"Access-Control-Request-Headers": "authorization"})
    assert with_key.status_code == 400  # a page may not send an API key this way
    write = httpx.options(stream, headers=preflight | {"Access-Control-Request-Method": "POST"})
    assert write.status_code == 400


def test_the_progressive_mp4_has_its_index_first_and_is_made_once(
    played: dict[str, Any], stack: Stack, tmp_path: Path
) -> None:
    links = played["links"]["playback"]
    cached = stack.settings.storage.root / keys.progressive_video(played["id"])  # type: ignore[operator]
    assert not cached.exists()
    first = httpx.get(links["progressive"], timeout=60)
    assert first.status_code == 200 and first.headers["content-type"] == "video/mp4"
    assert [found.kind for found in iter_boxes(first.content)] == [b"ftyp", b"moov", b"mdat"]
    made = cached.stat().st_mtime_ns
    second = get(f"{played['links']['video']}?layout=progressive", timeout=60)  # the keyed link: the same file
    assert second.content == first.content and cached.stat().st_mtime_ns == made  # served, not made again
    fragmented = httpx.get(links["video"], timeout=60).content
    assert abs(len(first.content) - len(fragmented)) < len(fragmented) // 10  # the same samples, other boxes
    (tmp_path / "progressive.mp4").write_bytes(first.content)
    seen = play_video(links["progressive"])  # a plain <video>, no key, no header
    assert seen["played"] and seen["mediaError"] is None and seen["currentTime"] > 0.5, seen


def test_an_hls_js_page_with_no_key_plays_the_stream_in_chromium(
    played: dict[str, Any], stack_settings: Settings, stack: Stack
) -> None:
    """The viewer's page is on another origin (the one MONOLOGUE_LINKS__CORS_ORIGINS names) and holds no key:
    hls.js fetches the playlist and segments across origins and plays them in a <video>."""
    from playwright.sync_api import sync_playwright

    origin = stack_settings.links.cors_origins[0]
    stream = played["links"]["playback"]["stream"]
    page_html = (
        '<!doctype html><video id="video" muted playsinline></video><script src="/hls.min.js"></script>'
        f"<script>const hls = new Hls(); hls.loadSource({json.dumps(stream)}); hls.attachMedia(video);"
        "hls.on(Hls.Events.MANIFEST_PARSED, () => video.play());"
        "hls.on(Hls.Events.ERROR, (_, d) => { if (d.fatal) window.fatal = d.details; });</script>"
    ).encode()
    assert stack.api_key.encode() not in page_html and b"Authorization" not in page_html
    port = int(origin.rsplit(":", 1)[1])
    with LocalServer("127.0.0.1", port) as viewer, sync_playwright() as playwright:
        viewer.routes["/"] = Answer(body=page_html, headers={"Content-Type": "text/html"})
        viewer.routes["/hls.min.js"] = Answer(body=HLS_JS.read_bytes(), headers={"Content-Type": "text/javascript"})
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{origin}/")
            page.wait_for_function("window.fatal || document.getElementById('video').currentTime > 0.5", timeout=30_000)
            seen = page.evaluate("({time: video.currentTime, width: video.videoWidth, fatal: window.fatal || null})")
        finally:
            browser.close()
    assert seen["fatal"] is None and seen["time"] > 0.5 and seen["width"] == played["width"], seen


def test_a_live_sessions_event_stream_has_ids_keep_alives_and_resumes(api_url: str, sample_portrait: bytes) -> None:
    created = post(f"{api_url}/v1/sessions", files={"portrait": ("p.jpg", sample_portrait)}, timeout=60).json()
    try:
        links = created["links"]["playback"]
        # No audio yet: nothing changes (the session waits, queued), so after its one event the stream only pings.
        status, lines = _events(links["events"], until=lambda seen: ": ping" in seen)
        ids = [line.removeprefix("id: ") for line in lines if line.startswith("id: ")]
        assert status == 200 and len(ids) == 1 and lines.count(": ping") == 1
        # Resumed from that id: no event repeats it, only keep-alives until something changes.
        _, resumed = _events(links["events"], {"Last-Event-ID": ids[0]}, until=lambda seen: ": ping" in seen)
        assert not any(line.startswith("event: progress") for line in resumed)
    finally:
        post(f"{created['links']['self']}/cancel", timeout=30)
    ended = poll(api_url, created["id"], lambda s: s["status"] in TERMINAL, api_key=api_key(api_url))
    assert ended["status"] == "cancelled"
    status, lines = _events(links["events"])  # the link still works: the session's last state, then the end
    assert status == 200 and json.loads(lines[lines.index("event: progress") + 1][6:])["status"] == "cancelled"
