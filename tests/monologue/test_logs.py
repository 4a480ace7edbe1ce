"""Log lines stay whole: the node's log is read back line by line as JSON (tests/test_durability.py, the cluster
bench), and structlog's records share stderr with the standard library's handler."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from monologue.logs import configure_logging


class Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_record_is_one_whole_line_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Writes()
    monkeypatch.setattr("sys.stderr", out)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("json")
        structlog.get_logger("test").info("chunk done", frames=4)
        logging.getLogger("uvicorn.error").warning("a stdlib record")
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
    records = [call for call in out.calls if call.strip()]
    assert len(records) == 2 and all(call.endswith("\n") and call.count("\n") == 1 for call in records), out.calls
    assert [json.loads(call)["event"] for call in records] == ["chunk done", "a stdlib record"]
