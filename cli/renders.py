"""`monologue renders list|show|cancel|resume|watch`: sessions (renders and live ones) over the HTTP API, with
the key the CLI uses (MONOLOGUE_API_KEY, else the embedded stack's), so it works against any deployment."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import click

from monologue.client import Client, ClientError
from monologue.contracts import SessionStatus
from monologue.schemas import RenderPublic
from monologue.settings import get_settings

api_option = click.option("--api", "api_url", default=None, help="API base URL (default: from settings).")
json_option = click.option("--json", "as_json", is_flag=True, help="JSON, as the API returns it.")


def api_target(api_url: str | None) -> tuple[str, str | None]:
    """The API's base URL (given, else the settings' public URL) and the key to send."""
    from monologue.apikeys import read_local_key

    settings = get_settings()
    return api_url or str(settings.api.public_url), read_local_key(settings.home)


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
