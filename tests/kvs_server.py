"""A local Kinesis Video Streams for the tests: GetDataEndpoint and PutMedia on loopback, with faults on demand.

It checks what the real service checks and what our sink relies on: the SigV4 signature (recomputed by botocore
from the same credentials and compared; the payload hash must be the empty body's, as KVS's producer SDK signs,
and every x-amzn-* header, host and date must be signed), one PutMedia connection per stream at a time, the Matroska
stream parsed as the chunked body arrives (one Segment; clusters of unknown or known size; each cluster one
fragment, ended by the next cluster or the body's end). Acknowledgements are written by a thread of their own while
the body is still arriving: BUFFERING when a fragment's timecode is read, RECEIVED when it is complete, PERSISTED
after `persist_delay_s`, each JSON object split over two HTTP chunks so that clients cannot rely on chunk framing.

Faults, by the ordinal of a completed fragment across the server's life (0, 1, ...; a resent fragment gets a new
ordinal): `error_at` answers ERROR with the given ErrorId, stores nothing more and ends the response; `drop_at`
discards the fragment and drops the connection (the response stops without its final chunk, as when a proxy dies).
"""

from __future__ import annotations

import contextlib
import hmac
import http.server
import json
import queue
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gpu_worker.publish import mkv

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request, "
    r"SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})"
)
_MAX_CLOCK_SKEW_S = 300


@dataclass
class StoredFragment:
    """A persisted fragment as the server parsed it."""

    timecode: int
    producer_timestamp_ms: int
    connection: int
    size: int
    blocks: list[mkv.SimpleBlock]

    @property
    def tracks(self) -> Counter[int]:
        return Counter(block.track for block in self.blocks)

    @property
    def starts_with_video_keyframe(self) -> bool:
        return bool(self.blocks) and self.blocks[0].track == mkv.VIDEO_TRACK and self.blocks[0].keyframe


@dataclass
class Connection:
    """One PutMedia request: its headers, HTTP status, the MKV header it carried, what was acknowledged when."""

    number: int
    headers: dict[str, str]
    status: int = 0
    codec_ids: list[str] = field(default_factory=list)
    header_elements: list[int] = field(default_factory=list)  # top-level IDs before the first cluster
    fragments: list[int] = field(default_factory=list)  # timecodes of the clusters completed on it
    acks_while_receiving: int = 0  # acknowledgements written before the client ended the body
    body_ended: bool = False


class _Cluster:
    def __init__(self, remaining: int | None) -> None:
        self.remaining = remaining  # payload bytes left, for a cluster of known size
        self.timecode: int | None = None
        self.blocks: list[mkv.SimpleBlock] = []
        self.size = 0


class _MkvStream:
    """Incremental Matroska parser: calls back when a cluster's timecode is known and when a cluster is complete."""

    def __init__(self, record: Connection, on_timecode: Any, on_cluster: Any) -> None:
        self.data = b""
        self.level = "top"
        self.cluster: _Cluster | None = None
        self.record = record
        self.on_timecode = on_timecode
        self.on_cluster = on_cluster

    def feed(self, data: bytes) -> None:
        self.data += data
        while self._step():
            pass

    def end(self) -> None:
        if self.data:
            raise ValueError(f"{len(self.data)} bytes of an incomplete MKV element at the end of the body")
        self._close_cluster()

    def _close_cluster(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            self.level = "segment"
            self.on_cluster(cluster)

    def _step(self) -> bool:
        found = mkv.read_element_header(self.data, 0)
        if found is None:
            return False
        element_id, size, header_length = found
        if self.level == "top":
            if element_id == mkv.SEGMENT:
                self.record.header_elements.append(element_id)
                self.data, self.level = self.data[header_length:], "segment"
                return True
            if element_id != mkv.EBML:
                raise ValueError(f"MKV stream starts with element {element_id:#x}, not an EBML header")
        if element_id in (mkv.EBML, mkv.SEGMENT) and self.level != "top":
            raise ValueError("a second EBML header or Segment in one PutMedia body")
        if element_id == mkv.CLUSTER:
            self._close_cluster()
            self.cluster, self.level = _Cluster(size), "cluster"
            self.cluster.size = header_length
            self.data = self.data[header_length:]
            return True
        if self.level == "cluster" and element_id in mkv.SEGMENT_CHILDREN:
            self._close_cluster()  # an unknown-size cluster ends where a Segment-level element begins
            return True
        if size is None:
            raise ValueError(f"element {element_id:#x} of unknown size where only clusters may have one")
        if len(self.data) < header_length + size:
            return False
        payload = self.data[header_length : header_length + size]
        self.data = self.data[header_length + size :]
        if self.level == "cluster" and self.cluster is not None:
            self._cluster_child(element_id, payload, header_length + size)
        else:
            self.record.header_elements.append(element_id)
            if element_id == mkv.TRACKS:
                self._tracks(payload)
        return True

    def _cluster_child(self, element_id: int, payload: bytes, length: int) -> None:
        cluster = self.cluster
        assert cluster is not None
        cluster.size += length
        if element_id == mkv.TIMESTAMP:
            cluster.timecode = int.from_bytes(payload, "big")
            self.on_timecode(cluster.timecode)
        elif element_id == mkv.SIMPLE_BLOCK:
            cluster.blocks.append(mkv.read_simple_block(payload))
        if cluster.remaining is not None:
            cluster.remaining -= length
            if cluster.remaining <= 0:
                self._close_cluster()

    def _tracks(self, payload: bytes) -> None:
        for entry_id, start, end in mkv.iter_elements(payload):
            if entry_id == mkv.TRACK_ENTRY:
                for child_id, child_start, child_end in mkv.iter_elements(payload, start, end):
                    if child_id == 0x86:  # CodecID
                        self.record.codec_ids.append(payload[child_start:child_end].decode("ascii"))


class KvsServer:
    """The fake service; `url` is both its control-plane endpoint and the data endpoint it hands out."""

    def __init__(
        self,
        *,
        stream_name: str,
        access_key: str = "AKIDKVSTEST",
        secret_key: str = "kvs-test-secret",
        region: str = "us-east-1",
        persist_delay_s: float = 0.0,
        error_at: dict[int, int] | None = None,
        drop_at: set[int] | None = None,
    ) -> None:
        self.stream_name = stream_name
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.persist_delay_s = persist_delay_s
        self.error_at = dict(error_at or {})
        self.drop_at = set(drop_at or ())
        self.persisted: list[StoredFragment] = []
        self.connections: list[Connection] = []
        self.refusals: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._ordinal = 0
        self._active = False
        self._sockets: list[socket.socket] = []
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="kvs-server", daemon=True)

    def __enter__(self) -> KvsServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._http.shutdown()
        for open_socket in self._sockets:
            with contextlib.suppress(OSError):
                open_socket.shutdown(socket.SHUT_RDWR)
        self._http.server_close()

    def client(self, *, secret_key: str | None = None) -> Any:
        """A boto3 kinesisvideo client for this server (GetDataEndpoint)."""
        return boto3.client(
            "kinesisvideo",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
        )

    def credentials(self, *, secret_key: str | None = None) -> Credentials:
        return Credentials(self.access_key, secret_key or self.secret_key)

    def verify(self, method: str, path: str, headers: Any, body: bytes) -> str | None:
        """None if the request carries a valid SigV4 signature for this server, else why not."""
        match = _AUTHORIZATION.fullmatch(headers.get("Authorization", ""))
        if match is None:
            return "missing or malformed Authorization header"
        if match["key"] != self.access_key:
            return f"unknown access key {match['key']}"
        if match["region"] != self.region or match["service"] != "kinesisvideo":
            return f"credential scope {match['region']}/{match['service']}, expected {self.region}/kinesisvideo"
        amz_date = headers.get("X-Amz-Date", "")
        if amz_date[:8] != match["date"]:
            return f"X-Amz-Date {amz_date!r} does not match the credential scope's date {match['date']}"
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        if abs((datetime.now(UTC) - signed_at).total_seconds()) > _MAX_CLOCK_SKEW_S:
            return f"X-Amz-Date {amz_date} is too far from now"
        names = match["signed"].split(";")
        required = {"host", "x-amz-date"} | {name.lower() for name in headers if name.lower().startswith("x-amzn-")}
        if missing := sorted(required - set(names)):
            return f"headers not signed: {missing}"
        if any(headers.get(name) is None for name in names):
            return f"signed headers missing from the request: {names}"
        request = AWSRequest(
            method=method,
            url=f"http://{headers['Host']}{path}",
            headers={name: headers[name] for name in names},
            data=body,
        )
        request.context["timestamp"] = amz_date
        signer = SigV4Auth(self.credentials(), "kinesisvideo", self.region)
        if signer.signed_headers(signer.headers_to_sign(request)) != match["signed"]:
            return "the signed header list is not what SigV4 signs for these headers"
        expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
        if not hmac.compare_digest(expected, match["signature"]):
            return "The request signature we calculated does not match the signature you provided"
        return None

    def next_ordinal(self) -> int:
        with self._lock:
            self._ordinal += 1
            return self._ordinal - 1


def _handler(server: KvsServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any], error_type: str = "") -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if error_type:
                self.send_header("x-amzn-ErrorType", error_type)
                server.refusals.append((status, error_type))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path == "/getDataEndpoint":
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if (problem := server.verify("POST", self.path, self.headers, body)) is not None:
                    self._json(403, {"message": problem}, "NotAuthorizedException")
                elif json.loads(body).get("StreamName") != server.stream_name:
                    self._json(404, {"message": "stream not found"}, "ResourceNotFoundException")
                else:
                    self._json(200, {"DataEndpoint": server.url})
            elif self.path == "/putMedia":
                self.close_connection = True
                self._put_media()
            else:
                self._json(404, {"message": f"no such API {self.path}"}, "NotFoundException")

        def _refuse(self, record: Connection, status: int, message: str, error_type: str) -> None:
            """Answer an error, then read the body until the client hangs up (closing on unread data would RST)."""
            record.status = status
            self._json(status, {"message": message}, error_type)
            self.connection.settimeout(5)
            try:
                while self.rfile.read1(1 << 16):
                    pass
            except OSError:
                pass

        def _put_media(self) -> None:
            record = Connection(len(server.connections), {name.lower(): value for name, value in self.headers.items()})
            server.connections.append(record)
            timecode_type = self.headers.get("x-amzn-fragment-timecode-type")
            start = self.headers.get("x-amzn-producer-start-timestamp", "")
            if (problem := server.verify("POST", self.path, self.headers, b"")) is not None:
                return self._refuse(record, 403, problem, "NotAuthorizedException")
            if self.headers.get("x-amzn-stream-name") != server.stream_name:
                return self._refuse(record, 404, "stream not found", "ResourceNotFoundException")
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "")
            if timecode_type not in ("ABSOLUTE", "RELATIVE") or not re.fullmatch(r"\d+\.\d{3}", start) or not chunked:
                return self._refuse(record, 400, "bad PutMedia headers", "InvalidArgumentException")
            with server._lock:
                busy, server._active = server._active, True
            if busy:
                return self._refuse(record, 400, "one connection per stream", "ConnectionLimitExceededException")
            start_ms = round(float(start) * 1000)
            record.status = 200
            server._sockets.append(self.connection)
            _PutMedia(server, self, record, absolute=timecode_type == "ABSOLUTE", start_ms=start_ms).run()

    return Handler


class _PutMedia:
    """One PutMedia request being served: the body parsed on the handler's thread, acks written on another."""

    def __init__(
        self,
        server: KvsServer,
        handler: http.server.BaseHTTPRequestHandler,
        record: Connection,
        *,
        absolute: bool,
        start_ms: int,
    ) -> None:
        self.server = server
        self.handler = handler
        self.record = record
        self.absolute = absolute
        self.start_ms = start_ms
        self.acks: queue.Queue[tuple[float, Any]] = queue.Queue()
        self.stopped = False  # after an injected fault: the rest of the body is read and ignored
        self.last_timecode = -1
        self.fragment_numbers = iter(range(10**20, 10**21))

    def run(self) -> None:
        handler = self.handler
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.flush()
        writer = threading.Thread(target=self._write_acks, name="kvs-server-acks", daemon=True)
        writer.start()
        stream = _MkvStream(self.record, self._buffering, self._complete)
        try:
            while (data := self._read_chunk()) is not None:
                if not self.stopped:
                    stream.feed(data)
            self.record.body_ended = True
            if not self.stopped:
                stream.end()
                self._finish("end")
        except (ValueError, OSError) as error:
            if not self.stopped:
                self._error(self.last_timecode, 4006 if isinstance(error, ValueError) else 4000)
        finally:
            self.record.body_ended = True
            if not self.stopped:
                self._finish("end")
            self.acks.put((0.0, "stop"))
            writer.join(10)

    def _read_chunk(self) -> bytes | None:
        line = self.handler.rfile.readline()
        if not line:
            raise OSError("the client closed the connection in the middle of the body")
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            self.handler.rfile.readline()
            return None
        data = self.handler.rfile.read(size)
        self.handler.rfile.read(2)
        return data

    def _ack(self, event: str, timecode: int, *, delay: float = 0.0, **extra: Any) -> None:
        body = {"EventType": event, "FragmentTimecode": timecode, "FragmentNumber": str(next(self.fragment_numbers))}
        self.acks.put((time.monotonic() + delay, {**body, **extra}))

    def _buffering(self, timecode: int) -> None:
        self._ack("BUFFERING", timecode)

    def _finish(self, how: str) -> None:
        """Stop serving: no longer the stream's connection; the response ends ("end") or is cut ("drop")."""
        self.stopped = True
        with self.server._lock:
            self.server._active = False
        self.acks.put((0.0, how))

    def _error(self, timecode: int, code: int) -> None:
        self._ack("ERROR", timecode, ErrorId=code)
        self._finish("end")

    def _complete(self, cluster: _Cluster) -> None:
        ordinal = self.server.next_ordinal()
        timecode = -1 if cluster.timecode is None else cluster.timecode
        self.record.fragments.append(timecode)
        if ordinal in self.server.drop_at:
            return self._finish("drop")
        if ordinal in self.server.error_at:
            return self._error(timecode, self.server.error_at[ordinal])
        tracks = {block.track for block in cluster.blocks}
        span = max((block.relative_ms for block in cluster.blocks), default=0)
        if cluster.timecode is None or tracks != {mkv.VIDEO_TRACK, mkv.AUDIO_TRACK}:
            return self._error(timecode, 4011)
        if timecode <= self.last_timecode:
            return self._error(timecode, 4004)
        if span > 10_000:
            return self._error(timecode, 4002)
        self.last_timecode = timecode
        producer_ms = timecode if self.absolute else self.start_ms + timecode
        self.server.persisted.append(
            StoredFragment(timecode, producer_ms, self.record.number, cluster.size, cluster.blocks)
        )
        self._ack("RECEIVED", timecode)
        self._ack("PERSISTED", timecode, delay=self.server.persist_delay_s)

    def _write_acks(self) -> None:
        wfile = self.handler.wfile
        try:
            while True:
                due, item = self.acks.get()
                if item == "stop":
                    return
                if item == "drop":
                    self.handler.connection.shutdown(socket.SHUT_WR)
                    return
                if item == "end":
                    wfile.write(b"0\r\n\r\n")
                    wfile.flush()
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                text = (json.dumps(item) + "\n").encode()
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                wfile.flush()
                if not self.record.body_ended:
                    self.record.acks_while_receiving += 1
        except OSError:
            return
