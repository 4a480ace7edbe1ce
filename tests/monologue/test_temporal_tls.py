"""The Temporal connection settings, end to end: the API, the CLI and a plain client reach a real Temporal dev
server through mutual TLS (a proxy with a throwaway CA in front: `start-dev` has no TLS of its own), from
MONOLOGUE_TEMPORAL__TLS__* or from a temporalio.envconfig profile; a wrong CA or a missing client certificate
is refused; and the connect arguments follow the documented precedence."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.service import TLSConfig

from api.app import create_app
from cli.stack import free_port, temporal_binary
from monologue import contracts as c, temporal_client
from monologue.contracts.retention import RETENTION_SCHEDULE
from monologue.settings import Settings, TemporalSettings, TemporalTlsSettings, to_env
from monologue.temporal_client import TemporalConfigError, connect, connect_args
from tests.tls_proxy import SERVER_NAME, Pki, make_pki, tls_proxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A plaintext dev server with none of Monologue's search attributes (so `setup` has work to do)."""
    port = free_port()
    log = (tmp_path_factory.mktemp("temporal") / "temporal.log").open("wb")
    command = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless"]
    process = subprocess.Popen([*command, "--log-level", "error"], stdout=log, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        asyncio.run(_wait_for(TemporalSettings(address=address)))
        yield address
    finally:
        process.terminate()
        process.wait(20)
        log.close()


async def _wait_for(settings: TemporalSettings, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await connect(settings)
            return
        except ConnectionError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_address(dev_server: str, pki: Pki) -> Iterator[str]:
    with tls_proxy(pki, dev_server, free_port()) as address:
        yield address


def _mtls(address: str, pki: Pki, **overrides: object) -> TemporalSettings:
    tls = TemporalTlsSettings(server_ca_cert=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key)
    return TemporalSettings(address=address, tls=tls.model_copy(update={"server_name": SERVER_NAME, **overrides}))


async def _server_version(settings: TemporalSettings) -> str:
    client = await connect(settings)
    return (await client.workflow_service.get_system_info(GetSystemInfoRequest())).server_version


async def test_a_client_connects_through_mutual_tls(tls_address: str, pki: Pki) -> None:
    assert await _server_version(_mtls(tls_address, pki))


async def test_without_a_client_certificate_the_server_refuses(tls_address: str, pki: Pki) -> None:
    settings = TemporalSettings(
        address=tls_address, tls=TemporalTlsSettings(server_ca_cert=pki.ca, server_name=SERVER_NAME)
    )
    with pytest.raises(ConnectionError, match=tls_address):
        await _server_version(settings)


async def test_a_server_certificate_from_another_ca_is_refused(tls_address: str, pki: Pki, tmp_path: Path) -> None:
    other = make_pki(tmp_path, prefix="other-")
    with pytest.raises(ConnectionError):
        await _server_version(_mtls(tls_address, pki, server_ca_cert=other.ca))


async def test_plaintext_to_the_tls_port_fails(tls_address: str) -> None:
    with pytest.raises(ConnectionError):
        await _server_version(TemporalSettings(address=tls_address))


async def test_an_envconfig_profile_supplies_address_and_tls(tls_address: str, pki: Pki, tmp_path: Path) -> None:
    """Temporal's own TOML profile (as `temporal` CLI users already have one), no MONOLOGUE_TEMPORAL__TLS__*."""
    config = tmp_path / "temporal.toml"
    config.write_text(
        f'[profile.cluster]\naddress = "{tls_address}"\nnamespace = "default"\n'
        f'[profile.cluster.tls]\nserver_name = "{SERVER_NAME}"\nserver_ca_cert_path = "{pki.ca}"\n'
        f'client_cert_path = "{pki.client_cert}"\nclient_key_path = "{pki.client_key}"\n'
    )
    assert await _server_version(TemporalSettings(profile="cluster", config_file=config))


def test_the_api_is_ready_through_mutual_tls(tls_address: str, pki: Pki, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, temporal=_mtls(tls_address, pki))
    from monologue.db import migrate

    migrate(settings.db_url)
    with TestClient(create_app(settings), base_url=str(settings.api.public_url)) as api:
        response = api.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json()["checks"] == {"database": True, "schema": True, "temporal": True}


def test_the_cli_registers_and_checks_search_attributes_through_mutual_tls(
    tls_address: str, pki: Pki, tmp_path: Path
) -> None:
    env = {**os.environ, **to_env(Settings(home=tmp_path, temporal=_mtls(tls_address, pki)))}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli", "temporal", *args], env=env, capture_output=True, text=True, timeout=60
        )

    before = cli("check")
    assert before.returncode == 1 and "MISSING" in before.stdout, before.stdout + before.stderr
    setup = cli("setup")
    assert setup.returncode == 0, setup.stderr
    assert all(name in setup.stdout for name in c.SEARCH_ATTRIBUTES)
    assert f"{RETENTION_SCHEDULE}: created" in setup.stdout  # the retention schedule, from MONOLOGUE_RETENTION__*
    after = cli("check")
    assert after.returncode == 0, after.stdout + after.stderr
    assert after.stdout.count("registered") == len(c.SEARCH_ATTRIBUTES)
    again = cli("setup").stdout
    assert "all registered already" in again and f"{RETENTION_SCHEDULE}: updated" in again


def test_connect_args_precedence(pki: Pki, tmp_path: Path) -> None:
    """Profile first, then every MONOLOGUE_TEMPORAL__* value that is set; an API key turns TLS on."""
    config = tmp_path / "temporal.toml"
    config.write_text('[profile.p]\naddress = "from-profile:7233"\nnamespace = "prof-ns"\n')
    from_profile = connect_args(TemporalSettings(profile="p", config_file=config))
    assert (from_profile["target_host"], from_profile["namespace"]) == ("from-profile:7233", "prof-ns")
    overridden = connect_args(TemporalSettings(profile="p", config_file=config, address="ours:7233"))
    assert (overridden["target_host"], overridden["namespace"]) == ("ours:7233", "prof-ns")
    cloud = connect_args(TemporalSettings(address="x.tmprl.cloud:7233", api_key="secret"))  # type: ignore[arg-type]
    assert cloud["api_key"] == "secret" and cloud["tls"] is True
    assert "tls" not in connect_args(TemporalSettings())
    off = TemporalSettings(api_key="k", tls=TemporalTlsSettings(enabled=False))  # type: ignore[arg-type]
    assert connect_args(off)["tls"] is False
    mtls = connect_args(_mtls("h:1", pki))["tls"]
    assert isinstance(mtls, TLSConfig) and mtls.client_cert == pki.client_cert.read_bytes()
    assert mtls.domain == SERVER_NAME


def test_bad_tls_settings_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="client_cert and client_key go together"):
        TemporalTlsSettings(client_cert=tmp_path / "c.pem")
    missing = TemporalSettings(tls=TemporalTlsSettings(server_ca_cert=tmp_path / "nope.pem"))
    with pytest.raises(TemporalConfigError, match="MONOLOGUE_TEMPORAL__TLS__SERVER_CA_CERT"):
        connect_args(missing)
    with pytest.raises(TemporalConfigError, match="not a file"):
        connect_args(TemporalSettings(profile="p", config_file=tmp_path / "none.toml"))


def test_the_api_key_reaches_child_processes_in_clear() -> None:
    """to_env (the embedded stack's children) must not pass pydantic's masked '**********'."""
    env = to_env(Settings(temporal=TemporalSettings(api_key="s3cret")))  # type: ignore[arg-type]
    assert env["MONOLOGUE_TEMPORAL__API_KEY"] == "s3cret"
    assert temporal_client.connect_args(TemporalSettings()).get("api_key") is None
