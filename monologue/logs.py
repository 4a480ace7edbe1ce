"""structlog setup: JSON lines when not on a TTY (services, CI), readable console output on a TTY.
Bind session, workflow, chunk and node ids with `structlog.contextvars.bound_contextvars` at every
boundary so every line carries them; with tracing on, a line logged under a span carries its `trace_id` and
`span_id` too, so a log line finds its trace. Never used inside workflow code (that uses `workflow.logger`)."""

from __future__ import annotations

import logging
import sys
from typing import Literal
from urllib.parse import urlsplit

import structlog

from monologue import tracing


def configure_logging(fmt: Literal["auto", "json", "console"] = "auto", level: str = "info") -> None:
    """Configure structlog and the standard library's root logger for this process."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        # One write per line (print() writes the line and its newline apart, and the stdlib handler below can land
        # between them: two records on one line, which no JSON reader parses).
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Route third-party stdlib logging (uvicorn, temporalio, alembic) through the same renderer.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def add_trace_ids(_logger: object, _method: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
    """`trace_id` and `span_id` (hex, as OpenTelemetry and trace backends print them) of the span current where the
    line is logged; nothing without one (or with tracing off)."""
    ids = tracing.current_ids()
    if ids is not None:
        event.setdefault("trace_id", ids[0])
        event.setdefault("span_id", ids[1])
    return event


class QueryStringFilter(logging.Filter):
    """Drops the query string from the paths in uvicorn's access lines and WebSocket handshake lines: a live audio
    ticket rides in one (`/v1/sessions/<id>/audio?ticket=tk_…`), and a log is no place for a credential."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_query(arg) for arg in record.args)
        return True


def _without_query(arg: object) -> object:
    if isinstance(arg, str) and arg.startswith("/") and "?" in arg:
        return urlsplit(arg).path
    return arg


def redact_query_strings() -> None:
    """Install `QueryStringFilter` on uvicorn's loggers (once per process; uvicorn logs handshakes on
    `uvicorn.error`, requests on `uvicorn.access`)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, QueryStringFilter) for existing in logger.filters):
            logger.addFilter(QueryStringFilter())
