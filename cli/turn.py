"""A real TURN server (Debian's `coturn`, its `turnserver`) on loopback, for the WebRTC tests and `monologue bench
live --webrtc --turn`: TURN REST API credentials (`use-auth-secret`, the scheme monologue/ice.py mints), UDP, loopback
peers allowed (everything here is on 127.0.0.1), its log in a throwaway folder. A deployment runs coturn beside the
nodes with the same two settings (docs/architecture.md, "WebRTC out": past one machine)."""

from __future__ import annotations

import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from cli.stack import free_port, stop_process
from monologue.settings import IceSettings
from monologue.settings_services import IceTransportPolicy

_ALLOCATED = re.compile(r"ALLOCATE processed, success")


@dataclass(frozen=True)
class Turn:
    url: str  # turn:127.0.0.1:<port>?transport=udp
    secret: str
    log: Path

    def ice(self, policy: IceTransportPolicy = IceTransportPolicy.ALL) -> IceSettings:
        """The settings that point the API and the nodes at this server."""
        return IceSettings(turn_urls=[self.url], turn_secret=SecretStr(self.secret), transport_policy=policy)

    def allocations(self) -> int:
        """Relayed addresses handed out so far (allocations its credentials opened)."""
        return len(_ALLOCATED.findall(self.log.read_text(errors="replace")))


def binary() -> str:
    found = shutil.which("turnserver")
    if found is None:
        raise RuntimeError(
            "the `turnserver` binary is missing: install Debian's coturn (infra/test.sh does:"
            " apt-get install --no-install-recommends coturn)"
        )
    return found


@contextmanager
def turn_server() -> Iterator[Turn]:
    """Run coturn on a free loopback port until the block ends."""
    with tempfile.TemporaryDirectory(prefix="monologue-turn-") as folder:
        root, port, secret = Path(folder), free_port(), secrets.token_hex(16)
        log = root / "turn.log"
        command = [
            binary(),
            "-n",  # no configuration file (Debian's /etc/turnserver.conf logs to syslog)
            *("--listening-ip", "127.0.0.1", "--relay-ip", "127.0.0.1", "--listening-port", str(port)),
            *("--use-auth-secret", "--static-auth-secret", secret, "--realm", "monologue"),
            *("--allow-loopback-peers", "--no-tls", "--no-dtls", "--no-cli", "--no-stdout-log", "--verbose"),
            *("--log-file", str(log), "--simple-log", "--pidfile", str(root / "turn.pid")),
            *("--userdb", str(root / "turndb"), "--no-software-attribute"),
        ]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            _wait_ready(port, process, log)
            yield Turn(f"turn:127.0.0.1:{port}?transport=udp", secret, log)
        finally:
            stop_process(process)


def _wait_ready(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    """Until a STUN binding request over UDP gets an answer."""
    from aioice import stun

    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(0.2)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"turnserver exited with {process.returncode}: {tail}")
            udp.sendto(bytes(request), ("127.0.0.1", port))
            try:
                if stun.parse_message(udp.recv(2048)).transaction_id == request.transaction_id:
                    return
            except (TimeoutError, ValueError):
                continue
    raise RuntimeError(f"turnserver did not answer STUN on 127.0.0.1:{port} within {timeout_s:.0f} s")
