"""A PostgreSQL server of one's own on loopback, which a fault test may stop, crash and start again (issue 28):
Debian's `postgresql` binaries (`initdb`, `postgres`), a fresh cluster in a scratch folder, trust auth on
127.0.0.1 only. The shared test server (127.0.0.1:5432) is never touched. PostgreSQL refuses to run as root: as root
the server runs as the `postgres` user (`runuser`), which owns the folder."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from cli.stack import free_port

START_TIMEOUT_S = 60.0
SERVICE_USER = "postgres"  # Debian's package creates it


def _bin(name: str) -> str:
    """Debian's PostgreSQL binary `name` (the newest installed version), else one on PATH."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    for folder in reversed(versions):
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)")
    return found


def _as_service_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVICE_USER, "--", *command] if os.geteuid() == 0 else command


@dataclass
class PgServer:
    """One running (or stopped) server: `url` reaches its `postgres` database as user `postgres`."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default=Path())

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start the server on its folder and wait until it takes connections."""
        command = [_bin("postgres"), "-D", str(self.folder / "data"), "-p", str(self.port)]
        command += ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.folder}"]
        command += ["-c", "fsync=off", "-c", "max_connections=200"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                _as_service_user(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}: {self._tail()}")
            if self.answers():
                return
            time.sleep(0.2)
        raise RuntimeError(f"postgres did not take connections within {START_TIMEOUT_S:.0f} s: {self._tail()}")

    def stop(self, *, crash: bool = False) -> None:
        """Stop the server: a fast shutdown (SIGINT: connections are cut, the data is consistent), or `crash`:
        SIGKILL the postmaster and every backend, as a machine failure would (the next start recovers from WAL)."""
        process, self.process = self.process, None
        if process is None:
            return
        pid = self._postmaster_pid()
        if pid is not None:
            if crash:
                subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if crash else signal.SIGINT)
        try:
            process.wait(timeout=30)  # runuser (or postgres itself) returns once the postmaster has exited
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        deadline = time.monotonic() + 30
        while self.answers() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.folder / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url.replace("+psycopg", ""), connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def _tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"


@contextmanager
def private_postgres() -> Iterator[PgServer]:
    """A fresh cluster in a folder of its own under the system's temp folder (a test's tmp_path is private to root,
    where the `postgres` user could not reach it), started; stopped and removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="monologue-pg-"))
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVICE_USER)
            os.chown(folder, user.pw_uid, user.pw_gid)
        server = PgServer(folder, free_port(), log_path=folder / "postgres.log")
        initdb = [_bin("initdb"), "-D", str(folder / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        subprocess.run(_as_service_user(initdb), check=True, capture_output=True)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
