"""The Kinesis Video Streams sink against the local PutMedia server (tests/kvs_server.py), with faults injected."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu_worker.publish import SegmentWriter, StreamFormat, init_segment, mkv
from gpu_worker.publish.kvs import KinesisVideoSink
from gpu_worker.publish.kvs_gstreamer import GStreamerKvsSink
from gpu_worker.publish.sinks import SinkError
from monologue.settings import SinkSettings
from monologue.sink_policy import SinkRefused
from tests.gpu_worker.test_publish import MemoryAudio, indexed_frames, speech_like, starts
from tests.kvs_server import KvsServer

pytestmark = pytest.mark.timeout(30)

FPS = 25
FORMAT = StreamFormat(width=64, height=48, fps=FPS)
LENGTHS = [10, 10, 4, 10, 13, 10, 10, 7]
STREAM = "monologue-test"
START_MS = 1_700_000_000_123
EXPECTED_TIMECODES = [START_MS + first * 1000 // FPS for first in starts(LENGTHS)]


@pytest.fixture(scope="module")
def segments() -> tuple[bytes, list[bytes]]:
    audio = MemoryAudio(speech_like(sum(LENGTHS) / FPS))
    made = []
    for first, count in zip(starts(LENGTHS), LENGTHS, strict=True):
        writer = SegmentWriter(FORMAT, first_frame=first, audio=audio)
        writer.write(indexed_frames(first, count, FORMAT.width, FORMAT.height))
        made.append(writer.finish())
    return init_segment(FORMAT), made


def make_sink(server: KvsServer, **options: Any) -> KinesisVideoSink:
    settings: dict[str, Any] = {
        "region": server.region,
        "endpoint_url": server.url,
        "allowed": SinkSettings(kvs_endpoints=[server.url]),
        "client": server.client(),
        "credentials": server.credentials(),
        "producer_start_ms": START_MS,
        "retry_base_s": 0.01,
        "retry_max_s": 0.05,
        "min_connect_interval_s": 0.0,
        "ack_timeout_s": 5.0,
        "finish_timeout_s": 20.0,
    }
    return KinesisVideoSink(STREAM, **{**settings, **options})


def send_all(server: KvsServer, segments: tuple[bytes, list[bytes]], **options: Any) -> KinesisVideoSink:
    init, fragments = segments
    sink = make_sink(server, **options)
    sink.start(init, 0)
    for index, fragment in enumerate(fragments):
        sink.put(index, fragment)
    sink.finish(ended=True)
    return sink


def assert_whole_timeline_once(server: KvsServer) -> None:
    assert [fragment.timecode for fragment in server.persisted] == EXPECTED_TIMECODES
    for fragment, count in zip(server.persisted, LENGTHS, strict=True):
        assert fragment.starts_with_video_keyframe
        assert fragment.tracks[mkv.VIDEO_TRACK] == count and fragment.tracks[mkv.AUDIO_TRACK] > 0
        assert fragment.producer_timestamp_ms == fragment.timecode


def assert_each_connection_sent_the_header(server: KvsServer) -> None:
    for connection in (connection for connection in server.connections if connection.status == 200):
        assert connection.header_elements[:4] == [mkv.EBML, mkv.SEGMENT, mkv.INFO, mkv.TRACKS]
        assert connection.codec_ids == ["V_MPEG4/ISO/AVC", "A_AAC"]
        assert connection.headers["x-amzn-fragment-timecode-type"] == "ABSOLUTE"
        assert connection.headers["x-amzn-producer-start-timestamp"] == "1700000000.123"


def test_every_fragment_is_persisted_once_in_order_with_absolute_timecodes(
    segments: tuple[bytes, list[bytes]],
) -> None:
    with KvsServer(stream_name=STREAM) as server:
        sink = send_all(server, segments)
    assert_whole_timeline_once(server)
    assert_each_connection_sent_the_header(server)
    assert len(server.connections) == 1 and server.refusals == []
    assert sink.acknowledged() == len(LENGTHS)


def test_acknowledgements_are_read_while_the_body_is_still_being_sent(segments: tuple[bytes, list[bytes]]) -> None:
    init, fragments = segments
    with KvsServer(stream_name=STREAM) as server:
        sink = make_sink(server)
        sink.start(init, 0)
        for index, fragment in enumerate(fragments):
            sink.put(index, fragment)
            # An unknown-size cluster is complete once the next one starts: all but the last put are durable.
            deadline = time.monotonic() + 5
            while sink.acknowledged() < index and time.monotonic() < deadline:
                time.sleep(0.005)
            assert sink.acknowledged() == index
        sink.finish(ended=True)
    assert server.connections[0].acks_while_receiving >= 3 * (len(LENGTHS) - 1)
    assert sink.acknowledged() == len(LENGTHS)
    assert_whole_timeline_once(server)


def test_error_acks_and_dropped_connections_lose_and_repeat_nothing(segments: tuple[bytes, list[bytes]]) -> None:
    with KvsServer(stream_name=STREAM, error_at={1: 5000, 4: 4000}, drop_at={6, 7}) as server:
        sink = send_all(server, segments)
    assert_whole_timeline_once(server)
    assert_each_connection_sent_the_header(server)
    assert len(server.connections) == 5 and server.refusals == []
    assert sink.acknowledged() == len(LENGTHS)


def test_rotation_waits_for_outstanding_acks_then_reconnects_with_the_header(
    segments: tuple[bytes, list[bytes]],
) -> None:
    """rotate_after_s=0: every connection ends after one fragment, its (slow) PERSISTED read before the next opens."""
    with KvsServer(stream_name=STREAM, persist_delay_s=0.05) as server:
        sink = send_all(server, segments, rotate_after_s=0.0)
    assert_whole_timeline_once(server)
    assert_each_connection_sent_the_header(server)
    assert [connection.fragments for connection in server.connections] == [[tc] for tc in EXPECTED_TIMECODES]
    assert server.refusals == []  # never two connections at once
    assert sink.acknowledged() == len(LENGTHS)


def test_an_idle_connection_is_ended_cleanly_before_the_service_would_drop_it(
    segments: tuple[bytes, list[bytes]],
) -> None:
    init, fragments = segments
    with KvsServer(stream_name=STREAM) as server:
        sink = make_sink(server, idle_close_s=0.2)
        sink.start(init, 0)
        for index, fragment in enumerate(fragments):
            if index == 4:
                time.sleep(0.5)
                assert sink.acknowledged() == 4  # ending the body completed the last cluster
            sink.put(index, fragment)
        sink.finish(ended=True)
    assert len(server.connections) == 2 and all(connection.body_ended for connection in server.connections)
    assert_whole_timeline_once(server)
    assert_each_connection_sent_the_header(server)


def test_a_second_connection_to_the_stream_is_retried_until_the_first_one_closes(
    segments: tuple[bytes, list[bytes]],
) -> None:
    """KVS allows one PutMedia connection per stream; its refusal (400 ConnectionLimitExceeded) is retried."""
    init, fragments = segments
    with KvsServer(stream_name=STREAM) as server:
        first = make_sink(server)
        first.start(init, 0)
        for index in range(3):
            first.put(index, fragments[index])
        second = make_sink(server, max_attempts=1000)
        second.start(init, 3)
        for index in range(3, len(fragments)):
            second.put(index, fragments[index])
        deadline = time.monotonic() + 5
        while len(server.refusals) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        first.finish(ended=False)
        second.finish(ended=True)
    assert len(server.refusals) >= 2 and set(server.refusals) == {(400, "ConnectionLimitExceededException")}
    assert_whole_timeline_once(server)
    assert_each_connection_sent_the_header(server)
    assert (first.acknowledged(), second.acknowledged()) == (3, len(LENGTHS))


def test_a_resumed_sink_continues_the_timeline(segments: tuple[bytes, list[bytes]]) -> None:
    init, fragments = segments
    with KvsServer(stream_name=STREAM) as server:
        first = make_sink(server, producer_start_ms=None)
        first.start(init, 0)
        for index in range(3):
            first.put(index, fragments[index])
        first.finish(ended=False)
        assert first.acknowledged() == 3 and first.producer_start_ms is not None

        with pytest.raises(ValueError, match="original producer_start_ms"):
            make_sink(server, producer_start_ms=None).start(init, 3)
        second = make_sink(server, producer_start_ms=first.producer_start_ms)
        second.start(init, 3)
        with pytest.raises(ValueError, match="out of order: the next segment must be 3"):
            second.put(4, fragments[4])
        for index in range(3, len(fragments)):
            second.put(index, fragments[index])
        second.finish(ended=True)
    assert second.acknowledged() == len(LENGTHS)
    origin = first.producer_start_ms
    assert [fragment.timecode for fragment in server.persisted] == [
        origin + first_frame * 1000 // FPS for first_frame in starts(LENGTHS)
    ]


def test_a_permanent_error_ack_fails_the_sink_with_its_code(segments: tuple[bytes, list[bytes]]) -> None:
    refused = pytest.raises(SinkError, match=r"ERROR 4006 for segment 0.*which retrying cannot fix")
    with KvsServer(stream_name=STREAM, error_at={0: 4006}) as server, refused:
        send_all(server, segments)
    assert len(server.connections) == 1  # not retried


def test_a_bad_signature_is_refused_with_403_and_reported(segments: tuple[bytes, list[bytes]]) -> None:
    with KvsServer(stream_name=STREAM) as server:
        with pytest.raises(SinkError, match=r"HTTP 403 NotAuthorizedException: The request signature"):
            send_all(server, segments, credentials=server.credentials(secret_key="wrong"))
        assert server.refusals == [(403, "NotAuthorizedException")]  # not retried
        with pytest.raises(SinkError, match="GetDataEndpoint for stream monologue-test failed"):
            make_sink(server, client=server.client(secret_key="wrong")).start(segments[0], 0)


def test_fragments_longer_than_ten_seconds_are_refused() -> None:
    fmt = StreamFormat(width=32, height=32, fps=FPS)
    audio = MemoryAudio(speech_like(10.2))

    def segment(frames: int) -> bytes:
        writer = SegmentWriter(fmt, first_frame=0, audio=audio)
        writer.write(indexed_frames(0, frames, fmt.width, fmt.height))
        return writer.finish()

    with KvsServer(stream_name=STREAM) as server:
        sink = make_sink(server)
        sink.start(init_segment(fmt), 0)
        with pytest.raises(ValueError, match=r"segment 0 lasts 10\.040 s; KVS refuses fragments over 10 s"):
            sink.put(0, segment(251))
        sink.put(0, segment(250))  # exactly 10 s of video is allowed
        sink.finish(ended=True)
    assert [fragment.tracks[mkv.VIDEO_TRACK] for fragment in server.persisted] == [250]


def test_the_gstreamer_sink_says_why_it_cannot_be_used() -> None:
    with pytest.raises(SinkError, match="kvssink"):
        GStreamerKvsSink(STREAM)


class FixedDataEndpoint:
    """A control plane's client that hands out `data_endpoint` for any stream (as a compromised or misconfigured
    control plane could)."""

    def __init__(self, data_endpoint: str) -> None:
        self.data_endpoint = data_endpoint

    def get_data_endpoint(self, **_: Any) -> dict[str, str]:
        return {"DataEndpoint": self.data_endpoint}


def test_a_data_endpoint_outside_kvs_endpoints_is_refused_before_anything_is_sent(
    segments: tuple[bytes, list[bytes]],
) -> None:
    """The control plane the operator allowed names another server as the data endpoint: the sink refuses it
    for good (SinkRefused, not a SinkError to retry) and never connects there."""
    plane = "https://kvs-control.internal"
    with KvsServer(stream_name=STREAM) as elsewhere:
        refused = make_sink(
            elsewhere,
            endpoint_url=plane,
            client=FixedDataEndpoint(elsewhere.url),
            allowed=SinkSettings(kvs_endpoints=[plane]),
        )
        with pytest.raises(SinkRefused, match=r"not in MONOLOGUE_SINKS__KVS_ENDPOINTS"):
            refused.start(segments[0], 0)
        allowed = make_sink(
            elsewhere,
            endpoint_url=plane,
            client=FixedDataEndpoint(elsewhere.url),
            allowed=SinkSettings(kvs_endpoints=[plane, elsewhere.url]),
        )
        allowed.start(segments[0], 0)
        allowed.put(0, segments[1][0])
        allowed.finish(ended=True)
    assert len(elsewhere.connections) == 1  # the allowed sink's only: the refused one never connected
    assert allowed.acknowledged() == 1


def test_aws_must_hand_out_an_aws_data_endpoint(segments: tuple[bytes, list[bytes]]) -> None:
    """With no endpoint_url the control plane is AWS's: a data endpoint that is not an https host of the
    region's Kinesis Video domain (here, loopback) is refused."""
    with KvsServer(stream_name=STREAM) as server:
        sink = make_sink(server, endpoint_url=None, allowed=SinkSettings(kvs_endpoints=[server.url]))
        with pytest.raises(SinkRefused, match=r"not an AWS Kinesis Video endpoint of region us-east-1"):
            sink.start(segments[0], 0)
    assert server.connections == []
