"""Playback tokens (api/links.py): HMAC-signed, one session, until they expire; anything changed is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from api.links import LinkRefused, expiry, link_key, playback_links, sign, verify
from monologue.settings import LinkSettings, Settings

KEY = b"k" * 32


def test_a_token_opens_its_session_until_it_expires() -> None:
    now = time.time()
    token = sign(KEY, "abc123", int(now) + 60)
    assert verify(KEY, token, now=now).session_id == "abc123"
    with pytest.raises(LinkRefused, match="expired"):
        verify(KEY, token, now=now + 61)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("abc123", "abc124", 1),  # another session
        lambda t: t.replace(t.split(".")[1], str(int(t.split(".")[1]) + 3600)),  # a later expiry
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the signature itself
        lambda t: t + "x",
        lambda t: "",
    ],
    ids=["session", "expiry", "signature", "garbage", "empty"],
)
def test_a_changed_token_is_refused(change: object) -> None:
    token = sign(KEY, "abc123", int(time.time()) + 600)
    with pytest.raises(LinkRefused):
        verify(KEY, change(token))  # type: ignore[operator]
    with pytest.raises(LinkRefused, match="signature"):
        verify(b"another key", token)


def test_links_expire_when_the_setting_says_rounded_to_the_minute_and_share_a_key_file(tmp_path: Path) -> None:
    assert expiry(LinkSettings(ttl_s=600), now=1000.0) == 1620  # 1600 rounded up to the minute
    settings = Settings(home=tmp_path, links=LinkSettings(ttl_s=120))
    links = playback_links(settings, "s1")
    assert links.stream.startswith("http://127.0.0.1:8000/play/s1.") and links.stream.endswith("/stream.m3u8")
    assert links.progressive.endswith("/video.mp4?layout=progressive")
    assert 60 < links.expires_at.timestamp() - time.time() <= 180
    secret = tmp_path / "link-secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and link_key(settings) == secret.read_bytes().strip()
    given = Settings(home=tmp_path, links=LinkSettings(secret="operator-secret"))
    assert link_key(given) == b"operator-secret"
