"""`monologue avatars create|list|show|delete`: portraits checked once (`POST /v1/avatars`), named in
`monologue render --avatar ID` and `monologue live --avatar ID` instead of a portrait. Over the HTTP API, with the
key the CLI uses, like `monologue renders`."""

from __future__ import annotations

import json

import click

from cli.renders import Input, api_option, connected, input_argument, json_option


@click.group()
def avatars() -> None:
    """Avatars: a portrait checked once, reused by renders and live sessions (--avatar ID)."""


@avatars.command("create")
@click.argument("portrait", callback=input_argument)
@api_option
@json_option
def create_command(portrait: Input, api_url: str | None, as_json: bool) -> None:
    """Check PORTRAIT (a file, or a URL for the API to fetch) once and keep it; prints the avatar's id."""
    with connected(api_url) as client:
        if isinstance(portrait, str):
            avatar = client.create_avatar(portrait_url=portrait)
        else:
            avatar = client.create_avatar(portrait)
    click.echo(avatar.model_dump_json() if as_json else avatar.id)


@avatars.command("list")
@api_option
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True)
@json_option
def list_command(api_url: str | None, limit: int, offset: int, as_json: bool) -> None:
    """The key's avatars, newest first: id, size, created."""
    with connected(api_url) as client:
        items = client.avatars(limit=limit, offset=offset)
    if as_json:
        click.echo(json.dumps([avatar.model_dump(mode="json") for avatar in items]))
        return
    for avatar in items:
        click.echo(f"{avatar.id}  {avatar.width}x{avatar.height}  {avatar.created_at.isoformat()}")


@avatars.command("show")
@click.argument("avatar_id")
@api_option
def show_command(avatar_id: str, api_url: str | None) -> None:
    """One avatar, as the API shows it (JSON)."""
    with connected(api_url) as client:
        click.echo(client.avatar(avatar_id).model_dump_json(indent=2))


@avatars.command("delete")
@click.argument("avatar_id")
@api_option
def delete_command(avatar_id: str, api_url: str | None) -> None:
    """Remove the avatar (refused while a session made from it has not ended)."""
    with connected(api_url) as client:
        client.delete_avatar(avatar_id)
    click.echo(f"avatar {avatar_id} deleted")
