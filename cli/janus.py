"""A real SFU (Debian's `janus`, 1.1.2 in Debian 12) on loopback, for the SFU tests and `monologue bench live --webrtc
--sfu`: a configuration folder of our own holding only the Streaming plug-in and the HTTP transport (Debian's
/etc/janus loads every plug-in), the HTTP API on a free loopback port behind an API secret, string mountpoint ids,
ICE on loopback only, its log in the throwaway folder. A deployment runs Janus the same way with its HTTP API on a
private network and its media ports public (docs/architecture.md, "WebRTC out": past one machine)."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from cli.stack import free_port, stop_process
from monologue.settings_services import SfuSettings

LIBRARIES = Path("/usr/lib/x86_64-linux-gnu/janus")
PARTS = {"plugins": "libjanus_streaming.so", "transports": "libjanus_http.so"}
VIEWER_TIMEOUT_S = 60  # a viewer's Janus session ends this long after its page stopped saying it is there
RTP_PORTS = "10000-10999"  # where mountpoints take the nodes' RTP (a cluster opens this range to the nodes only)


@dataclass(frozen=True)
class JanusServer:
    url: str  # http://127.0.0.1:<port>/janus
    api_secret: str
    log: Path

    def sfu(self, **changes: Any) -> SfuSettings:
        """The settings that point the API and the nodes at this server (`changes`: other SfuSettings fields)."""
        return SfuSettings(**{"janus_url": self.url, "api_secret": SecretStr(self.api_secret), **changes})


def binary() -> str:
    found = shutil.which("janus")
    if found is None:
        raise RuntimeError(
            "the `janus` binary is missing: install Debian's janus (infra/test.sh does:"
            " apt-get install --no-install-recommends janus)"
        )
    return found


def config_files(
    folder: str,
    *,
    port: int,
    ip: str = "127.0.0.1",
    libraries: str | None = None,
    rtp_ports: str = RTP_PORTS,
    viewer_timeout_s: int = VIEWER_TIMEOUT_S,
) -> dict[str, str]:
    """Janus's configuration for Monologue, by file name: the core's (`folder` holds it; `libraries`, if given, holds
    the `plugins` and `transports` folders), the HTTP transport's (on `ip`:`port`, path /janus) and the Streaming
    plug-in's (string ids; mountpoints' RTP ports from `rtp_ports`). infra/k8s/extras/janus.yaml holds the same.
    `viewer_timeout_s`: Janus's session_timeout (a viewer that stops saying it is there loses its seat)."""
    parts = libraries or folder
    return {
        "janus.jcfg": (
            "general: {\n"
            f'  configs_folder = "{folder}"\n  plugins_folder = "{parts}/plugins"\n'
            f'  transports_folder = "{parts}/transports"\n  events_folder = "{parts}/events"\n'
            f'  loggers_folder = "{parts}/loggers"\n  server_name = "monologue-sfu"\n'
            f"  session_timeout = {viewer_timeout_s}\n  debug_level = 4\n}}\n"
            'media: {\n  rtp_port_range = "20000-40000"\n}\n'
        ),
        "janus.transport.http.jcfg": (
            "general: {\n"
            f'  json = "compact"\n  base_path = "/janus"\n  http = true\n  port = {port}\n  ip = "{ip}"\n'
            "  https = false\n}\nadmin: {\n  admin_http = false\n}\n"
        ),
        "janus.plugin.streaming.jcfg": f'general: {{\n  string_ids = true\n  rtp_port_range = "{rtp_ports}"\n}}\n',
    }


def write_config(root: Path, port: int, viewer_timeout_s: int = VIEWER_TIMEOUT_S) -> Path:
    """The configuration folder (config_files), with folders holding links to just the two libraries it loads.
    Returns janus.jcfg."""
    for folder, library in PARTS.items():
        (root / folder).mkdir()
        (root / folder / library).symlink_to(LIBRARIES / folder / library)
    for folder in ("events", "loggers"):
        (root / folder).mkdir()
    for name, text in config_files(str(root), port=port, viewer_timeout_s=viewer_timeout_s).items():
        (root / name).write_text(text)
    return root / "janus.jcfg"


@contextmanager
def janus_server(viewer_timeout_s: int = VIEWER_TIMEOUT_S, api_secret: str | None = None) -> Iterator[JanusServer]:
    """Run Janus on a free loopback port until the block ends (`api_secret`: a random one unless given)."""
    with tempfile.TemporaryDirectory(prefix="monologue-janus-") as folder:
        root, port, secret = Path(folder), free_port(), api_secret or secrets.token_hex(16)
        config, log = write_config(root, port, viewer_timeout_s), root / "janus.log"
        command = [binary(), "-C", str(config), "-F", str(root), "-a", secret, "-N", "-L", str(log), "-o"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/janus"
        try:
            _wait_ready(url, process, log)
            yield JanusServer(url, secret, log)
        finally:
            stop_process(process)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    """Until `GET /janus/info` answers and lists the Streaming plug-in."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"janus exited with {process.returncode}: {tail}")
        try:
            if "janus.plugin.streaming" in httpx.get(f"{url}/info", timeout=1.0).json().get("plugins", {}):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"janus did not answer on {url} within {timeout_s:.0f} s")
