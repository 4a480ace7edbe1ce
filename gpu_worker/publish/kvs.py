"""The Amazon Kinesis Video Streams sink: our fMP4 segments, repackaged as Matroska, sent over PutMedia.

boto3 has no PutMedia (AWS ships it only in the Java SDK and the C producer SDK), so this is a small client of its
own. PutMedia is one long HTTP/1.1 POST: the body, sent with chunked transfer encoding, is one Matroska stream (the
header once, then one Cluster per fragment); the response, sent while the body is still being written, is a stream
of JSON acknowledgements (BUFFERING, RECEIVED, PERSISTED, ERROR, IDLE) naming fragments by their timecode. Reading
while writing is the point, so the connection is driven by asyncio in a thread of its own: one task writes clusters,
another reads acknowledgements, on one socket (TLS included: asyncio's SSL transport serialises the two directions
itself, which two threads on one ssl.SSLSocket would not). httpx and http.client send the whole body before they
read a response, so they cannot speak PutMedia.

Signing: SigV4 by botocore (service "kinesisvideo"), over the request line and headers only. The streamed body
cannot be hashed before it is sent, and KVS does not use S3's chunk-signing scheme: its C producer SDK signs the
payload hash as if the body were empty (SHA-256 of ""), and the x-amzn-* headers, host and date are what the
signature protects. We sign the same way (an AWSRequest with an empty body, the MKV streamed afterwards).

Delivery: every segment put is kept until KVS reports it durable (PERSISTED, or RECEIVED for streams without
retention, see `durable_event`). On an ERROR acknowledgement or a dropped connection the sink reconnects with
backoff, sends the Matroska header again, then every segment not yet durable, in order; an ERROR KVS documents as
permanent (bad MKV, fragment too long, KMS refusal...) or `max_attempts` failures without progress are final and
surface as SinkError. KVS's limits are kept: fragments of at most 10 s (longer ones are refused at put: a segment is
one GOP and cannot be split without re-encoding), one connection per stream, and connections closed before the
service's ~40-minute limit (`rotate_after_s`) or its 30 s idle limit (`idle_close_s`) by ending the body and
reading the remaining acknowledgements first, so rotation neither loses nor repeats a fragment. A connection that
breaks can repeat one: a fragment KVS persisted whose acknowledgement was lost in the break is sent again (PutMedia
has no idempotency key); nothing is ever lost.

Timecodes are absolute (x-amzn-fragment-timecode-type: ABSOLUTE): a cluster's timecode = producer start time +
the fragment's media time, so a resumed session, given the original `producer_start_ms`, continues the same timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import boto3
import structlog
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError, ClientError

from monologue.mp4.fragments import Movie, read_fragment, read_init
from monologue.settings import SinkSettings
from monologue.sink_policy import SinkRefused, data_endpoint_refusal

from . import mkv
from .kvs_wire import Acknowledgements, ConnectionFailed, Fatal, chunk, response_body
from .sinks import Sink, SinkError

log = structlog.get_logger("kvs")

MAX_FRAGMENT_MS = 10_000
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
_DURABLE_EVENTS = ("PERSISTED", "RECEIVED")


@dataclass
class _Pending:
    """A segment put but not yet durable: its cluster bytes are kept until then, for resending."""

    index: int
    timecode: int
    data: bytes
    state: str = "queued"  # then "sent" and the acknowledgements' event types


class KinesisVideoSink(Sink):
    """Streams a session's segments to a Kinesis video stream with PutMedia; see the module docstring.

    `client` is a boto3 "kinesisvideo" client (for GetDataEndpoint) and `credentials` botocore credentials for
    signing PutMedia; both default to boto3's default chain (`endpoint_url` overrides the default client's control
    plane endpoint). `allowed` (the tenant's allow-lists, `sink_policy.for_tenant`) says where the data endpoint the
    control plane returns may be; anywhere else, the sink raises SinkRefused and sends nothing (with an injected
    `client`, give `endpoint_url` as the URL it talks to). `producer_start_ms` (epoch milliseconds) anchors the
    timecodes: it defaults to the time of start() on a fresh session and must be given, the original value, when
    resuming (start with next_index > 0); read it back from `producer_start_ms` after start() to record it.
    """

    name = "kinesis-video"

    def __init__(
        self,
        stream_name: str,
        *,
        region: str,
        allowed: SinkSettings,
        endpoint_url: str | None = None,
        client: Any = None,
        credentials: Any = None,
        producer_start_ms: int | None = None,
        durable_event: str = "PERSISTED",
        rotate_after_s: float = 35 * 60,
        idle_close_s: float = 20.0,
        max_attempts: int = 5,
        retry_base_s: float = 0.5,
        retry_max_s: float = 8.0,
        connect_timeout_s: float = 10.0,
        min_connect_interval_s: float = 0.2,
        ack_timeout_s: float = 30.0,
        finish_timeout_s: float = 300.0,
    ) -> None:
        if durable_event not in _DURABLE_EVENTS:
            raise ValueError(f"durable_event={durable_event!r} must be one of {_DURABLE_EVENTS}")
        if max_attempts < 1 or rotate_after_s < 0 or idle_close_s <= 0:
            raise ValueError(
                f"need max_attempts >= 1, rotate_after_s >= 0, idle_close_s > 0; got max_attempts={max_attempts}, "
                f"rotate_after_s={rotate_after_s}, idle_close_s={idle_close_s}"
            )
        if client is None or credentials is None:
            session = boto3.session.Session(region_name=region)
            client = client or session.client("kinesisvideo", endpoint_url=endpoint_url)
            credentials = credentials or session.get_credentials()
        if credentials is None:
            raise SinkError("no AWS credentials found for signing PutMedia (boto3's default chain found none)")
        self.stream_name = stream_name
        self.producer_start_ms = producer_start_ms
        self._region = region
        self._allowed = allowed
        self._control_endpoint = endpoint_url
        self._client = client
        self._credentials = credentials
        self._durable_event = durable_event
        self._rotate_after_s = rotate_after_s
        self._idle_close_s = idle_close_s
        self._max_attempts = max_attempts
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._connect_timeout_s = connect_timeout_s
        self._min_connect_interval_s = min_connect_interval_s
        self._last_connect = float("-inf")
        self._ack_timeout_s = ack_timeout_s
        self._finish_timeout_s = finish_timeout_s
        self._log = log.bind(stream=stream_name)
        self._movie: Movie | None = None
        self._origin_ms = 0  # producer_start_ms once started
        self._closed = False
        self._header = b""
        self._endpoint: str | None = None
        self._next_put = 0
        self._last_timecode = -1
        self._acknowledged = 0
        # Owned by the event loop thread once started:
        self._pending: dict[int, _Pending] = {}
        self._by_timecode: dict[int, int] = {}
        self._finishing = False
        self._wake = asyncio.Event()
        self._failure: SinkError | SinkRefused | None = None
        self._done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: Any = None  # concurrent.futures.Future of the supervisor
        self.connections = 0  # PutMedia connections opened (for logs and tests)

    # --- the Sink interface (caller's thread) ----------------------------------------------------------------

    def start(self, init_segment: bytes, next_index: int) -> None:
        if self._loop is not None:
            raise RuntimeError("KinesisVideoSink.start called twice")
        if next_index < 0:
            raise ValueError(f"next_index must be >= 0, got next_index={next_index}")
        if self.producer_start_ms is None:
            if next_index > 0:
                raise ValueError(
                    f"resuming at segment {next_index} needs the session's original producer_start_ms, "
                    "or the timecodes would not continue its timeline"
                )
            self.producer_start_ms = int(time.time() * 1000)
        self._origin_ms = self.producer_start_ms
        self._movie = read_init(init_segment)
        self._header = mkv.header(self._movie)
        self._endpoint = self._data_endpoint()
        self._next_put = self._acknowledged = next_index
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"kvs-{self.stream_name}", daemon=True)
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._supervise(), self._loop)

    def put(self, index: int, segment: bytes) -> None:
        if self._movie is None or self._loop is None or self._closed:
            raise RuntimeError("KinesisVideoSink.put before start() or after finish()/close()")
        if self._failure is not None:
            raise self._failure
        if index != self._next_put:
            raise ValueError(f"segment {index} put out of order: the next segment must be {self._next_put}")
        fragment = read_fragment(segment, self._movie)
        for track in self._movie.tracks.values():
            if not fragment.samples.get(track.track_id):
                raise ValueError(
                    f"segment {index} has no {track.kind} samples; KVS refuses fragments missing a track (4011)"
                )
        built = mkv.cluster(self._movie, fragment, origin_ms=self._origin_ms)
        if built.duration_ms > MAX_FRAGMENT_MS:
            raise ValueError(
                f"segment {index} lasts {built.duration_ms / 1000:.3f} s; KVS refuses fragments over "
                f"{MAX_FRAGMENT_MS / 1000:.0f} s, and a segment (one GOP) cannot be split without re-encoding: "
                "use shorter chunks"
            )
        if built.timecode <= self._last_timecode:
            raise ValueError(
                f"segment {index} starts at {built.timecode} ms, not after the previous segment ({self._last_timecode})"
            )
        self._last_timecode = built.timecode
        self._next_put += 1
        self._loop.call_soon_threadsafe(self._enqueue, _Pending(index, built.timecode, built.data))

    def acknowledged(self) -> int:
        return self._acknowledged

    def finish(self, *, ended: bool) -> None:
        """Flush and close. KVS has no end-of-stream marker, so `ended` changes nothing here."""
        if self._loop is None or self._closed:
            raise RuntimeError("KinesisVideoSink.finish before start() or after finish()/close()")
        self._loop.call_soon_threadsafe(self._begin_finish)
        if not self._done.wait(self._finish_timeout_s):
            unacknowledged = self._next_put - self._acknowledged
            self.close()
            raise SinkError(
                f"stream {self.stream_name}: {unacknowledged} segment(s) still not {self._durable_event} "
                f"after {self._finish_timeout_s} s"
            )
        self._stop_loop()
        if self._failure is not None:
            raise self._failure
        self._log.info("kvs_finished", ended=ended, acknowledged=self._acknowledged, connections=self.connections)

    def close(self) -> None:
        self._closed = True
        if self._task is not None and not self._done.is_set():
            self._task.cancel()
            self._done.wait(5.0)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
        if not thread.is_alive():
            loop.close()

    def _data_endpoint(self) -> str:
        try:
            response = self._client.get_data_endpoint(StreamName=self.stream_name, APIName="PUT_MEDIA")
        except (BotoCoreError, ClientError) as error:
            raise SinkError(f"GetDataEndpoint for stream {self.stream_name} failed: {error}") from error
        endpoint = str(response["DataEndpoint"])
        problem = data_endpoint_refusal(
            endpoint, region=self._region, control_endpoint=self._control_endpoint, allowed=self._allowed
        )
        if problem is not None:  # final: asking again would not make the operator allow it
            raise SinkRefused(f"stream {self.stream_name}: {problem}")
        return endpoint

    # --- the event loop thread --------------------------------------------------------------------------------

    def _enqueue(self, pending: _Pending) -> None:
        self._pending[pending.index] = pending
        self._by_timecode[pending.timecode] = pending.index
        self._wake.set()

    def _begin_finish(self) -> None:
        self._finishing = True
        self._wake.set()

    async def _supervise(self) -> None:
        try:
            await self._run()
        except (SinkError, SinkRefused) as error:
            self._failure = error
        except Fatal as error:
            self._failure = SinkError(f"stream {self.stream_name}: {error}")
        except Exception as error:  # a bug must still reach the caller, not die with the thread
            self._failure = SinkError(f"stream {self.stream_name}: unexpected {error!r}")
        finally:
            self._done.set()
            if self._failure is not None:
                self._log.error("kvs_failed", error=str(self._failure))

    async def _run(self) -> None:
        """Open connections while there is something to send, until finish() and everything is durable."""
        failures = 0
        while True:
            if not self._pending:
                if self._finishing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            before = self._acknowledged
            try:
                await self._connection()
                continue
            except ConnectionFailed as error:
                reason = str(error)
            except TimeoutError:
                reason = f"no connection within {self._connect_timeout_s} s"
                self._endpoint = None
            except OSError as error:  # cannot connect, reset...: the endpoint may have moved
                reason = f"{type(error).__name__}: {error}"
                self._endpoint = None
            failures = 0 if self._acknowledged > before else failures + 1
            if failures >= self._max_attempts:
                raise SinkError(
                    f"stream {self.stream_name}: segment {self._acknowledged} still not {self._durable_event} after "
                    f"{failures} attempts; last error: {reason}"
                )
            delay = min(self._retry_max_s, self._retry_base_s * 2 ** max(failures - 1, 0))
            self._log.warning("kvs_reconnecting", reason=reason, failures_in_a_row=failures, delay_s=delay)
            await asyncio.sleep(delay)

    async def _connection(self) -> None:
        """One PutMedia request: send header and clusters, read acknowledgements, end the body when it is time."""
        if self._endpoint is None:
            try:
                self._endpoint = await asyncio.to_thread(self._data_endpoint)
            except SinkError as error:  # at start() it is final; here it is one more failed attempt
                raise ConnectionFailed(str(error)) from error
        loop = asyncio.get_running_loop()
        # KVS accepts at most 5 PutMedia calls per second per stream.
        await asyncio.sleep(max(0.0, self._last_connect + self._min_connect_interval_s - loop.time()))
        self._last_connect = loop.time()
        url = urlsplit(self._endpoint)
        secure = url.scheme == "https"
        host = url.hostname or ""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                url.port or (443 if secure else 80),
                ssl=ssl.create_default_context() if secure else None,
                server_hostname=host if secure else None,
            ),
            self._connect_timeout_s,
        )
        self.connections += 1
        sent: list[int] = []
        responses = asyncio.create_task(self._read_response(reader))
        sending = asyncio.create_task(self._send(writer, url, sent))
        try:
            done, _ = await asyncio.wait({responses, sending}, return_when=asyncio.FIRST_COMPLETED)
            if responses in done:
                responses.result()  # an HTTP refusal or an ERROR acknowledgement raises here
                raise ConnectionFailed("the service ended the response before the request body ended")
            if sending.exception() is not None:
                # A refused request is usually closed under the writer: the response says why.
                await asyncio.wait({responses}, timeout=2.0)
                if responses.done():
                    responses.result()
                raise ConnectionFailed(f"sending failed: {sending.exception()!r}")
            await asyncio.wait({responses}, timeout=self._ack_timeout_s)
            if not responses.done():
                raise ConnectionFailed(f"the response did not end within {self._ack_timeout_s} s of the body's end")
            responses.result()
            missing = [index for index in sent if index in self._pending and not self._durable(index)]
            if missing:
                raise ConnectionFailed(
                    f"the response ended without {self._durable_event} for segments {missing[:5]} "
                    "(streams without data retention never send PERSISTED: use durable_event='RECEIVED')"
                )
        finally:
            for task in (responses, sending):
                task.cancel()
            await asyncio.gather(responses, sending, return_exceptions=True)
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    def _request_head(self, url: SplitResult) -> bytes:
        start_ms = self._origin_ms
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
        SigV4Auth(self._credentials.get_frozen_credentials(), SERVICE, self._region).add_auth(request)
        lines = ["POST /putMedia HTTP/1.1", *(f"{name}: {value}" for name, value in request.headers.items())]
        lines += ["Transfer-Encoding: chunked", "Connection: keep-alive", "Accept: */*", "User-Agent: monologue"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")

    def _durable(self, index: int) -> bool:
        return self._pending[index].state == self._durable_event

    async def _send(self, writer: asyncio.StreamWriter, url: SplitResult, sent: list[int]) -> None:
        """Write the header, then each segment not yet durable; end the body on rotation, idleness or finish."""
        loop = asyncio.get_running_loop()
        writer.write(self._request_head(url) + chunk(self._header))
        await writer.drain()
        opened = last_write = loop.time()
        reason = "finished"
        while True:
            after = sent[-1] if sent else -1
            candidate = next(
                (item for item in self._pending.values() if item.index > after and not self._durable(item.index)), None
            )
            rotate_due = bool(sent) and loop.time() - opened >= self._rotate_after_s
            if candidate is not None and not rotate_due:
                writer.write(chunk(candidate.data))
                await writer.drain()
                candidate.state = "sent"
                sent.append(candidate.index)
                last_write = loop.time()
                continue
            if rotate_due:
                reason = "rotating"
                break
            if self._finishing and candidate is None:
                break
            wait = min(opened + self._rotate_after_s, last_write + self._idle_close_s) - loop.time()
            if wait <= 0:
                reason = "idle"
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
        self._log.info("kvs_ending_body", reason=reason, segments=len(sent))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _read_response(self, reader: asyncio.StreamReader) -> None:
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
        acknowledgements = Acknowledgements()
        async for data in response_body(reader, headers):
            for ack in acknowledgements.feed(data):
                self._on_ack(ack)

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
                self._endpoint = None
            raise ConnectionFailed(text)
        raise Fatal(text)

    def _on_ack(self, ack: dict[str, Any]) -> None:
        event = str(ack.get("EventType", ""))
        timecode = _integer(ack.get("FragmentTimecode"))
        index = None if timecode is None else self._by_timecode.get(timecode)
        if event == "ERROR":
            code = _integer(ack.get("ErrorId", ack.get("ErrorCode")))
            text = f"ERROR {code} for " + (f"segment {index}" if index is not None else f"timecode {timecode}")
            if code in RETRYABLE_ERRORS:
                raise ConnectionFailed(f"{text}: {RETRYABLE_ERRORS[code]}")
            raise Fatal(f"{text}, which retrying cannot fix: {ack}")
        if index is None or index not in self._pending:
            return  # IDLE, or an acknowledgement of a segment already durable
        if self._pending[index].state != self._durable_event:
            self._pending[index].state = event
        while self._acknowledged in self._pending and self._durable(self._acknowledged):
            done = self._pending.pop(self._acknowledged)
            del self._by_timecode[done.timecode]
            self._acknowledged += 1


def _integer(value: Any) -> int | None:
    """An acknowledgement's number (KVS sends some as JSON numbers, some as strings), None if absent or not one."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
