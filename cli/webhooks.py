"""`monologue webhooks create|list|delete|deliveries`: the key's tenant's webhook endpoints, through the API (the
same checks as any client's: the operator's allowed URLs and addresses), with the key the CLI uses.
`monologue webhooks rotate-key` is the operator's: it works on the database directly, with the process's settings."""

from __future__ import annotations

import click

from cli.renders import api_option, connected, json_option
from monologue.schemas import WebhookEvent


@click.group()
def webhooks() -> None:
    """Webhook endpoints of the key's tenant: signed session events (Standard Webhooks)."""


@webhooks.command("create")
@click.argument("url")
@click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice([event.value for event in WebhookEvent]),
    help="Only these events (default: the three endings; session.started only when given). Repeat for more.",
)
@api_option
def create_command(url: str, events: tuple[str, ...], api_url: str | None) -> None:
    """Send the tenant's session events to URL; prints the signing secret once."""
    with connected(api_url) as client:
        created = client.create_webhook(url, events=[WebhookEvent(event) for event in events] or None)
    click.echo(f"endpoint {created.id} → {created.url} ({', '.join(created.events)})")
    click.echo(f"secret (shown once; verifies webhook-signature): {created.secret}")


@webhooks.command("list")
@api_option
@json_option
def list_command(api_url: str | None, as_json: bool) -> None:
    """The tenant's endpoints (never their secrets)."""
    with connected(api_url) as client:
        endpoints = client.list_webhooks()
    if as_json:
        click.echo(endpoints.model_dump_json())
        return
    for endpoint in endpoints.items:
        click.echo(f"{endpoint.id}  {endpoint.url}  {','.join(endpoint.events)}")


@webhooks.command("delete")
@click.argument("endpoint_id")
@api_option
def delete_command(endpoint_id: str, api_url: str | None) -> None:
    """Stop sending to an endpoint."""
    with connected(api_url) as client:
        client.delete_webhook(endpoint_id)
    click.echo(f"deleted {endpoint_id}")


@webhooks.command("deliveries")
@click.option("--session", "session_id", default=None, help="Only this session's.")
@api_option
@json_option
def deliveries_command(session_id: str | None, api_url: str | None, as_json: bool) -> None:
    """Deliveries, newest first, with each attempt's answer."""
    with connected(api_url) as client:
        found = client.webhook_deliveries(session_id=session_id)
    if as_json:
        click.echo(found.model_dump_json())
        return
    for delivery in found.items:
        click.echo(f"{delivery.id}  {delivery.event:<17} {delivery.status:<9} session {delivery.session_id}")
        for attempt in delivery.attempts:
            answer = attempt.status_code if attempt.status_code is not None else attempt.error
            click.echo(f"    attempt {attempt.attempt}  {attempt.started_at:%H:%M:%S}  {answer}")
        if delivery.error:  # why it ended without a 2xx (given up after its retry period, or refused)
            click.echo(f"    {delivery.status}: {delivery.error}")


@webhooks.command("rotate-key")
def rotate_key_command() -> None:
    """Re-encrypt every stored endpoint secret under the first of MONOLOGUE_WEBHOOKS__SECRET_KEYS (list the new
    key first and the old ones after it, here and on every API and node; drop an old key once this has run).
    Also encrypts secrets stored in clear before encryption, and drops those of deleted endpoints."""
    from monologue.db import make_engine, make_sessionmaker, migrate
    from monologue.repo import webhooks as repo_webhooks
    from monologue.settings import get_settings
    from monologue.webhooks import encryption as webhook_secrets

    settings = get_settings()
    keys = webhook_secrets.keyring(settings)
    migrate(settings.db_url)
    engine = make_engine(settings.db_url)
    try:
        with make_sessionmaker(engine)() as db:
            done = repo_webhooks.rotate_secrets(db, keys=keys)
    except webhook_secrets.SecretUnreadable as err:
        raise click.ClickException(str(err)) from None
    finally:
        engine.dispose()
    click.echo(
        f"webhook secrets: {done.rotated} re-encrypted under the first key, {done.encrypted} stored in clear"
        f" encrypted, {done.cleared} of deleted endpoints dropped"
    )
