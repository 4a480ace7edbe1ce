"""Uploads cannot run the API out of disk or memory: on the real stack, a /v1 request with a body is refused
from its head alone (no key: 401; a declared size over the limit: 413) without the server reading any of
the body; a chunked body is cut off with 413 once past the limit; and a small upload that decodes to too
much audio is refused with 422 naming the limit.

The refusals are checked over raw sockets: only they can send a request head and then nothing, and see
whether the server answers without the body (an HTTP client would send the body first)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from cli.stack import Stack
from tests.helpers import api_key, wav_bytes
from tests.monologue.test_media import hour_of_silence_flac

pytestmark = pytest.mark.slow

UPLOAD_ROUTES = ["/v1/renders", "/v1/sessions"]
SIXTY_MIB = 60 * 1024 * 1024
BOUNDARY = "guard-test-boundary"
NO_ANSWER_S = 30  # a server that waits for the body never answers: the test fails instead of hanging
CHUNK = 64 * 1024


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    closed: bool  # the server closed the connection after the response


@contextmanager
def raw_connection(api_url: str) -> Iterator[socket.socket]:
    address = urlsplit(api_url)
    with socket.create_connection((address.hostname, address.port), timeout=NO_ANSWER_S) as connection:
        yield connection


def request_head(api_url: str, path: str, headers: dict[str, str]) -> bytes:
    """A POST's request line and headers, ending with the blank line after which the body would follow."""
    host = urlsplit(api_url).netloc
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Type: multipart/form-data; boundary={BOUNDARY}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(connection: socket.socket) -> RawResponse:
    """Read until the server closes the connection; a whole response on a connection kept open past
    NO_ANSWER_S counts as not closed."""
    data, closed = b"", False
    while not closed:
        try:
            received = connection.recv(65536)
        except ConnectionResetError:  # closed with our unread body in its buffer: a reset, after its answer
            received = b""
        except TimeoutError:
            if _complete(data):
                break
            raise
        closed = not received
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in header_lines)}
    return RawResponse(int(status_line.split()[1]), headers, body, closed)


def _complete(data: bytes) -> bool:
    head, separator, body = data.partition(b"\r\n\r\n")
    if not separator:
        return False
    length = next(
        (line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")), 0
    )
    return len(body) >= int(length)


def send_head_only(api_url: str, path: str, headers: dict[str, str]) -> RawResponse:
    """Send a request's head, none of its body, and read what the server answers."""
    with raw_connection(api_url) as connection:
        connection.sendall(request_head(api_url, path, headers))
        return read_response(connection)


def valid_key(api_url: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key(api_url)}"}


# --------------------------------------------------------------------------- refused from the head alone


@pytest.mark.parametrize("path", UPLOAD_ROUTES)
@pytest.mark.parametrize("authorization", [None, "Bearer not-a-key"], ids=["no-key", "bad-key"])
def test_an_upload_without_a_valid_key_is_refused_before_its_body_is_sent(
    api_url: str, path: str, authorization: str | None
) -> None:
    """60 MiB announced, not a byte sent: the 401 comes anyway, the same one a route gives, and the server
    closes the connection rather than read the body it refused."""
    key = {"Authorization": authorization} if authorization else {}

    response = send_head_only(api_url, path, key | {"Content-Length": str(SIXTY_MIB)})

    from_a_route = httpx.get(f"{api_url}/v1/renders", headers=key, timeout=10)  # require_key's own 401
    assert from_a_route.status_code == 401
    assert response.status == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert json.loads(response.body) == from_a_route.json() | {"instance": path}  # the same problem, its own path
    assert response.closed


@pytest.mark.parametrize("path", UPLOAD_ROUTES)
@pytest.mark.parametrize("over", [1, SIXTY_MIB], ids=["one-byte-over", "60MiB-over"])
def test_an_upload_declared_over_the_body_limit_is_refused_before_its_body_is_sent(
    stack: Stack, api_url: str, path: str, over: int
) -> None:
    limits = stack.settings.limits
    headers = valid_key(api_url) | {"Content-Length": str(limits.max_body_bytes + over)}

    response = send_head_only(api_url, path, headers)

    assert response.status == 413
    detail = json.loads(response.body)["detail"]
    assert "MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES" in detail and str(limits.max_body_bytes) in detail
    assert response.closed


# --------------------------------------------------------------------------- chunked bodies, counted


class ResponseReader(threading.Thread):
    """Reads the response while the main thread is still sending, as a browser would see it."""

    def __init__(self, connection: socket.socket) -> None:
        super().__init__(daemon=True)
        self.connection = connection
        self.response: RawResponse | None = None
        self.answered = threading.Event()

    def run(self) -> None:
        try:
            self.response = read_response(self.connection)
        finally:
            self.answered.set()


def chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def send_chunked_until_refused(api_url: str, path: str, give_up_after: int) -> tuple[RawResponse | None, int]:
    """Send an endless audio file, chunked, until the server answers or hangs up; (its answer, bytes sent).

    The bytes sent include what the kernels buffered between the two ends; the server read fewer."""
    file_part = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="audio"; filename="endless.wav"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    with raw_connection(api_url) as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)  # little left in our own buffer
        connection.sendall(request_head(api_url, path, valid_key(api_url) | {"Transfer-Encoding": "chunked"}))
        reader = ResponseReader(connection)
        reader.start()
        sent = 0
        try:
            connection.sendall(chunk(file_part))
            while sent < give_up_after and not reader.answered.is_set():
                connection.sendall(chunk(bytes(CHUNK)))
                sent += CHUNK
            connection.sendall(b"0\r\n\r\n")  # the server read it all: end the body so that it answers
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server hung up mid-body: what we want
        reader.join(NO_ANSWER_S)
        return reader.response, sent


def in_flight_at_most() -> int:
    """What can sit between our `sendall` and the server's count: the server's receive buffer at its largest
    (tcp_rmem's maximum, which autotuning may reach), our send buffer (the kernel doubles SO_SNDBUF) and a
    few chunks in uvicorn's own read buffer and in transit."""
    with open("/proc/sys/net/ipv4/tcp_rmem") as tcp_rmem:
        return int(tcp_rmem.read().split()[2]) + 2 * CHUNK + 4 * CHUNK


def test_a_chunked_upload_is_cut_off_with_413_soon_after_the_body_limit(stack: Stack, api_url: str) -> None:
    """No Content-Length to refuse up front: the server counts, answers 413 once past the limit and hangs
    up, so the client cannot push more than the limit and what the kernels buffer (a server that read on
    would take all it is offered, more than that)."""
    limit = stack.settings.limits.max_body_bytes
    at_most = limit + in_flight_at_most()

    response, sent = send_chunked_until_refused(api_url, "/v1/renders", give_up_after=at_most + CHUNK)

    assert response is not None and response.status == 413
    assert "MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES" in json.loads(response.body)["detail"]
    assert response.closed
    assert sent < at_most


def test_a_chunked_upload_under_the_limit_reaches_the_route(api_url: str) -> None:
    """The guard counts chunked bodies but lets one under the limit through: the route answers it."""
    seed_field = [b"--", BOUNDARY.encode(), b'\r\nContent-Disposition: form-data; name="seed"\r\n\r\n1\r\n']
    body = [*seed_field, b"--", BOUNDARY.encode(), b"--\r\n"]
    headers = valid_key(api_url) | {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}

    response = httpx.post(f"{api_url}/v1/renders", content=iter(body), headers=headers, timeout=30)

    assert response.status_code == 422  # no portrait, no audio: the route's own validation
    detail = response.json()["detail"]
    assert "portrait: send the file" in detail and "audio: send the file" in detail


# --------------------------------------------------------------------------- small uploads, too much audio


def test_an_hour_of_silence_in_half_a_megabyte_is_refused_naming_the_audio_limit(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    data = hour_of_silence_flac()
    files = {"portrait": ("portrait.jpg", sample_portrait), "audio": ("hour.flac", data)}

    response = httpx.post(f"{api_url}/v1/renders", files=files, headers=valid_key(api_url), timeout=120)

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert f"{stack.settings.limits.max_audio_seconds:g} s limit" in detail
    assert "MONOLOGUE_LIMITS__MAX_AUDIO_SECONDS" in detail


def test_a_request_with_a_body_and_a_valid_key_is_answered_by_the_route(api_url: str, sample_portrait: bytes) -> None:
    """The guard's key check does not replace the route's: a good key gets the route's own answer."""
    files = {"portrait": ("portrait.jpg", sample_portrait), "audio": ("empty.wav", wav_bytes(np.zeros(0)))}

    response = httpx.post(f"{api_url}/v1/renders", files=files, headers=valid_key(api_url), timeout=60)

    assert response.status_code == 422
    assert "zero length" in response.json()["detail"]  # decoded by the route: the WAV has no samples
