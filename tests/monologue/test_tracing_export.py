"""MONOLOGUE_TRACING__EXPORTER=otlp sends spans over OTLP/HTTP to the configured collector (a loopback server
that decodes what it receives); `none`, the default, makes no provider and no interceptor. OpenTelemetry's
standard OTEL_* variables win over those settings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

from monologue import tracing
from monologue.settings import TracingSettings

# What would change where spans go or what they say: unset for the test of the settings alone.
STANDARD = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


def test_none_makes_no_spans_and_no_interceptor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_provider", None)
    assert tracing.configure(TracingSettings(), "monologue-api") is None
    assert not tracing.enabled() and tracing.temporal_interceptors() == []


@contextmanager
def _collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """A loopback OTLP/HTTP collector: (its traces URL, the requests it received, decoded)."""
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
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()


def _export_one_span(settings: TracingSettings, service: str) -> TracerProvider:
    provider = tracing.configure(settings, service)
    assert provider is not None and len(tracing.temporal_interceptors()) == 1
    with provider.get_tracer("test").start_as_current_span("chunk N0"):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    return provider


def _resource(received: list[ExportTraceServiceRequest]) -> dict[str, str]:
    spans = [
        span for request in received for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    ]
    assert [span.name for span in spans] == ["chunk N0"]
    return {a.key: a.value.string_value for a in received[0].resource_spans[0].resource.attributes}


def test_otlp_exports_spans_to_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in STANDARD:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracing, "_provider", None)
    with _collector() as (endpoint, received):
        _export_one_span(TracingSettings(exporter="otlp", otlp_endpoint=endpoint), "monologue-node")
    assert _resource(received)["service.name"] == "monologue-node"


def test_the_standard_otel_variables_win_over_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_EXPORTER turns tracing on, the OTEL endpoint and service name win over Monologue's, and the
    resource attributes and the sampler are the SDK's from the environment."""
    monkeypatch.setattr(tracing, "_provider", None)
    settings = TracingSettings(exporter="none", otlp_endpoint="http://127.0.0.1:9/v1/traces", service_name="ours")
    with _collector() as (endpoint, received):
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
        provider = _export_one_span(settings, "monologue-api")
    assert provider.sampler.get_description() == "TraceIdRatioBased{1.0}"
    resource = _resource(received)
    assert resource["service.name"] == "from-otel" and resource["deployment.environment"] == "staging"


def test_otel_sdk_disabled_turns_tracing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_provider", None)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.configure(TracingSettings(exporter="otlp"), "monologue-api") is None
    assert not tracing.enabled() and tracing.temporal_interceptors() == []


def test_an_exporter_or_protocol_it_cannot_honour_stops_it_naming_the_variable() -> None:
    settings = TracingSettings(exporter="otlp")
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        tracing.exporting(settings, {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL='grpc'"):
        tracing.exporting(settings, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert tracing.exporting(settings, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert not tracing.exporting(settings, {"OTEL_TRACES_EXPORTER": "none"})
