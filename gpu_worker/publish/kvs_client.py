"""PutMedia's client: where a stream's data endpoint is, how a request is signed and a connection opened, and
what the service's refusals and ERROR acknowledgements mean (retry on a new connection, or give up).

It owns no session state and sends no media: the sink (kvs.py) writes the body and keeps the segments.

Signing: SigV4 by botocore (service "kinesisvideo"), over the request line and headers only. The streamed body
cannot be hashed before it is sent, and KVS does not use S3's chunk-signing scheme: its C producer SDK signs the
payload hash as if the body were empty (SHA-256 of ""), and the x-amzn-* headers, host and date are what the
signature protects. We sign the same way (an AWSRequest with an empty body, the MKV streamed afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from typing import Any
from urllib.parse import SplitResult, urlsplit

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError, ClientError

from monologue.settings import SinkSettings
from monologue.sink_policy import SinkRefused, data_endpoint_refusal

from .kvs_wire import ConnectionFailed, Fatal, ack_number, response_body
from .sinks import SinkError

SERVICE = "kinesisvideo"
# ERROR acknowledgement codes worth a retry on a new connection; KVS documents the others as problems of the data,
# the stream or its KMS key, which sending again does not fix.
RETRYABLE_ERRORS = {
    4000: "error reading the data stream",
    4003: "connection open longer than allowed",
    5000: "internal service error",
    5001: "failed to persist fragments",
}
# HTTP refusals worth a retry: throttling (400 with these error types, 429) and server-side failures.
_RETRYABLE_TYPES = ("ClientLimitExceededException", "ConnectionLimitExceededException", "InvalidEndpointException")
_RETRYABLE_STATUS = (429, 500, 502, 503, 504)


class PutMediaClient:
    """One stream's PutMedia endpoint and the connections to it; see the module docstring.

    `client` (boto3 "kinesisvideo", for GetDataEndpoint) and `credentials` (botocore's, for signing) default
    to boto3's default chain, `endpoint_url` overriding the default client's control plane endpoint. `endpoint`
    is the data endpoint in use: None until located, and again whenever it may have moved."""

    def __init__(
        self,
        stream_name: str,
        *,
        region: str,
        allowed: SinkSettings,
        endpoint_url: str | None,
        client: Any,
        credentials: Any,
        connect_timeout_s: float,
        min_connect_interval_s: float,
    ) -> None:
        self.client, self.credentials = _with_defaults(client, credentials, region=region, endpoint_url=endpoint_url)
        self.stream_name = stream_name
        self.connect_timeout_s = connect_timeout_s
        self.endpoint: str | None = None
        self._region = region
        self._allowed = allowed
        self._control_endpoint = endpoint_url
        self._min_connect_interval_s = min_connect_interval_s
        self._last_connect = float("-inf")

    def data_endpoint(self) -> str:
        """GetDataEndpoint's answer, if the tenant's allow-lists allow it (SinkRefused if not, SinkError if the
        call fails)."""
        try:
            response = self.client.get_data_endpoint(StreamName=self.stream_name, APIName="PUT_MEDIA")
        except (BotoCoreError, ClientError) as error:
            raise SinkError(f"GetDataEndpoint for stream {self.stream_name} failed: {error}") from error
        endpoint = str(response["DataEndpoint"])
        problem = data_endpoint_refusal(
            endpoint, region=self._region, control_endpoint=self._control_endpoint, allowed=self._allowed
        )
        if problem is not None:  # final: asking again would not make the operator allow it
            raise SinkRefused(f"stream {self.stream_name}: {problem}")
        return endpoint

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, SplitResult]:
        """A new connection to the data endpoint (located first if unknown), TLS for https."""
        if self.endpoint is None:
            try:
                self.endpoint = await asyncio.to_thread(self.data_endpoint)
            except SinkError as error:  # at start() it is final; here it is one more failed attempt
                raise ConnectionFailed(str(error)) from error
        loop = asyncio.get_running_loop()
        # KVS accepts at most 5 PutMedia calls per second per stream.
        await asyncio.sleep(max(0.0, self._last_connect + self._min_connect_interval_s - loop.time()))
        self._last_connect = loop.time()
        url = urlsplit(self.endpoint)
        secure = url.scheme == "https"
        host = url.hostname or ""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                url.port or (443 if secure else 80),
                ssl=ssl.create_default_context() if secure else None,
                server_hostname=host if secure else None,
            ),
            self.connect_timeout_s,
        )
        return reader, writer, url

    def request_head(self, url: SplitResult, start_ms: int) -> bytes:
        """The signed request line and headers of a PutMedia whose timecodes count from `start_ms` (epoch ms)."""
        request = AWSRequest(
            method="POST",
            url=f"{url.scheme}://{url.netloc}/putMedia",
            headers={
                "host": url.netloc,
                "x-amzn-stream-name": self.stream_name,
                "x-amzn-fragment-timecode-type": "ABSOLUTE",
                "x-amzn-producer-start-timestamp": f"{start_ms // 1000}.{start_ms % 1000:03d}",
                "x-amzn-fragment-acknowledgment-required": "1",
            },
            data=b"",  # signed as an empty payload, as KVS's own producer SDK does: the body is streamed afterwards
        )
        SigV4Auth(self.credentials.get_frozen_credentials(), SERVICE, self._region).add_auth(request)
        lines = ["POST /putMedia HTTP/1.1", *(f"{name}: {value}" for name, value in request.headers.items())]
        lines += ["Transfer-Encoding: chunked", "Connection: keep-alive", "Accept: */*", "User-Agent: monologue"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")

    async def response_headers(self, reader: asyncio.StreamReader) -> dict[str, str]:
        """The response's headers (names lower-cased) once its status is 200; a refusal raises ConnectionFailed
        (worth another connection) or Fatal."""
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionFailed("the connection closed before a response")
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ConnectionFailed(f"not an HTTP response: {status_line[:100]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()).strip():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 200:
            pieces: list[bytes] = []

            async def read_error_body() -> None:
                pieces.extend([piece async for piece in response_body(reader, headers)])

            with contextlib.suppress(TimeoutError, ConnectionFailed):  # the status says enough without the body
                await asyncio.wait_for(read_error_body(), 5.0)
            self._refused(status, headers, b"".join(pieces)[:2000])
        return headers

    def _refused(self, status: int, headers: dict[str, str], body: bytes) -> None:
        error_type = headers.get("x-amzn-errortype") or headers.get("x-amz-errortype") or ""
        message = body.decode("utf-8", "replace")
        try:
            parsed = json.loads(body)
            error_type = error_type or str(parsed.get("__type", ""))
            message = str(parsed.get("message") or parsed.get("Message") or message)
        except (ValueError, AttributeError):
            pass
        text = f"PutMedia refused with HTTP {status} {error_type}: {message}".strip()
        if status in _RETRYABLE_STATUS or any(kind in error_type for kind in _RETRYABLE_TYPES):
            if "InvalidEndpoint" in error_type:
                self.endpoint = None
            raise ConnectionFailed(text)
        raise Fatal(text)


def error_acknowledgement(ack: dict[str, Any], subject: str) -> ConnectionFailed | Fatal:
    """What an ERROR acknowledgement about `subject` (a segment, or a timecode) means: retry, or give up."""
    code = ack_number(ack.get("ErrorId", ack.get("ErrorCode")))
    text = f"ERROR {code} for {subject}"
    if code in RETRYABLE_ERRORS:
        return ConnectionFailed(f"{text}: {RETRYABLE_ERRORS[code]}")
    return Fatal(f"{text}, which retrying cannot fix: {ack}")


def _with_defaults(client: Any, credentials: Any, *, region: str, endpoint_url: str | None) -> tuple[Any, Any]:
    """The control plane client and signing credentials, boto3's default chain filling whichever is missing."""
    if client is None or credentials is None:
        session = boto3.session.Session(region_name=region)
        client = client or session.client("kinesisvideo", endpoint_url=endpoint_url)
        credentials = credentials or session.get_credentials()
    if credentials is None:
        raise SinkError("no AWS credentials found for signing PutMedia (boto3's default chain found none)")
    return client, credentials
