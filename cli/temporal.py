"""`monologue temporal check|setup`: reach the Temporal cluster exactly as the API and the nodes do (TLS, mTLS,
API key, an envconfig profile: `monologue/temporal_client.py`), and register Monologue's search attributes
there with its Temporal Schedules (`cli/schedules.py`: retention); the deployment's setup Job runs `setup` after
the migrations."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import click

from cli.schedules import ensure_schedules
from monologue import contracts as c
from monologue.exit import exit_when_done
from monologue.settings import get_settings


def _indexed_type(kind: str) -> str:
    """contracts.SEARCH_ATTRIBUTES spells types as Temporal's CLI does (KeywordList); the API's enum names are
    INDEXED_VALUE_TYPE_KEYWORD_LIST."""
    return "INDEXED_VALUE_TYPE_" + re.sub(r"(?<!^)(?=[A-Z])", "_", kind).upper()


@click.group()
def temporal() -> None:
    """The Temporal cluster Monologue uses (MONOLOGUE_TEMPORAL__*: address, namespace, TLS, API key, profile)."""


@temporal.command("check")
def check_command() -> None:
    """Connect as the services do; print the server's version and the search attributes. Exit 1 when one of
    Monologue's is missing (and MONOLOGUE_TEMPORAL__SEARCH_ATTRIBUTES is on)."""
    exit_when_done(lambda: _report(asyncio.run(_check())))


def _report(report: dict[str, Any]) -> None:
    click.echo(f"temporal: {report['address']} namespace {report['namespace']}, server {report['server']}")
    for name, present in report["attributes"].items():
        click.echo(f"  search attribute {name}: {'registered' if present else 'MISSING'}")
    if get_settings().temporal.search_attributes and not all(report["attributes"].values()):
        raise SystemExit("search attributes missing: run `monologue temporal setup` (Temporal Cloud: tcld or its UI)")


@temporal.command("setup")
def setup_command() -> None:
    """Register Monologue's search attributes on the namespace and create or update its schedules (retention, from
    MONOLOGUE_RETENTION__*): idempotent, and the way to apply changed retention settings."""
    exit_when_done(lambda: _report_added(*asyncio.run(_setup())))


def _report_added(added: list[str], schedules: list[str]) -> None:
    click.echo(f"search attributes: {', '.join(added) or 'all registered already'}")
    click.echo(f"schedules: {', '.join(schedules)}")


async def _check() -> dict[str, Any]:
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    from monologue.temporal_client import connect

    settings = get_settings().temporal
    client = await connect(settings)
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = set(listed.custom_attributes)
    return {
        "address": settings.address,
        "namespace": client.namespace,
        "server": info.server_version or "(unknown)",
        "attributes": {name: name in known for name in c.SEARCH_ATTRIBUTES},
    }


async def _setup() -> tuple[list[str], list[str]]:
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest

    from monologue.temporal_client import connect

    settings = get_settings()
    client = await connect(settings.temporal)
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    missing = {name: kind for name, kind in c.SEARCH_ATTRIBUTES.items() if name not in listed.custom_attributes}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={name: IndexedValueType.Value(_indexed_type(kind)) for name, kind in missing.items()},
            )
        )
    return sorted(missing), await ensure_schedules(client, settings)
