"""Dependencies shared by routes: the process's services, held on `app.state`, and a DB session per request."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from monologue.settings import Settings
from monologue.storage import ObjectStore


@dataclass
class Services:
    settings: Settings
    store: ObjectStore
    sessions: sessionmaker[Any]
    temporal: Client


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_db(services: ServicesDep) -> Iterator[Session]:
    with services.sessions() as db:
        yield db


DbDep = Annotated[Session, Depends(get_db)]


def ops_access() -> None:
    """Who may use the operator's UI (`/ops`). Open for now: API keys and tenant scoping replace this body."""
    return None


OpsAccess = Annotated[None, Depends(ops_access)]
