"""The embedded default's local state is its owner's alone: `<home>`, the objects and the logs are 0700
folders, the SQLite database, the key file, stored objects and logs 0600; and the local API key is never
written into a log."""

from __future__ import annotations

import stat
from pathlib import Path

from cli.stack import Stack, _announce_key
from monologue import apikeys
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.storage import LocalStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_sqlite_database_and_its_folder_are_private(tmp_path: Path) -> None:
    database = tmp_path / "new-home" / "monologue.db"
    migrate(f"sqlite:///{database}")
    assert (_mode(database.parent), _mode(database)) == (0o700, 0o600)
    engine = make_engine(f"sqlite:///{database}")
    with make_sessionmaker(engine)() as db:
        _key, created = apikeys.ensure_local_key(db, database.parent)
    engine.dispose()
    assert created and _mode(apikeys.local_key_path(database.parent)) == 0o600
    wal = [path for path in database.parent.glob("monologue.db-*")]
    assert all(_mode(path) == 0o600 for path in wal), {path.name: oct(_mode(path)) for path in wal}


def test_a_database_file_made_readable_by_others_is_made_private_again(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    database = tmp_path / "monologue.db"
    database.touch(mode=0o644)
    database.chmod(0o644)
    make_engine(f"sqlite:///{database}").dispose()
    assert _mode(database) == 0o600
    assert _mode(tmp_path) == 0o755  # a folder we did not create keeps its mode (it may be shared, like /tmp)


def test_the_objects_root_is_private_and_objects_are_0600(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    store = LocalStore(root)
    store.put("sessions/abc/input/portrait.png", b"png")
    assert _mode(root) == 0o700
    assert _mode(store.path("sessions/abc/input/portrait.png")) == 0o600


def test_the_local_key_goes_to_a_terminal_only(tmp_path: Path) -> None:
    key, path = "mk_0123abcd_" + "s" * 32, tmp_path / "api-key"
    assert key in _announce_key(key, path, terminal=True)
    logged = _announce_key(key, path, terminal=False)
    assert key not in logged and str(path) in logged


def test_the_running_stacks_state_is_private_and_its_logs_hold_no_key(stack: Stack) -> None:
    home = stack.settings.home
    root = stack.settings.storage.root
    assert root is not None
    folders = {"home": home, "objects": root, "logs": stack.log_dir}
    assert {name: oct(_mode(path)) for name, path in folders.items()} == dict.fromkeys(folders, oct(0o700))
    files = [home / "monologue.db", home / "temporal.db", apikeys.local_key_path(home), *stack.log_dir.iterdir()]
    files += [path for path in root.rglob("*") if path.is_file()]
    assert len(files) > 4  # the databases, the key file and at least one log and one object
    assert {str(path): oct(_mode(path)) for path in files if _mode(path) & 0o077} == {}
    assert stack.api_key
    logs = {path.name: path.read_text(errors="replace") for path in stack.log_dir.iterdir()}
    # Read what the API and the node wrote (an empty or missing log would hold no key either).
    assert all(logs.get(name) for name in ("api.log", f"node-{stack.settings.node.id}.log")), sorted(logs)
    assert [name for name, text in logs.items() if stack.api_key in text] == []
