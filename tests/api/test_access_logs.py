"""No credential reaches a log line: uvicorn's WebSocket handshake lines name the path without its query string,
where a live audio ticket rides (`/v1/sessions/<id>/audio?ticket=tk_…`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from websockets.sync.client import connect

from monologue.db import migrate
from monologue.logs import QueryStringFilter
from monologue.settings import Settings
from tests.helpers import serve_api

TICKET = "tk_0123456789ab_" + "x" * 32


def test_websocket_handshake_lines_carry_no_ticket(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(home=tmp_path)
    migrate(settings.db_url)
    caplog.set_level(logging.INFO, logger="uvicorn.error")
    with serve_api(settings) as (api, _app):
        socket = connect(f"{api.replace('http', 'ws', 1)}/v1/sessions/nosuch/audio?ticket={TICKET}")
        with socket:
            assert "ticket is not valid" in str(socket.recv(timeout=30))  # accepted, then refused: logged
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("uvicorn")]
    assert any('"WebSocket /v1/sessions/nosuch/audio"' in line for line in lines), lines
    assert not any("ticket" in line for line in lines), lines


def test_the_filter_keeps_everything_but_the_query() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("1.2.3.4:5", "GET", "/a?b=c", "1.1", 200),
        None,
    )
    assert QueryStringFilter().filter(record)
    assert record.getMessage() == '1.2.3.4:5 - "GET /a HTTP/1.1" 200'
