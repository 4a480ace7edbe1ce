"""The Amazon Kinesis Video Streams sink: our fMP4 segments, repackaged as Matroska, sent over PutMedia.

boto3 has no PutMedia (AWS ships it only in the Java SDK and the C producer SDK), so this is a small client of its
own. PutMedia is one long HTTP/1.1 POST: the body, sent with chunked transfer encoding, is one Matroska stream (the
header once, then one Cluster per fragment); the response, sent while the body is still being written, is a stream
of JSON acknowledgements (BUFFERING, RECEIVED, PERSISTED, ERROR, IDLE) naming fragments by their timecode. Reading
while writing is the point, so the connection is driven by asyncio in a thread of its own: one task writes clusters,
another reads acknowledgements, on one socket (TLS included: asyncio's SSL transport serialises the two directions
itself, which two threads on one ssl.SSLSocket would not). httpx and http.client send the whole body before they
read a response, so they cannot speak PutMedia.

This module is the sink and its pump (the connections, their rotation and retries). The rest is beside it:
kvs_client.py finds the data endpoint, signs the request (SigV4 over the head only) and says what a refusal means;
kvs_session.py keeps the session's timeline and the segments not yet durable; kvs_wire.py frames the bytes.

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
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult

import structlog

from monologue.settings import SinkSettings
from monologue.sink_policy import SinkRefused

from .kvs_client import PutMediaClient
from .kvs_session import Ledger, PendingSegment, Timeline
from .kvs_wire import Acknowledgements, ConnectionFailed, Fatal, chunk, response_body
from .sinks import Sink, SinkError

log = structlog.get_logger("kvs")

_DURABLE_EVENTS = ("PERSISTED", "RECEIVED")


@dataclass(frozen=True)
class _Delivery:
    """How the sink delivers: what counts as durable, when a connection ends, how often it retries, how long
    it waits (the KinesisVideoSink arguments of the same names)."""

    durable_event: str
    rotate_after_s: float
    idle_close_s: float
    max_attempts: int
    retry_base_s: float
    retry_max_s: float
    ack_timeout_s: float
    finish_timeout_s: float

    def __post_init__(self) -> None:
        if self.durable_event not in _DURABLE_EVENTS:
            raise ValueError(f"durable_event={self.durable_event!r} must be one of {_DURABLE_EVENTS}")
        if self.max_attempts < 1 or self.rotate_after_s < 0 or self.idle_close_s <= 0:
            raise ValueError(
                f"need max_attempts >= 1, rotate_after_s >= 0, idle_close_s > 0; got max_attempts={self.max_attempts}, "
                f"rotate_after_s={self.rotate_after_s}, idle_close_s={self.idle_close_s}"
            )


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
        self._delivery = _Delivery(
            durable_event=durable_event,
            rotate_after_s=rotate_after_s,
            idle_close_s=idle_close_s,
            max_attempts=max_attempts,
            retry_base_s=retry_base_s,
            retry_max_s=retry_max_s,
            ack_timeout_s=ack_timeout_s,
            finish_timeout_s=finish_timeout_s,
        )
        self._client = PutMediaClient(
            stream_name,
            region=region,
            allowed=allowed,
            endpoint_url=endpoint_url,
            client=client,
            credentials=credentials,
            connect_timeout_s=connect_timeout_s,
            min_connect_interval_s=min_connect_interval_s,
        )
        self.stream_name = stream_name
        self.producer_start_ms = producer_start_ms
        self.connections = 0  # PutMedia connections opened (for logs and tests)
        self._log = log.bind(stream=stream_name)
        self._timeline: Timeline | None = None  # the caller's, from start()
        self._closed = False
        # Owned by the event loop thread once started:
        self._ledger = Ledger(durable_event)
        self._finishing = False
        self._wake = asyncio.Event()
        self._failure: SinkError | SinkRefused | None = None
        self._done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: Any = None  # concurrent.futures.Future of the supervisor

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
        self._timeline = timeline = Timeline(init_segment, origin_ms=self.producer_start_ms, next_index=next_index)
        self._client.endpoint = self._client.data_endpoint()
        self._ledger.acknowledged = next_index
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"kvs-{self.stream_name}", daemon=True)
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._supervise(timeline), self._loop)

    def put(self, index: int, segment: bytes) -> None:
        if self._timeline is None or self._loop is None or self._closed:
            raise RuntimeError("KinesisVideoSink.put before start() or after finish()/close()")
        if self._failure is not None:
            raise self._failure
        self._loop.call_soon_threadsafe(self._enqueue, self._timeline.cluster(index, segment))

    def acknowledged(self) -> int:
        return self._ledger.acknowledged

    def finish(self, *, ended: bool) -> None:
        """Flush and close. KVS has no end-of-stream marker, so `ended` changes nothing here."""
        if self._timeline is None or self._loop is None or self._closed:
            raise RuntimeError("KinesisVideoSink.finish before start() or after finish()/close()")
        self._loop.call_soon_threadsafe(self._begin_finish)
        if not self._done.wait(self._delivery.finish_timeout_s):
            unacknowledged = self._timeline.next_put - self._ledger.acknowledged
            self.close()
            raise SinkError(
                f"stream {self.stream_name}: {unacknowledged} segment(s) still not {self._delivery.durable_event} "
                f"after {self._delivery.finish_timeout_s} s"
            )
        self._stop_loop()
        if self._failure is not None:
            raise self._failure
        self._log.info(
            "kvs_finished", ended=ended, acknowledged=self._ledger.acknowledged, connections=self.connections
        )

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

    # --- the pump: the event loop thread ----------------------------------------------------------------------

    def _enqueue(self, pending: PendingSegment) -> None:
        self._ledger.add(pending)
        self._wake.set()

    def _begin_finish(self) -> None:
        self._finishing = True
        self._wake.set()

    async def _supervise(self, timeline: Timeline) -> None:
        try:
            await self._run(timeline)
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

    async def _run(self, timeline: Timeline) -> None:
        """Open connections while there is something to send, until finish() and everything is durable."""
        failures = 0
        while True:
            if self._ledger.empty:
                if self._finishing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            before = self._ledger.acknowledged
            try:
                await self._connection(timeline)
                continue
            except ConnectionFailed as error:
                reason = str(error)
            except TimeoutError:
                reason = f"no connection within {self._client.connect_timeout_s} s"
                self._client.endpoint = None
            except OSError as error:  # cannot connect, reset...: the endpoint may have moved
                reason = f"{type(error).__name__}: {error}"
                self._client.endpoint = None
            failures = 0 if self._ledger.acknowledged > before else failures + 1
            if failures >= self._delivery.max_attempts:
                raise SinkError(
                    f"stream {self.stream_name}: segment {self._ledger.acknowledged} still not "
                    f"{self._delivery.durable_event} after {failures} attempts; last error: {reason}"
                )
            delay = min(self._delivery.retry_max_s, self._delivery.retry_base_s * 2 ** max(failures - 1, 0))
            self._log.warning("kvs_reconnecting", reason=reason, failures_in_a_row=failures, delay_s=delay)
            await asyncio.sleep(delay)

    async def _connection(self, timeline: Timeline) -> None:
        """One PutMedia request: send header and clusters, read acknowledgements, end the body when it is time."""
        reader, writer, url = await self._client.connect()
        self.connections += 1
        sent: list[int] = []
        responses = asyncio.create_task(self._read_acknowledgements(reader))
        sending = asyncio.create_task(self._send(writer, url, timeline, sent))
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
            ack_timeout_s = self._delivery.ack_timeout_s
            await asyncio.wait({responses}, timeout=ack_timeout_s)
            if not responses.done():
                raise ConnectionFailed(f"the response did not end within {ack_timeout_s} s of the body's end")
            responses.result()
            missing = self._ledger.not_durable(sent)
            if missing:
                raise ConnectionFailed(
                    f"the response ended without {self._delivery.durable_event} for segments {missing[:5]} "
                    "(streams without data retention never send PERSISTED: use durable_event='RECEIVED')"
                )
        finally:
            for task in (responses, sending):
                task.cancel()
            await asyncio.gather(responses, sending, return_exceptions=True)
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _send(self, writer: asyncio.StreamWriter, url: SplitResult, timeline: Timeline, sent: list[int]) -> None:
        """Write the header, then each segment not yet durable; end the body on rotation, idleness or finish."""
        loop = asyncio.get_running_loop()
        writer.write(self._client.request_head(url, timeline.origin_ms) + chunk(timeline.header))
        await writer.drain()
        opened = last_write = loop.time()
        rotate_after_s, idle_close_s = self._delivery.rotate_after_s, self._delivery.idle_close_s
        reason = "finished"
        while True:
            candidate = self._ledger.next_to_send(after=sent[-1] if sent else -1)
            rotate_due = bool(sent) and loop.time() - opened >= rotate_after_s
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
            wait = min(opened + rotate_after_s, last_write + idle_close_s) - loop.time()
            if wait <= 0:
                reason = "idle"
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
        self._log.info("kvs_ending_body", reason=reason, segments=len(sent))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _read_acknowledgements(self, reader: asyncio.StreamReader) -> None:
        headers = await self._client.response_headers(reader)
        acknowledgements = Acknowledgements()
        async for data in response_body(reader, headers):
            for ack in acknowledgements.feed(data):
                self._ledger.on_ack(ack)
