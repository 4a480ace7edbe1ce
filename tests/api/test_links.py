"""Playback tokens (api/links.py): HMAC-signed, one session, until they expire; anything changed is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from api.links import LinkRefused, expiry, link_key, playback_links, sign, unshared_key, verify
from monologue.settings import LinkSettings, Settings

KEY = b"k" * 32
TTL = 3600.0


def test_a_token_opens_its_session_until_it_expires() -> None:
    now = time.time()
    token = sign(KEY, "abc123", int(now) + 60)
    assert verify(KEY, token, max_ttl_s=TTL, now=now).session_id == "abc123"
    with pytest.raises(LinkRefused, match="expired"):
        verify(KEY, token, max_ttl_s=TTL, now=now + 61)


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
        verify(KEY, change(token), max_ttl_s=TTL)  # type: ignore[operator]
    with pytest.raises(LinkRefused, match="signature"):
        verify(b"another key", token, max_ttl_s=TTL)


def test_an_expiry_has_one_spelling() -> None:
    """A signed token with its expiry written with leading zeros (the same number, another URL) is refused."""
    expires = int(time.time()) + 600
    token = sign(KEY, "abc123", expires)
    padded = token.replace(f".{expires}.", f".0{expires}.")
    assert padded != token and verify(KEY, token, max_ttl_s=TTL).expires == expires
    with pytest.raises(LinkRefused, match="not a playback link"):
        verify(KEY, padded, max_ttl_s=TTL)


def test_a_link_that_lasts_longer_than_the_ttl_is_refused() -> None:
    """Even correctly signed (an old key's owner, a link made under a longer TTL): no link outlives the setting."""
    now = time.time()
    assert verify(KEY, sign(KEY, "abc123", int(now + TTL) + 60), max_ttl_s=TTL, now=now).session_id == "abc123"
    with pytest.raises(LinkRefused, match="MONOLOGUE_LINKS__TTL_S"):
        verify(KEY, sign(KEY, "abc123", int(now + TTL) + 3600), max_ttl_s=TTL, now=now)
    with pytest.raises(LinkRefused, match="MONOLOGUE_LINKS__TTL_S"):
        verify(KEY, sign(KEY, "abc123", 10**12 - 1), max_ttl_s=TTL, now=now)


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


def test_two_api_processes_with_one_secret_accept_each_others_links(tmp_path: Path) -> None:
    """Replicas on different machines (their own homes): with MONOLOGUE_LINKS__SECRET shared, a link one signed
    opens on the other; without it, each makes its own key and the other refuses the link."""
    one, other = tmp_path / "one", tmp_path / "other"
    shared = LinkSettings(secret=SecretStr("a secret every replica holds"))
    token = sign(link_key(Settings(home=one, links=shared)), "s1", int(time.time()) + 60)
    assert verify(link_key(Settings(home=other, links=shared)), token, max_ttl_s=120).session_id == "s1"
    token = sign(link_key(Settings(home=one)), "s1", int(time.time()) + 60)
    with pytest.raises(LinkRefused):
        verify(link_key(Settings(home=other)), token, max_ttl_s=120)


def test_an_api_pod_without_the_shared_secret_says_so() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    problem = unshared_key(Settings(), pod)
    assert problem is not None and "MONOLOGUE_LINKS__SECRET" in problem
    assert unshared_key(Settings(links=LinkSettings(secret=SecretStr("s"))), pod) is None
    assert unshared_key(Settings(), {}) is None  # one machine: its replicas share <home>/link-secret
