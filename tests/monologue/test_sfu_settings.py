"""The SFU's settings (monologue/settings_services.py: SfuSettings): a session's Janus server, chosen the same way
by the API and every node; what makes a list of servers wrong; the mountpoint secret every node derives alike."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import SecretStr, ValidationError

from monologue.settings_services import SfuSettings

SERVERS = [f"http://janus-{n}:8088/janus" for n in range(3)]
SESSIONS = [f"live-{n:04d}" for n in range(600)]


def test_each_session_has_one_server_chosen_alike_everywhere_and_spread_over_them() -> None:
    sfu = SfuSettings(janus_url=" , ".join(SERVERS))
    assert sfu.servers() == SERVERS
    chosen = {session: sfu.janus_for(session) for session in SESSIONS}
    again = SfuSettings(janus_url=",".join(reversed(SERVERS)))  # another process, the list in another order
    assert all(again.janus_for(session) == server for session, server in chosen.items())
    spread = Counter(chosen.values())
    assert set(spread) == set(SERVERS) and min(spread.values()) > len(SESSIONS) / 3 * 0.8, spread
    assert sfu.rtp_address("live-0001") == sfu.janus_for("live-0001").split("//")[1].split(":")[0]


def test_a_server_added_takes_only_the_sessions_it_wins() -> None:
    before = SfuSettings(janus_url=",".join(SERVERS))
    added = "http://janus-new:8088/janus"
    after = SfuSettings(janus_url=",".join([*SERVERS, added]))
    moved = [session for session in SESSIONS if before.janus_for(session) != after.janus_for(session)]
    assert moved and all(after.janus_for(session) == added for session in moved)
    assert len(moved) < len(SESSIONS) / 4 * 1.3  # about a quarter: the new server's share


def test_a_wrong_server_list_is_refused_naming_the_problem() -> None:
    with pytest.raises(ValidationError, match="http\\(s\\) URLs"):
        SfuSettings(janus_url="http://janus-0:8088/janus,janus-1:8088")
    with pytest.raises(ValidationError, match="names no server"):
        SfuSettings(janus_url=" , ")
    with pytest.raises(ValidationError, match="rtp_host names one Janus"):
        SfuSettings(janus_url=",".join(SERVERS), rtp_host="10.0.0.5")
    with pytest.raises(ValueError, match="no SFU"):
        SfuSettings().janus_for("live-1")
    assert SfuSettings(janus_url=SERVERS[0], rtp_host="10.0.0.5").rtp_address("live-1") == "10.0.0.5"


def test_the_mountpoint_secret_is_the_same_for_every_reader_of_one_api_secret() -> None:
    one = SfuSettings(janus_url=SERVERS[0], api_secret=SecretStr("s3cret"))
    assert one.mountpoint_secret("live-1") == SfuSettings(api_secret=SecretStr("s3cret")).mountpoint_secret("live-1")
    assert one.mountpoint_secret("live-1") != one.mountpoint_secret("live-2")
    assert one.mountpoint_secret("live-1") != SfuSettings(api_secret=SecretStr("other")).mountpoint_secret("live-1")
