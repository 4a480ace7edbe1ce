"""TLS in front of Temporal's dev server, which speaks only plaintext (`temporal server start-dev` has no TLS
flags): a throwaway CA, a server certificate and client certificates (the `cryptography` package), and a
TLS-terminating TCP proxy on loopback that requires a client certificate signed by the CA (mTLS) and speaks
HTTP/2 (ALPN h2, as gRPC clients ask). Everything after the handshake is the real server's gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAME = "temporal.monologue.test"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_bytes(pem)
    path.chmod(0o600)


def _issue(
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
    usage: list[x509.ObjectIdentifier],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer is not None else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if ExtendedKeyUsageOID.SERVER_AUTH in usage:
            names = [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def make_pki(folder: Path, prefix: str = "") -> Pki:
    """A CA, a server certificate for SERVER_NAME and 127.0.0.1, and a client certificate, as PEM files."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _issue(f"{prefix}monologue test CA", None, ca=True, usage=[])
    server_cert, server_key = _issue(
        SERVER_NAME, (ca_cert.subject, ca_key), ca=False, usage=[ExtendedKeyUsageOID.SERVER_AUTH]
    )
    client_cert, client_key = _issue(
        "monologue-node", (ca_cert.subject, ca_key), ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    paths = Pki(
        *(folder / f"{prefix}{name}" for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key"))
    )
    for cert, path in ((ca_cert, paths.ca), (server_cert, paths.server_cert), (client_cert, paths.client_cert)):
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, paths.server_key)
    _write_key(client_key, paths.client_key)
    return paths


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.contextmanager
def tls_proxy(pki: Pki, upstream: str, port: int) -> Iterator[str]:
    """Serve TLS (client certificate required) on 127.0.0.1:`port`, forwarding to `upstream` ("host:port");
    yields the proxy's address. Runs its own event loop in a thread, stopped on exit."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    host, upstream_port = upstream.rsplit(":", 1)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    server: asyncio.Server | None = None

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(upstream_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _pipe(client_reader, server_writer), _pipe(server_reader, client_writer), return_exceptions=True
        )

    async def start() -> None:
        nonlocal server
        server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=context)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:

        async def stop() -> None:
            if server is not None:
                server.close()
            tasks = asyncio.all_tasks(loop) - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
