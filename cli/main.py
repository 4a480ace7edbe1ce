"""`monologue`: run the embedded stack, its services, and renders from the command line."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from cli.avatars import avatars
from cli.bench import bench
from cli.options import given_options, model_options
from cli.renders import Input, api_target, input_argument, integration_options, render_to_file, renders
from cli.temporal import temporal
from cli.webhooks import webhooks
from monologue import SAMPLES, __version__, options as options_
from monologue.client import Layout
from monologue.contracts import SessionStatus
from monologue.exit import exit_when_done
from monologue.settings import Settings, describe_settings, get_settings

SETTINGS_HELP = "\b\nSettings (environment variables; nested groups use `__`):\n" + describe_settings()
# The session options `render` and `live` take, one --option per field: an option added to this model appears
# in both commands' --help with no edit here (cli/options.py).
SESSION_OPTIONS = options_.request_model()  # derived from contracts.RenderOptions, the one definition


@click.group()
@click.version_option(__version__, prog_name="monologue")
def main() -> None:
    """Monologue: a portrait and speech become a talking-avatar video."""


main.add_command(renders)
main.add_command(avatars)
main.add_command(bench)
main.add_command(temporal)
main.add_command(webhooks)


def _configured() -> Settings:
    from monologue.logs import configure_logging

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    return settings


@main.command(epilog=SETTINGS_HELP)
def up() -> None:
    """Start Temporal, the API and one node on this machine; Ctrl-C stops them all."""
    from cli.stack import Stack

    settings = get_settings()
    # Ctrl-C is recorded from the start: raised as KeyboardInterrupt inside a start-up check (the Temporal
    # client's), it could come back as an ordinary error and be lost, leaving the stack running.
    received = _stop_signals()
    with Stack(settings) as stack:
        if not received:
            _print_urls(settings)
            click.echo(f"logs: {stack.log_dir}\nPress Ctrl-C to stop.")
        _wait_for_signal(received)
    click.echo("stopped")


API_SHUTDOWN_S = 10  # a stopping API closes the connections still open after this long


@main.command()
def api() -> None:
    """Run the API server (uvicorn) in the foreground."""
    import uvicorn

    settings = _configured()
    uvicorn.run(
        "api.app:app_factory",
        factory=True,
        host=settings.api.host,
        port=settings.api.port,
        log_config=None,
        access_log=False,
        # request.client must be the socket's peer: /ops open on loopback is decided from it (api/deps.py), and
        # uvicorn would otherwise take it from X-Forwarded-For, which any client sends through a local proxy.
        proxy_headers=False,
        # Open event streams and audio sockets end with the server instead of holding its shutdown forever.
        timeout_graceful_shutdown=API_SHUTDOWN_S,
    )


@main.command()
def node() -> None:
    """Run one node: poll the shared queue and this node's own queue."""
    from node.worker import run_node

    exit_when_done(lambda: asyncio.run(run_node(_configured())))


@main.command()
def migrate() -> None:
    """Apply the database migrations (MONOLOGUE_DATABASE_URL)."""
    from sqlalchemy.engine import make_url

    from monologue.db import migrate as run_migrations

    settings = get_settings()
    run_migrations(settings.db_url)
    # The URL without its password: this line ends up in the migration Job's log.
    click.echo(f"migrated {make_url(settings.db_url).render_as_string(hide_password=True)}")


@main.command()
@click.argument("portrait", callback=input_argument, required=False)
@click.argument("audio", callback=input_argument, required=False)
@click.option("--avatar", default=None, help="An avatar's id (`monologue avatars create`) instead of PORTRAIT.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("out.mp4"),
    show_default=True,
    help="Where to write the MP4.",
)
@click.option("--api", "api_url", default=None, help="API base URL (default: from settings).")
@click.option(
    "--layout",
    type=click.Choice([layout.value for layout in Layout]),
    default=Layout.FRAGMENTED.value,
    show_default=True,
    help="progressive: the MP4's index first (for editors).",
)
@click.option("--no-wait", is_flag=True, help="Return once the render is made (follow it: `renders watch ID`).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the session as JSON (as made with --no-wait, else as it ended)."
)
@integration_options
@model_options(SESSION_OPTIONS)
def render(
    portrait: Input | None,
    audio: Input | None,
    avatar: str | None,
    output: Path,
    api_url: str | None,
    layout: str,
    no_wait: bool,
    as_json: bool,
    metadata: dict[str, Any] | None,
    callback_url: str | None,
    **options: Any,
) -> None:
    """Render PORTRAIT speaking AUDIO through the API and download the MP4. Each is a file or a URL for the API
    to fetch (https://…, s3://bucket/key). Instead of AUDIO, --text (and --voice): speech synthesised on a node.
    Instead of PORTRAIT, --avatar ID: `monologue render --avatar ID AUDIO`."""
    given = given_options(options, SESSION_OPTIONS)
    if avatar is not None and audio is None:  # `--avatar ID AUDIO`: the one argument is the audio
        portrait, audio = None, portrait
    if (portrait is None) == (avatar is None):
        raise click.UsageError("give PORTRAIT or --avatar, one of them")
    if (audio is None) == (not given.get("text")):
        raise click.UsageError("give AUDIO or --text, one of them")
    render_to_file(
        api_url,
        portrait,
        audio,
        output,
        given,
        layout=Layout(layout),
        wait=not no_wait,
        as_json=as_json,
        metadata=metadata,
        callback_url=callback_url,
        avatar=avatar,
    )


@main.command()
@click.argument("portrait", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@click.argument("audio", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@click.option("--avatar", default=None, help="An avatar's id (`monologue avatars create`) instead of PORTRAIT.")
@click.option("--api", "api_url", default=None, help="API base URL (default: from settings).")
@click.option("--speed", type=float, default=1.0, show_default=True, help="Stream at this multiple of real time.")
@click.option(
    "--interrupt-at",
    type=click.FloatRange(min=0),
    default=None,
    help="Barge in at this second of AUDIO: send `interrupt` instead of the rest (what is not yet spoken is dropped).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the summary.")
@model_options(SESSION_OPTIONS)
def live(
    portrait: Path | None,
    audio: Path | None,
    avatar: str | None,
    api_url: str | None,
    speed: float,
    interrupt_at: float | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Stream AUDIO into a live session of PORTRAIT (or of --avatar ID: `monologue live --avatar ID AUDIO`) in real
    time; print its latency and TTFF."""
    import json

    from cli.live_stream import stream_live

    if avatar is not None and audio is None:
        portrait, audio = None, portrait
    if audio is None or (portrait is None) == (avatar is None):
        raise click.UsageError("give PORTRAIT AUDIO, or --avatar ID AUDIO")
    url, key = api_target(api_url)
    given = given_options(options, SESSION_OPTIONS) or None
    report = stream_live(
        url, portrait, audio, options=given, speed=speed, api_key=key, avatar=avatar, interrupt_at_s=interrupt_at
    )
    session = report.session
    latency = session.get("latency") or {}
    figures = {
        "session": report.session_id,
        "status": session["status"],
        "audio_s": round(report.audio_seconds, 2),
        "streamed_s": round(report.send_seconds, 2),
        "segments_while_streaming": report.segments_while_streaming,
        "reconnects": report.reconnects,
        "interrupted": report.interrupted,
        "ttff_ms": session.get("ttff_ms"),
        "latency_p50_ms": latency.get("p50_ms"),
        "latency_p95_ms": latency.get("p95_ms"),
        "latency_max_ms": latency.get("max_ms"),
        "chunk_s": session["options"]["chunk_frames"] / session["options"]["fps"],
        "stream": session["links"]["stream"],
        "errors": report.errors,
    }
    if as_json:
        click.echo(json.dumps(figures))
    else:
        for name, value in figures.items():
            click.echo(f"{name:>26}: {value}")
    if session["status"] != SessionStatus.COMPLETED:
        raise SystemExit(f"live session ended {session['status']}: {session.get('error')}")


@main.command(epilog=SETTINGS_HELP)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the MP4 (default: <home>/demo.mp4).",
)
@click.option(
    "--keep-running/--exit",
    default=None,
    help="Keep the stack up after the render (default: only when run in a terminal).",
)
def demo(output: Path | None, keep_running: bool | None) -> None:
    """Start the embedded stack and render the bundled sample (a real portrait, real speech)."""
    from cli.stack import Stack, http_ok

    settings = get_settings()
    output = output or settings.home / "demo.mp4"
    api_url = str(settings.api.public_url)
    started = time.monotonic()
    stack = None
    if not http_ok(f"{api_url}/healthz"):
        click.echo("starting Temporal, the API and a node…")
        stack = Stack(settings)
        stack.start()
    try:
        render_to_file(api_url, SAMPLES / "portrait.jpg", SAMPLES / "speech.wav", output, {})
        click.echo(f"\nvideo:       {output.resolve()}  ({time.monotonic() - started:.1f} s in all)")
        _print_urls(settings)
        if stack is not None and (keep_running if keep_running is not None else sys.stdout.isatty()):
            click.echo("The stack is still running; press Ctrl-C to stop it.")
            _wait_for_signal()
    finally:
        if stack is not None:
            stack.stop()


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}, add_help_option=False
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def gate(args: tuple[str, ...]) -> None:
    """Does CANDIDATE match BASELINE? Render records or MP4s: bit-identical, or within a PSNR/SSIM band.
    Exit 0 pass, 1 fail, 2 bad input (`monologue gate --help` for the options)."""
    from monologue.gate import main as gate_main  # its options are defined once, there (argparse)

    sys.exit(gate_main(list(args)))


@main.group()
def keys() -> None:
    """API keys: every /v1 route and /ops needs one (sent as 'Authorization: Bearer <key>')."""


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant whose sessions the key sees (lowercase, digits, dashes).")
@click.option("--ops", is_flag=True, help="Also open the operator's UI (/ops), which sees every tenant.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="SCOPE",
    help="Grant a scope (repeatable): ops, or priority (may ask for priority=high renders: docs/scheduling.md).",
)
def keys_create(tenant: str, ops: bool, scopes: tuple[str, ...]) -> None:
    """Create a key and print it once (only its hash is stored)."""
    from monologue import apikeys

    granted = tuple(dict.fromkeys((*scopes, *(("ops",) if ops else ()))))
    with _db() as db:
        try:
            key_id, key = apikeys.create_key(db, tenant=tenant, scopes=granted)
        except ValueError as err:
            raise click.BadParameter(str(err)) from err
    shown = f" ({', '.join(granted)})" if granted else ""
    click.echo(f"key {key_id} for tenant {tenant}{shown}:\n{key}")


@keys.command("list")
def keys_list() -> None:
    """Keys by id, tenant and scopes (never the keys themselves)."""
    from monologue import apikeys

    with _db() as db:
        for row in apikeys.list_keys(db):
            state = f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active"
            click.echo(f"{row.id}  {row.tenant:<20} {','.join(row.scopes) or '-':<6} {state}")


@keys.command("revoke")
@click.argument("key_id")
def keys_revoke(key_id: str) -> None:
    """Revoke a key by its id (the 8 hex digits after mk_)."""
    from monologue import apikeys

    with _db() as db:
        if not apikeys.revoke_key(db, key_id):
            raise click.ClickException(f"no active key {key_id}")
    click.echo(f"revoked {key_id}")


def _db() -> Any:
    from monologue.db import make_engine, make_sessionmaker, migrate

    settings = get_settings()
    migrate(settings.db_url)
    return make_sessionmaker(make_engine(settings.db_url))()


def _print_urls(settings: Settings) -> None:
    click.echo(f"API:         {settings.api.public_url}  (docs: {settings.api.public_url}/docs)")
    click.echo(f"Temporal UI: {settings.temporal.ui_url}")


def _stop_signals() -> list[int]:
    """From now on SIGINT and SIGTERM are appended to the returned list instead of interrupting."""
    received: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, _f: received.append(s))
    return received


def _wait_for_signal(received: list[int] | None = None) -> None:
    received = _stop_signals() if received is None else received
    while not received:
        time.sleep(0.2)
