"""Log lines stay whole: the node's log is read back line by line as JSON (tests/test_durability.py, the cluster
bench), and structlog's records share stderr with the standard library's handler. With tracing on, a line names the
span it was logged under."""

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


def test_a_line_logged_inside_a_span_carries_its_trace_and_span_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """With tracing on, every JSON line logged under a span (structlog's and the standard library's) names it, in
    the hex OpenTelemetry prints; a line outside any span names none."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from monologue import tracing

    out = Writes()
    monkeypatch.setattr("sys.stderr", out)
    provider = TracerProvider()
    # As tracing.install does, undone after the test (the process's global provider is left alone).
    monkeypatch.setattr(tracing, "_provider", provider)
    monkeypatch.setattr(tracing, "_current_span", trace.get_current_span)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("json")
        with provider.get_tracer("test").start_as_current_span("chunk N0") as span:
            structlog.get_logger("test").info("chunk done")
            logging.getLogger("temporalio.activity").warning("a stdlib record")
        structlog.get_logger("test").info("after the span")
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
    inside, stdlib, after = (json.loads(call) for call in out.calls if call.strip())
    context = span.get_span_context()
    ids = {"trace_id": trace.format_trace_id(context.trace_id), "span_id": trace.format_span_id(context.span_id)}
    assert {key: inside[key] for key in ids} == ids and {key: stdlib[key] for key in ids} == ids
    assert "trace_id" not in after and "span_id" not in after
