"""`monologue renders list|show|cancel|resume|watch`, and what `monologue render` and `demo` do: sessions (renders
and live ones) over the HTTP API, with the key the CLI uses (MONOLOGUE_API_KEY, else the embedded stack's), so it
works against any deployment."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import click

from monologue.captions import PUBLISHED_CAPTIONS
from monologue.client import Client, ClientError, Layout
from monologue.contracts import SessionStatus
from monologue.schemas import RenderPublic
from monologue.settings import get_settings

Input = Path | str  # a render's input: a file to upload, or a URL for the API to fetch

api_option = click.option("--api", "api_url", default=None, help="API base URL (default: from settings).")
json_option = click.option("--json", "as_json", is_flag=True, help="JSON, as the API returns it.")


def api_target(api_url: str | None) -> tuple[str, str | None]:
    """The API's base URL (given, else the settings' public URL) and the key to send."""
    from monologue.apikeys import read_local_key

    settings = get_settings()
    return api_url or str(settings.api.public_url), read_local_key(settings.home)


@contextlib.contextmanager
def api_or_stack(api_url: str | None, *, changes: dict[str, Any] | None = None) -> Iterator[tuple[str, str | None]]:
    """(url, key) of the API given, or of the embedded stack: the one running, else one started for a benchmark and
    stopped after it (with `changes`, e.g. {"ice": IceSettings} or {"sfu": SfuSettings}: always one started, its API
    and node using those settings)."""
    from cli.stack import Stack, http_ok

    url, key = api_target(api_url)
    running = api_url is not None or http_ok(f"{url}/healthz")
    if running and changes:
        raise click.UsageError("--turn and --sfu start a stack of their own: stop the running one (or leave out --api)")
    if running:
        yield url, key
        return
    click.echo("starting Temporal, the API and a node…", err=True)
    settings = get_settings().model_copy(update=changes or {})
    with Stack(settings) as stack:
        yield url, stack.api_key


@contextlib.contextmanager
def connected(api_url: str | None) -> Iterator[Client]:
    """A client of the API with the CLI's key; its refusals become one line on stderr and exit status 1, never a
    traceback."""
    url, key = api_target(api_url)
    try:
        with Client(url, api_key=key) as client:
            yield client
    except ClientError as err:
        raise click.ClickException(str(err)) from err


@click.group()
def renders() -> None:
    """Renders and live sessions through the API: list, show, cancel, resume, watch."""


@renders.command("list")
@api_option
@click.option("--status", type=click.Choice([status.value for status in SessionStatus]), help="Only these.")
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True)
@json_option
def list_command(api_url: str | None, status: str | None, limit: int, offset: int, as_json: bool) -> None:
    """The key's sessions, newest first: id, kind, status, chunks done, created."""
    with connected(api_url) as client:
        items = client.list_sessions(status=status, limit=limit, offset=offset)
    if as_json:
        click.echo(json.dumps([render.model_dump(mode="json") for render in items]))
        return
    for render in items:
        created = render.created_at.isoformat()
        click.echo(f"{render.id}  {render.kind:<6} {render.status:<9} {_chunks(render):>12}  {created}")


@renders.command("show")
@click.argument("session_id")
@api_option
def show_command(session_id: str, api_url: str | None) -> None:
    """One session, as the API shows it (JSON)."""
    with connected(api_url) as client:
        click.echo(client.get(session_id).model_dump_json(indent=2))


@renders.command("cancel")
@click.argument("session_id")
@api_option
def cancel_command(session_id: str, api_url: str | None) -> None:
    """Stop a session within a chunk; what was published stays playable."""
    with connected(api_url) as client:
        render = client.cancel(session_id)
    click.echo(f"render {session_id}: cancel requested ({render.status})")


@renders.command("resume")
@click.argument("session_id")
@api_option
def resume_command(session_id: str, api_url: str | None) -> None:
    """Start a failed or cancelled session again from its last checkpoint."""
    with connected(api_url) as client:
        render = client.resume(session_id)
    click.echo(f"render {session_id}: resumed ({render.status})")


@renders.command("watch")
@click.argument("session_id")
@api_option
def watch_command(session_id: str, api_url: str | None) -> None:
    """Print a line whenever the session's status or progress changes (its event stream), until it ends; exit
    status 1 unless it completed."""
    last: list[str] = []

    def show(render: RenderPublic) -> None:
        line = f"{render.status:<9} {_chunks(render)}"
        if line not in last[-1:]:
            last.append(line)
            click.echo(line)

    with connected(api_url) as client:
        render = client.wait(session_id, on_progress=show)
    click.echo(f"completed: {render.links.video} ({render.progress.frames_total} frames)")


def _chunks(render: RenderPublic) -> str:
    progress = render.progress
    return f"{progress.chunks_done}/{progress.chunks_total or '?'} chunks"


def input_argument(ctx: click.Context, param: click.Parameter, value: str | None) -> Input | None:
    """A render's input on the command line (a click callback): a file, or a URL (anything with `scheme://`) that
    the API fetches. The API says which URLs it takes (https://, s3://bucket/key from the buckets the operator
    allows): no second list here to drift from it."""
    if value is None:  # an optional input left out (AUDIO, with --text)
        return None
    if "://" in value:
        return value
    path = Path(value)
    if not path.is_file():
        raise click.BadParameter(f"{value!r} is no file (an input is a file or a URL: https://… or s3://bucket/key)")
    return path


def metadata_option(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any] | None:
    """`--metadata`: a JSON object (its bounds are the API's to check: one definition)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not valid JSON ({err.msg})") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter('a JSON object, e.g. {"order": "A-17"}')
    return parsed


def integration_options(command: Any) -> Any:
    """`--metadata` and `--callback-url`: what a create attaches to its session besides the options."""
    command = click.option(
        "--callback-url", default=None, help="Also POST the session's end here, signed (the secret is printed once)."
    )(command)
    return click.option(
        "--metadata",
        default=None,
        callback=metadata_option,
        help='Your own JSON object, returned in the session and its webhooks, e.g. \'{"order": "A-17"}\'.',
    )(command)


def render_to_file(
    api_url: str | None,
    portrait: Input | None,
    audio: Input | None,
    output: Path,
    options: dict[str, Any],
    *,
    layout: Layout = Layout.FRAGMENTED,
    wait: bool = True,
    as_json: bool = False,
    metadata: dict[str, Any] | None = None,
    callback_url: str | None = None,
    avatar: str | None = None,
) -> None:
    """Start a render of `portrait` (or of the avatar of that id) and `audio` (files or URLs; None: the options' text
    is spoken), follow it with a
    bar of chunks and download the MP4 with a bar of bytes (both on stderr; off a TTY only their labels).
    `wait=False`: return once it is made.
    `as_json`: stdout holds only the session as JSON (as made, or as it finished); the other lines go to stderr."""
    with connected(api_url) as client:
        created = client.create_render(
            portrait=_file(portrait),
            portrait_url=_url(portrait),
            audio=_file(audio),
            audio_url=_url(audio),
            options=options,
            metadata=metadata,
            callback_url=callback_url,
            avatar=avatar,
        )
        click.echo(f"render {created.id} started ({created.audio_seconds or 0:.1f} s of audio)", err=as_json)
        if created.callback_secret is not None:
            click.echo(f"callback secret (shown once; verifies webhook-signature): {created.callback_secret}", err=True)
        if not wait:
            if as_json:
                click.echo(created.model_dump_json())
            return
        with Bar("chunks", show_pos=True) as chunks:
            render = client.wait(
                created.id, on_progress=lambda r: chunks.update(r.progress.chunks_done, r.progress.chunks_total)
            )
        with Bar("download") as download:
            size = client.download(created.id, output, layout=layout, on_progress=download.update)
        captions: list[Path] = []
        if render.links.captions is not None:  # `--captions files|burn`: the files beside the video (out.vtt, out.srt)
            for fmt in PUBLISHED_CAPTIONS:
                captions.append(output.with_suffix(f".{fmt.value}"))
                captions[-1].write_text(client.captions(created.id, fmt), encoding="utf-8")
    click.echo(
        f"wrote {output} ({size / 1e6:.1f} MB, {render.progress.frames_total} frames,"
        f" first frame after {render.ttff_ms or 0:.0f} ms)" + "".join(f", {path}" for path in captions),
        err=as_json,
    )
    if as_json:
        click.echo(render.model_dump_json())


def _file(given: Input | None) -> Path | None:
    return given if isinstance(given, Path) else None


def _url(given: Input | None) -> str | None:
    return given if isinstance(given, str) else None


class Bar:
    """A click progress bar on stderr, begun once the total is known; off a TTY click shows only its label."""

    def __init__(self, label: str, *, show_pos: bool = False) -> None:
        self.label, self.show_pos = label, show_pos
        self._bar: Any = None
        self._done = 0

    def update(self, done: int, total: int | None) -> None:
        if self._bar is None and total:
            self._bar = click.progressbar(length=total, label=self.label, show_pos=self.show_pos, file=sys.stderr)
            self._bar.__enter__()
        if self._bar is not None:
            self._bar.update(done - self._done)
            self._done = done

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
