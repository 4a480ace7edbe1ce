"""Captions as viewers get them, on the real stack: a render spoken from text with `captions=files` has a multivariant
playlist (`main.m3u8`) whose subtitle rendition hls.js shows in Chromium through the signed link, cue for cue as in
captions.vtt; with `captions=burn` the cues are drawn into the frames, exactly on the frames a cue covers, the same
bytes every time."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest

from cli.stack import Stack
from monologue.captions import Cue, read_cues
from monologue.settings import Settings
from tests.browser import CHROMIUM_ARGS, chromium_path
from tests.helpers import api_headers, get, post, wait_done
from tests.local_server import Answer, LocalServer

pytestmark = pytest.mark.slow
HLS_JS = Path(__file__).resolve().parents[2] / "api" / "ops" / "static" / "vendor" / "hls.min.js"
TEXT = "Hello there. Captions follow the words as they are spoken, line by line."
OPTIONS = {"text": TEXT, "voice": "espeak:en-us", "preview": "true", "seed": "7"}
_TIMING = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})$")


def _render(api_url: str, portrait: bytes, captions: str) -> dict[str, Any]:
    created = post(
        f"{api_url}/v1/renders",
        files={"portrait": ("portrait.jpg", portrait)},
        data={**OPTIONS, "captions": captions},
        timeout=60,
    )
    assert created.status_code == 201, created.text
    render = wait_done(api_url, created.json()["id"])
    assert render["status"] == "completed", render["error"]
    return render


@pytest.fixture(scope="module")
def captioned(api_url: str, sample_portrait: bytes) -> dict[str, Any]:
    return _render(api_url, sample_portrait, "files")


def _out(stack: Stack, session_id: str) -> Path:
    root = stack.settings.storage.root
    assert root is not None
    return root / "sessions" / session_id / "out"


def _parse_vtt(text: str) -> list[Cue]:
    """The cues of a WebVTT file (times and text), read here independently of monologue.captions."""
    blocks = text.strip().split("\n\n")
    assert blocks[0] == "WEBVTT"
    cues = []
    for block in blocks[1:]:
        timing, *lines = block.split("\n")
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, _TIMING.fullmatch(timing).groups())  # type: ignore[union-attr]
        cues.append(Cue(h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000, "\n".join(lines)))
    return cues


def test_the_multivariant_playlist_puts_the_subtitle_rendition_beside_the_stream(
    captioned: dict[str, Any], api_url: str
) -> None:
    links = captioned["links"]
    assert links["captioned_stream"] == f"{api_url}/v1/renders/{captioned['id']}/main.m3u8"
    main = get(links["captioned_stream"], timeout=10)
    assert main.status_code == 200 and main.headers["content-type"] == "application/vnd.apple.mpegurl"
    assert (
        '#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="subs",NAME="Captions",LANGUAGE="en-US",DEFAULT=YES,AUTOSELECT=YES,'
        'URI="subs.m3u8"' in main.text
    )
    inf = next(line for line in main.text.splitlines() if line.startswith("#EXT-X-STREAM-INF:"))
    size = f"{captioned['width'] // 2}x{captioned['height'] // 2}"  # a preview: half the size
    assert f"RESOLUTION={size}" in inf and 'SUBTITLES="subs"' in inf
    assert re.search(r'CODECS="avc1\.[0-9a-f]{6},mp4a\.40\.2"', inf) and re.search(r"BANDWIDTH=[1-9]\d+", inf), inf
    assert main.text.splitlines()[-1] == "stream.m3u8"
    subs = get(urljoin(links["captioned_stream"], "subs.m3u8"), timeout=10).text.splitlines()
    assert subs[-2:] == ["captions.vtt", "#EXT-X-ENDLIST"] and "#EXT-X-PLAYLIST-TYPE:VOD" in subs
    seconds = captioned["progress"]["frames_total"] / int(captioned["options"]["fps"])
    assert float(subs[-3].removeprefix("#EXTINF:").rstrip(",")) == pytest.approx(seconds, abs=1e-6)
    playback = links["playback"]
    assert playback["captioned_stream"] == urljoin(playback["stream"], "main.m3u8")
    assert httpx.get(playback["captioned_stream"], timeout=10).text == main.text  # no key: the signed link
    assert httpx.get(links["captioned_stream"], timeout=10).status_code == 401


def test_hls_js_shows_the_captions_cue_for_cue_through_the_signed_link_in_chromium(
    captioned: dict[str, Any], stack_settings: Settings, stack: Stack
) -> None:
    """A viewer's page on another origin, with no key: hls.js plays the multivariant playlist, and the <video> gets a
    subtitles text track (shown) holding exactly captions.vtt's cues, at their times."""
    from playwright.sync_api import sync_playwright

    main = captioned["links"]["playback"]["captioned_stream"]
    expected = _parse_vtt(httpx.get(urljoin(main, "captions.vtt"), timeout=10).text)
    assert len(expected) >= 2 and expected == list(
        read_cues((_out(stack, captioned["id"]) / "captions.json").read_bytes())
    )
    origin = stack_settings.links.cors_origins[0]
    page_html = (
        '<!doctype html><video id="video" muted playsinline></video><script src="/hls.min.js"></script>'
        f"<script>const hls = new Hls(); hls.loadSource({json.dumps(main)}); hls.attachMedia(video);"
        "hls.on(Hls.Events.MANIFEST_PARSED, () => video.play());"
        "hls.on(Hls.Events.ERROR, (_, d) => { if (d.fatal) window.fatal = d.details; });</script>"
    ).encode()
    tracks = """[...video.textTracks].map(t => ({kind: t.kind, label: t.label, language: t.language, mode: t.mode,
        cues: t.cues ? [...t.cues].map(c => ({start: c.startTime, end: c.endTime, text: c.text})) : null}))"""
    loaded = f"[...video.textTracks].some(t => t.kind === 'subtitles' && t.cues && t.cues.length >= {len(expected)})"
    with LocalServer("127.0.0.1", int(origin.rsplit(":", 1)[1])) as viewer, sync_playwright() as playwright:
        viewer.routes["/"] = Answer(body=page_html, headers={"Content-Type": "text/html"})
        viewer.routes["/hls.min.js"] = Answer(body=HLS_JS.read_bytes(), headers={"Content-Type": "text/javascript"})
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{origin}/")
            page.wait_for_function(f"window.fatal || (video.currentTime > 0.5 && {loaded})", timeout=30_000)
            seen = page.evaluate(f"({{fatal: window.fatal || null, time: video.currentTime, tracks: {tracks}}})")
        finally:
            browser.close()
    assert seen["fatal"] is None and seen["time"] > 0.5, seen
    (track,) = [track for track in seen["tracks"] if track["kind"] == "subtitles"]
    assert track["label"] == "Captions" and track["language"] == "en-US" and track["mode"] == "showing", track
    shown = [Cue(cue["start"], cue["end"], cue["text"]) for cue in track["cues"]]
    assert [cue.text for cue in shown] == [cue.text for cue in expected]
    for got, want in zip(shown, expected, strict=True):  # on the video's timeline, to the millisecond
        assert got.start_s == pytest.approx(want.start_s, abs=0.0015) and got.end_s == pytest.approx(
            want.end_s, abs=0.0015
        )


def _frame_hashes(stack: Stack, session_id: str) -> list[str]:
    lines = (_out(stack, session_id) / "frames.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [row["frame"] for row in rows] == list(range(len(rows)))
    return [row["sha256"] for row in rows]


def test_burned_captions_change_exactly_the_frames_under_a_cue_and_the_same_bytes_twice(
    captioned: dict[str, Any], api_url: str, sample_portrait: bytes, stack: Stack
) -> None:
    """`captions=burn` against `captions=files` (whose frames are the plain render's): the frames a cue covers differ
    and every other frame is the same; two burned renders are the same video byte for byte."""
    burned = [_render(api_url, sample_portrait, "burn") for _ in range(2)]
    assert burned[0]["links"]["captioned_stream"] is not None  # the files come with burn too
    plain = _frame_hashes(stack, captioned["id"])
    first, second = (_frame_hashes(stack, render["id"]) for render in burned)
    assert first == second
    assert (_out(stack, burned[0]["id"]) / "final.mp4").read_bytes() == (
        _out(stack, burned[1]["id"]) / "final.mp4"
    ).read_bytes()
    cues = read_cues((_out(stack, burned[0]["id"]) / "captions.json").read_bytes())
    fps = int(captioned["options"]["fps"])
    under = [any(cue.start_s <= frame / fps < cue.end_s for cue in cues) for frame in range(len(plain))]
    assert sum(under) > 0 and not all(under)
    assert [digest != plain[frame] for frame, digest in enumerate(first)] == under
    headers = api_headers(api_url)
    assert httpx.get(burned[0]["links"]["captioned_stream"], headers=headers, timeout=10).status_code == 200
