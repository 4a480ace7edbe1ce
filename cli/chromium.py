"""Headless Chromium's flags (Debian's package, driven by Playwright): the browser tests and `monologue bench live
--webrtc` launch it with these."""

from __future__ import annotations

CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # The machine has no network: stop Chromium from calling home (and failing) at every start.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
