"""Webhook endpoints' signing secrets at rest: encrypted under keys held outside the database, so that a copy of
the database (a backup, a replica, a dump) signs nothing.

A stored secret is a Fernet token (cryptography's MultiFernet: AES-128-CBC and HMAC-SHA256) under
MONOLOGUE_WEBHOOKS__SECRET_KEYS, else under `<home>/webhook-key` (made at first use, 0600; the API and every
node must read the same keys, so several machines set the setting). The first key encrypts, every listed key
decrypts: to rotate, list a new key first and the old one after it on every process, run `monologue webhooks
rotate-key` (each stored secret re-encrypted under the new key), then drop the old key.

Rows from before encryption (migration 0005) hold the secret itself, `whsec_…`: the prefix tells the two forms
apart (a Fernet token starts `gAAAAA`). Such a row is still read as it is, and the rotation encrypts it. This
module never logs a key or a secret, and no error it raises shows one."""

from __future__ import annotations

import functools
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from monologue.errors import MonologueError
from monologue.localfs import key_file
from monologue.settings import Settings
from monologue.webhooks import SECRET_PREFIX

KEYS_SETTING = "MONOLOGUE_WEBHOOKS__SECRET_KEYS"
KEY_FILE = "webhook-key"
_MAKE_KEY = "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"


class SecretUnreadable(MonologueError):
    """A stored secret that none of the keys decrypts: the keys differ between processes, or one was dropped
    before the rotation that needed it had run."""


def keyring(settings: Settings) -> MultiFernet:
    """The keys secrets are encrypted with: the setting's, else the key file's. ValueError naming the setting
    (never the key) for one that is not a Fernet key."""
    given = tuple(key.get_secret_value() for key in settings.webhooks.secret_keys)
    if given:
        return _keyring(given, KEYS_SETTING)
    return _keyring((_key_file(settings.home),), str(settings.home / KEY_FILE))


def seal(keys: MultiFernet, secret: str) -> str:
    """`secret` as it is stored: encrypted under the first key."""
    return keys.encrypt(secret.encode()).decode()


def unseal(keys: MultiFernet, stored: str) -> str:
    """The secret a row holds: decrypted, or as it is in a row from before encryption."""
    if stored.startswith(SECRET_PREFIX):
        return stored
    try:
        return keys.decrypt(stored.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable(_unreadable()) from None


def reseal(keys: MultiFernet, stored: str) -> str:
    """`stored` encrypted under the first key: a token re-encrypted, a secret from before encryption encrypted."""
    if stored.startswith(SECRET_PREFIX):
        return seal(keys, stored)
    try:
        return keys.rotate(stored.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable(_unreadable()) from None


def _unreadable() -> str:
    return (
        f"a webhook secret was encrypted with a key that is not among this process's ({KEYS_SETTING}): the API and"
        f" every node must list the same keys (unset, each machine makes its own <home>/{KEY_FILE}), and a key may"
        " be dropped only after `monologue webhooks rotate-key` has run with the new key first"
    )


@functools.cache
def _keyring(keys: tuple[str, ...], source: str) -> MultiFernet:
    fernets = []
    for position, key in enumerate(keys, 1):
        try:
            fernets.append(Fernet(key))
        except ValueError:  # the key itself stays out of the message
            raise ValueError(
                f"{source}: key {position} of {len(keys)} is not a Fernet key (32 url-safe base64-encoded bytes;"
                f" make one with {_MAKE_KEY})"
            ) from None
    return MultiFernet(fernets)


@functools.cache
def _key_file(home: Path) -> str:
    """The key in `<home>/webhook-key`, made at first use (as `<home>/link-secret` is, api/links.py)."""
    return key_file(home, KEY_FILE, Fernet.generate_key).decode()
