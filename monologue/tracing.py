"""OpenTelemetry traces: off unless `MONOLOGUE_TRACING__EXPORTER=otlp` (or a test installs a provider).

When on, a request's server span (FastAPI's instrumentation, in `api/app.py`) is the parent of the workflow
it starts, and Temporal's `TracingInterceptor` on every client and worker carries the context through the
workflow to each activity it schedules (chunks, publishing, finalize): one trace per session start. The
interceptor only adds headers to what the workflow schedules, so recorded histories replay unchanged
(tests/workflows/test_replay.py replays them with it too). Nothing imports OpenTelemetry while tracing is off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.client import Interceptor

    from monologue.settings import TracingSettings

_provider: TracerProvider | None = None


def configure(settings: TracingSettings, service: str) -> TracerProvider | None:
    """Set the process's tracer provider from settings (OTLP over HTTP, batched); None when tracing is off."""
    if settings.exporter == "none":
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = install(settings.service_name or service)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    return provider


def install(service: str, provider: TracerProvider | None = None) -> TracerProvider:
    """Make `provider` (default: a new SDK provider named `service`) the one every span goes to, and turn on
    the Temporal interceptor and the FastAPI instrumentation. Tests pass one with an in-memory exporter."""
    global _provider
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    if provider is None:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if _provider is None:  # OpenTelemetry allows one global provider per process
        trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def enabled() -> bool:
    return _provider is not None


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
