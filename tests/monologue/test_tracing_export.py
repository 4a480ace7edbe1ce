"""MONOLOGUE_TRACING__EXPORTER=otlp sends spans over OTLP/HTTP to the configured collector (a loopback server
that decodes what it receives); `none`, the default, makes no provider and no interceptor."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from monologue import tracing
from monologue.settings import TracingSettings


def test_none_makes_no_spans_and_no_interceptor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_provider", None)
    assert tracing.configure(TracingSettings(), "monologue-api") is None
    assert not tracing.enabled() and tracing.temporal_interceptors() == []


def test_otlp_exports_spans_to_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[ExportTraceServiceRequest] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(tracing, "_provider", None)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        provider = tracing.configure(TracingSettings(exporter="otlp", otlp_endpoint=endpoint), "monologue-node")
        assert provider is not None and len(tracing.temporal_interceptors()) == 1
        with provider.get_tracer("test").start_as_current_span("chunk N0"):
            pass
        assert provider.force_flush(10_000)
        provider.shutdown()
    finally:
        server.shutdown()
    spans = [
        span for request in received for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    ]
    assert [span.name for span in spans] == ["chunk N0"]
    service = {a.key: a.value.string_value for a in received[0].resource_spans[0].resource.attributes}["service.name"]
    assert service == "monologue-node"
