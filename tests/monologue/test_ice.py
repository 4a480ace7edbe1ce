"""ICE settings and the servers minted from them (monologue/ice.py); coturn itself accepting the credentials is
tests/node/test_webrtc_turn.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from monologue.ice import IceServer, ice_servers
from monologue.settings import IceSettings, Settings, to_env
from monologue.settings_services import IceTransportPolicy


def test_no_servers_without_settings() -> None:
    assert ice_servers(IceSettings(), "viewer-s1", now=1000.0) == []


def test_turn_credentials_expire_after_the_ttl_and_name_who_uses_them() -> None:
    settings = IceSettings(
        stun_urls=["stun:stun.example.net:3478"],
        turn_urls=["turn:turn.example.net:3478?transport=udp", "turns:turn.example.net:5349?transport=tcp"],
        turn_secret=SecretStr("s3cret"),
        credential_ttl_s=600,
    )
    stun, turn = ice_servers(settings, "viewer-a/b", now=1000.4)
    assert stun == IceServer(("stun:stun.example.net:3478",))
    assert turn.urls == tuple(settings.turn_urls) and turn.username == "1600:viewer-a_b"
    other = ice_servers(settings.model_copy(update={"turn_secret": SecretStr("other")}), "viewer-a/b", now=1000.4)[1]
    assert turn.credential and other.credential != turn.credential  # the secret signs it
    assert turn.link_headers()[1] == (
        '<turns:turn.example.net:5349?transport=tcp>; rel="ice-server"; username="1600:viewer-a_b"; '
        f'credential="{turn.credential}"; credential-type="password"'
    )
    assert stun.as_json() == {"urls": ["stun:stun.example.net:3478"]}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"turn_urls": ["turn:t:3478"]}, "need turn_secret"),
        ({"stun_urls": ["http://stun"]}, "starts with stun:"),
        ({"turn_urls": ["stun:t"], "turn_secret": "x"}, "starts with turn:"),
        ({"transport_policy": "relay"}, "relay needs turn_urls"),
    ],
)
def test_inconsistent_settings_are_refused_with_what_to_fix(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        IceSettings.model_validate(fields)


def test_the_secret_reaches_a_child_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ice = IceSettings(
        turn_urls=["turn:t:3478"], turn_secret=SecretStr("s3cret"), transport_policy=IceTransportPolicy.RELAY
    )
    original = Settings(home=tmp_path, ice=ice)
    for key, value in to_env(original).items():
        monkeypatch.setenv(key, value)
    assert Settings() == original and Settings().ice.turn_secret == SecretStr("s3cret")
