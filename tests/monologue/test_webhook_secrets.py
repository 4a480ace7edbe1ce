"""Webhook secrets at rest (`monologue.webhooks.encryption`, `repo_webhooks.rotate_secrets`), on SQLite and on a real
PostgreSQL: rotating to a new key re-encrypts every secret while tokens under the old key still open as long as it
is listed; secrets stored in clear before encryption keep working until the rotation encrypts them; the key file
is made once, private; a malformed key is refused without being shown; the API and the nodes share one key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet, MultiFernet
from pydantic import SecretStr
from sqlalchemy import select, text, update
from sqlalchemy.orm import sessionmaker

from cli.main import main
from monologue import webhooks
from monologue.db import WebhookEndpointRow, downgrade, make_engine, make_sessionmaker, migrate
from monologue.repo import webhooks as repo_webhooks
from monologue.repo.webhooks import Rotation
from monologue.schemas import WebhookEvent
from monologue.settings import Settings, WebhookSettings, get_settings, to_env
from monologue.webhooks import encryption as webhook_secrets
from tests.helpers import postgres_database
from tests.kustomize import render

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/db.sqlite"
        return
    with postgres_database() as url:
        yield url


@pytest.fixture
def db(empty_database_url: str) -> Iterator[sessionmaker[Any]]:
    migrate(empty_database_url)
    engine = make_engine(empty_database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _keys(*keys: bytes) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def _create(db: sessionmaker[Any], keys: MultiFernet, tenant: str = "t1") -> tuple[str, str]:
    """A new endpoint: (its id, its secret as shown to the tenant)."""
    with db() as session:
        row, secret = repo_webhooks.create_endpoint_within_limit(
            session, tenant=tenant, url="https://hooks.example/a", events=[WebhookEvent.COMPLETED], limit=10, keys=keys
        )
        return row.id, secret


def _stored(db: sessionmaker[Any], endpoint_id: str) -> str | None:
    with db() as session:
        found: str | None = session.scalar(
            select(WebhookEndpointRow.secret).where(WebhookEndpointRow.id == endpoint_id)
        )
        return found


def test_rotation_reencrypts_under_the_new_key_and_old_tokens_open_while_the_old_key_is_listed(
    db: sessionmaker[Any],
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    endpoint_id, secret = _create(db, _keys(old))
    before = _stored(db, endpoint_id)
    assert before is not None and before.startswith("gAAAAA") and secret not in before
    both = _keys(new, old)  # the new key first: it encrypts; the old one still decrypts
    assert webhook_secrets.unseal(both, before) == secret
    with db() as session:
        assert repo_webhooks.rotate_secrets(session, keys=both) == Rotation(rotated=1, encrypted=0, cleared=0)
    after = _stored(db, endpoint_id)
    assert after is not None and after != before
    assert webhook_secrets.unseal(_keys(new), after) == secret  # the old key may now go
    assert webhook_secrets.unseal(both, before) == secret  # an old token opens while its key is listed
    with pytest.raises(webhook_secrets.SecretUnreadable, match=webhook_secrets.KEYS_SETTING):
        webhook_secrets.unseal(_keys(new), before)  # and no longer once it is dropped
    with db() as session, pytest.raises(webhook_secrets.SecretUnreadable, match=endpoint_id):
        repo_webhooks.rotate_secrets(session, keys=_keys(Fernet.generate_key()))  # the keys of another deployment
    assert _stored(db, endpoint_id) == after  # all or nothing


def test_secrets_stored_in_clear_still_sign_until_the_rotation_encrypts_them(db: sessionmaker[Any]) -> None:
    """Rows from before encryption hold `whsec_…` itself: read as it is; the rotation encrypts the active ones and
    drops those of endpoints deleted back then."""
    keys = _keys(Fernet.generate_key())
    active, secret = _create(db, keys)
    deleted, _ = _create(db, keys)
    legacy = webhooks.new_secret()
    with db() as session:  # as migration 0005 found them
        session.execute(update(WebhookEndpointRow).where(WebhookEndpointRow.id == active).values(secret=secret))
        session.execute(update(WebhookEndpointRow).where(WebhookEndpointRow.id == deleted).values(secret=legacy))
        session.execute(text("UPDATE webhook_endpoints SET disabled_at = created_at WHERE id = :id"), {"id": deleted})
        session.commit()
    assert webhook_secrets.unseal(keys, secret) == secret
    with db() as session:
        assert repo_webhooks.rotate_secrets(session, keys=keys) == Rotation(rotated=0, encrypted=1, cleared=1)
    stored = _stored(db, active)
    assert stored is not None and stored.startswith("gAAAAA") and webhook_secrets.unseal(keys, stored) == secret
    assert _stored(db, deleted) is None


def test_deleting_an_endpoint_drops_its_secret_and_keeps_its_row(db: sessionmaker[Any]) -> None:
    endpoint_id, _ = _create(db, _keys(Fernet.generate_key()))
    with db() as session:
        assert repo_webhooks.disable_endpoint(session, tenant="t1", endpoint_id=endpoint_id)
        row = repo_webhooks.get_endpoint(session, endpoint_id=endpoint_id)
        assert row is not None and row.disabled_at is not None and row.secret is None


def test_migration_0005_holds_tokens_and_goes_back_only_while_none_is_encrypted(empty_database_url: str) -> None:
    """A token is longer than 0004's column (PostgreSQL refused it); rows from before keep their secret; going
    back would leave 0004's code a token it cannot sign with, so it is refused while one is stored."""
    url = empty_database_url
    migrate(url, "0004")
    engine = make_engine(url)
    legacy = webhooks.new_secret()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO webhook_endpoints (id, tenant, url, secret, events, created_at)"
                " VALUES ('ep_old', 't1', 'https://hooks.example/old', :secret, '[]', CURRENT_TIMESTAMP)"
            ),
            {"secret": legacy},
        )
    migrate(url)  # through 0005 to the head, whose code writes the endpoints below (a failed downgrade keeps it)
    db = make_sessionmaker(engine)
    keys = _keys(Fernet.generate_key())
    encrypted, _ = _create(db, keys)
    deleted, _ = _create(db, keys)
    with db() as session:
        assert repo_webhooks.disable_endpoint(session, tenant="t1", endpoint_id=deleted)
    assert _stored(db, "ep_old") == legacy and len(_stored(db, encrypted) or "") > 128
    with pytest.raises(RuntimeError, match="1 webhook secrets are encrypted"):
        downgrade(url, "0004")
    with db() as session:
        assert repo_webhooks.disable_endpoint(session, tenant="t1", endpoint_id=encrypted)
    downgrade(url, "0004")
    with engine.connect() as connection:
        stored = {row.id: row.secret for row in connection.execute(text("SELECT id, secret FROM webhook_endpoints"))}
    engine.dispose()
    assert stored == {"ep_old": legacy, encrypted: "", deleted: ""}


def test_the_rotate_key_command_reencrypts_with_the_keys_of_its_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    db = make_sessionmaker(engine)
    old, new = Fernet.generate_key(), Fernet.generate_key()
    endpoint_id, secret = _create(db, _keys(old))
    env = {
        "MONOLOGUE_HOME": str(tmp_path),
        "MONOLOGUE_DATABASE_URL": url,
        "MONOLOGUE_WEBHOOKS__SECRET_KEYS": json.dumps([new.decode(), old.decode()]),
    }
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(main, ["webhooks", "rotate-key"], env=env)
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "1 re-encrypted" in result.output and new.decode() not in result.output
    stored = _stored(db, endpoint_id)
    engine.dispose()
    assert stored is not None and webhook_secrets.unseal(_keys(new), stored) == secret


def test_without_keys_set_every_process_of_a_home_shares_one_private_key_file(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    token = webhook_secrets.seal(webhook_secrets.keyring(settings), "whsec_x")
    key_file = tmp_path / "webhook-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    webhook_secrets._key_file.cache_clear()  # as another process would: read from the file
    assert webhook_secrets.unseal(webhook_secrets.keyring(Settings(home=tmp_path)), token) == "whsec_x"
    given = Settings(home=tmp_path / "other", webhooks=WebhookSettings(secret_keys=[SecretStr(key_file.read_text())]))
    assert webhook_secrets.unseal(webhook_secrets.keyring(given), token) == "whsec_x"
    assert not (tmp_path / "other" / "webhook-key").exists()  # a key set: no file made


def test_a_malformed_key_is_refused_naming_the_setting_and_not_the_key(tmp_path: Path) -> None:
    bad = "not-a-fernet-key-but-secret"
    good = Fernet.generate_key().decode()
    settings = Settings(home=tmp_path, webhooks=WebhookSettings(secret_keys=[SecretStr(good), SecretStr(bad)]))
    with pytest.raises(ValueError, match=r"MONOLOGUE_WEBHOOKS__SECRET_KEYS: key 2 of 2 is not a Fernet key") as err:
        webhook_secrets.keyring(settings)
    assert bad not in str(err.value) and good not in str(err.value)


def test_the_keys_reach_the_embedded_stacks_processes(tmp_path: Path) -> None:
    """The stack hands its settings to the API and node processes as environment variables, keys in clear."""
    keys = [Fernet.generate_key().decode(), Fernet.generate_key().decode()]
    settings = Settings(home=tmp_path, webhooks=WebhookSettings(secret_keys=[SecretStr(key) for key in keys]))
    assert json.loads(to_env(settings)["MONOLOGUE_WEBHOOKS__SECRET_KEYS"]) == keys


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_api_and_the_nodes_read_the_webhook_keys_from_one_secret(overlay: str) -> None:
    """The API encrypts and the nodes decrypt: in Kubernetes both take MONOLOGUE_WEBHOOKS__SECRET_KEYS from the
    monologue-secrets Secret, whose documented contents name it."""
    resources = {(r["kind"], r["metadata"]["name"]): r for r in render(K8S / "overlays" / overlay)}
    for name in ("monologue-api", "monologue-node"):
        [container] = resources[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
        assert {"secretRef": {"name": "monologue-secrets"}} in container["envFrom"], name
    assert "MONOLOGUE_WEBHOOKS__SECRET_KEYS" in (K8S / "base" / "config.yaml").read_text()
