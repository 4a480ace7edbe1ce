"""OpenTelemetry traces: off unless `MONOLOGUE_TRACING__EXPORTER=otlp` or `OTEL_TRACES_EXPORTER=otlp` (or a test
installs a provider).

When on, a request's server span (FastAPI's instrumentation, in `api/app.py`) is the parent of the workflow
it starts, and Temporal's `TracingInterceptor` on every client and worker carries the context through the
workflow to each activity it schedules (chunks, publishing, finalize): one trace per session start. The
interceptor only adds headers to what the workflow schedules, so recorded histories replay unchanged
(tests/workflows/test_replay.py replays them with it too). Nothing imports OpenTelemetry while tracing is off.

OpenTelemetry's standard variables win over Monologue's settings, which are their fallback: `OTEL_SDK_DISABLED=true`
turns tracing off, `OTEL_TRACES_EXPORTER` (otlp or none) over `MONOLOGUE_TRACING__EXPORTER`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` over `__OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`
(or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) over `__SERVICE_NAME`; `OTEL_RESOURCE_ATTRIBUTES` and
`OTEL_TRACES_SAMPLER(_ARG)` apply as the SDK reads them (the default sampler: parentbased_always_on). The SDK reads
them from the process's environment itself, so this module looks there too (not at `Settings`), only to see which
are set and not override them."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span
    from temporalio.client import Interceptor

    from monologue.settings import TracingSettings

_provider: TracerProvider | None = None
# opentelemetry.trace.get_current_span, kept once tracing is on: a log line asks it without an import (a line logged
# inside a workflow's sandbox would import OpenTelemetry afresh there).
_current_span: Callable[[], Span] | None = None
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def configure(settings: TracingSettings, service: str) -> TracerProvider | None:
    """Set the process's tracer provider from settings and the standard variables (OTLP over HTTP, batched); None
    when tracing is off."""
    if not exporting(settings, os.environ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # None: the exporter reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces.
    endpoint = None if any(os.environ.get(name) for name in _ENDPOINTS) else settings.otlp_endpoint
    provider = install(settings.service_name or service)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def exporting(settings: TracingSettings, environ: Mapping[str, str]) -> bool:
    """Whether spans are exported: OTEL_SDK_DISABLED, then OTEL_TRACES_EXPORTER, then the setting. A value this
    process cannot honour (another exporter, OTLP over gRPC) stops it, naming the variable."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = (environ.get("OTEL_TRACES_EXPORTER") or settings.exporter).strip().lower()
    if exporter not in ("otlp", "none"):
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: Monologue exports traces over OTLP only (otlp or none)")
    protocol = next((name for name in _PROTOCOLS if environ.get(name)), None)  # the traces' own first
    if exporter == "otlp" and protocol is not None and environ[protocol] != "http/protobuf":
        raise ValueError(f"{protocol}={environ[protocol]!r}: Monologue sends OTLP over HTTP only (http/protobuf)")
    return exporter == "otlp"


def install(service: str, provider: TracerProvider | None = None) -> TracerProvider:
    """Make `provider` (default: a new SDK provider named `service`) the one every span goes to, and turn on
    the Temporal interceptor and the FastAPI instrumentation. Tests pass one with an in-memory exporter."""
    global _provider, _current_span
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    if provider is None:
        provider = TracerProvider(resource=resource(service))  # no sampler given: OTEL_TRACES_SAMPLER's
    if _provider is None:  # OpenTelemetry allows one global provider per process
        trace.set_tracer_provider(provider)
    _provider, _current_span = provider, trace.get_current_span
    return provider


def resource(service: str) -> Resource:
    """The process's resource: `service` as its name unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names
    one (`Resource.create` would let ours win over them), with OTEL_RESOURCE_ATTRIBUTES' other attributes."""
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource

    return Resource.create({SERVICE_NAME: service}).merge(OTELResourceDetector().detect())


def enabled() -> bool:
    return _provider is not None


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the span current here, in hex as OpenTelemetry prints them; None without one."""
    if _provider is None or _current_span is None:
        return None
    context = _current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def temporal_interceptors() -> list[Interceptor]:
    """Temporal's tracing interceptor when tracing is on (clients pass it on to their workers)."""
    if _provider is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(_provider.get_tracer("temporalio"))]


def instrument_app(app: Any) -> None:
    """FastAPI's server spans (one per request) when tracing is on; the metrics and health routes excluded."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=_provider, excluded_urls="/metrics,/healthz,/readyz")


def shutdown() -> None:
    """Flush the spans still batched (a stopping process)."""
    if _provider is not None:
        _provider.shutdown()
