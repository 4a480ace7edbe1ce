"""Local state only its owner can read: the embedded default keeps API key files, every tenant's inputs and
videos and the database under `<home>`, so its folders are 0700 and its files 0600, whatever the umask."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

PRIVATE_UMASK = 0o077  # for the embedded stack's child processes: what they create is their owner's alone


def private_dir(path: Path, *, tighten: bool = False) -> Path:
    """`path` as a folder only its owner can enter (0700): created so, or, with `tighten`, made so if it exists.

    Only folders that are ours alone are tightened (`<home>`, the objects root), never, say, a folder a
    SQLite file was put in."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if tighten:
        path.chmod(0o700)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if it is missing, and make it 0600 if it exists."""
    private_dir(path.parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)
    return path


def key_file(home: Path, name: str, make: Callable[[], bytes]) -> bytes:
    """The key in `<home>/<name>` (0600 in a 0700 folder), made by `make` at first use. Written whole under a
    temporary name, then linked into place: of two processes starting at once, one link wins and both read its
    key (a plain create could be read empty by the second)."""
    path = private_dir(home) / name
    if not path.exists():
        draft = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(make())
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_bytes().strip()
