"""What the API puts into a session's workflow from the settings (monologue/orchestration.py)."""

from __future__ import annotations

from monologue import contracts as c
from monologue.orchestration import orchestration_config
from monologue.settings import NodeSettings, Settings


def test_a_live_session_gets_the_shorter_live_lease_and_a_render_the_node_lease() -> None:
    settings = Settings(node=NodeSettings(lease_timeout_s=10.0, live_lease_timeout_s=2.0))
    assert orchestration_config(settings, "local", c.SessionKind.LIVE).lease_timeout_s == 2.0
    assert orchestration_config(settings, "local", c.SessionKind.RENDER).lease_timeout_s == 10.0
    assert orchestration_config(settings, "local").lease_timeout_s == 10.0  # a render unless told


def test_a_live_lease_is_never_longer_than_a_renders() -> None:
    settings = Settings(node=NodeSettings(lease_timeout_s=1.0, live_lease_timeout_s=2.0))
    assert orchestration_config(settings, "local", c.SessionKind.LIVE).lease_timeout_s == 1.0
