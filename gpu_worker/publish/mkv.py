"""Matroska for live ingest: a stream header from our init segment and one Cluster per fMP4 fragment.

Kinesis Video Streams takes only Matroska, and maps each Cluster to one of its fragments, which must start with a
key frame and hold a frame of every track. So a cluster here is exactly one of our fragments, its samples copied
unchanged (H.264 stays in AVCC form, length-prefixed NAL units as in the mp4 samples, with the avcC record as
CodecPrivate; AAC stays raw with the AudioSpecificConfig as CodecPrivate), and its first SimpleBlock is always the
video key frame; the other blocks follow interleaved by timestamp. FFmpeg's own muxer may open a cluster with the
audio packet that shares the key frame's timestamp, which KVS would take as a fragment not starting on a key frame:
that is why clusters are written here by hand, as mp4.py writes the fMP4 boxes.

The Segment has unknown size (a live stream has no end to point at); clusters may have a known size or not.
Timestamps are milliseconds (TimestampScale 1 ms): a cluster's Timestamp is `origin_ms` + its key frame's
presentation time, so with origin = the producer start time the timecodes are absolute and identical whichever
connection or process sends the cluster. Also here: the few EBML readers the tests and the test server need.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from monologue.mp4.fragments import Fragment, Movie, Track

EBML = 0x1A45DFA3
SEGMENT = 0x18538067
INFO = 0x1549A966
TRACKS = 0x1654AE6B
TRACK_ENTRY = 0xAE
CLUSTER = 0x1F43B675
TIMESTAMP = 0xE7
SIMPLE_BLOCK = 0xA3
_EBML_VERSION, _EBML_READ_VERSION, _EBML_MAX_ID_LENGTH, _EBML_MAX_SIZE_LENGTH = 0x4286, 0x42F7, 0x42F2, 0x42F3
_DOC_TYPE, _DOC_TYPE_VERSION, _DOC_TYPE_READ_VERSION = 0x4282, 0x4287, 0x4285
_TIMESTAMP_SCALE, _MUXING_APP, _WRITING_APP = 0x2AD7B1, 0x4D80, 0x5741
_TRACK_NUMBER, _TRACK_UID, _TRACK_TYPE, _FLAG_LACING = 0xD7, 0x73C5, 0x83, 0x9C
_CODEC_ID, _CODEC_PRIVATE = 0x86, 0x63A2
_VIDEO, _PIXEL_WIDTH, _PIXEL_HEIGHT = 0xE0, 0xB0, 0xBA
_AUDIO, _SAMPLING_FREQUENCY, _CHANNELS = 0xE1, 0xB5, 0x9F
UNKNOWN_SIZE = b"\x01\xff\xff\xff\xff\xff\xff\xff"  # an 8-byte size with every value bit set: "unknown" (live)
# Matroska track numbers: KVS plays (console, HLS) H.264 on track 1 and AAC on track 2.
VIDEO_TRACK = 1
AUDIO_TRACK = 2
_CODEC_IDS = {"avc1": "V_MPEG4/ISO/AVC", "avc3": "V_MPEG4/ISO/AVC", "mp4a": "A_AAC"}
_KEYFRAME = 0x80
_APP_NAME = b"monologue"  # MuxingApp and WritingApp are mandatory; a fixed name keeps the bytes parameter-only


def _size(length: int) -> bytes:
    """An EBML data size, in as few bytes as hold it (the all-ones value of each width means "unknown")."""
    for width in range(1, 9):
        if length < (1 << (7 * width)) - 1:
            return (length | (1 << (7 * width))).to_bytes(width, "big")
    raise ValueError(f"EBML element of {length} bytes is too large")


def element(element_id: int, *payload: bytes) -> bytes:
    """An EBML element: its ID (marker bits included, as the spec writes them), size and payload."""
    body = b"".join(payload)
    return element_id.to_bytes((element_id.bit_length() + 7) // 8, "big") + _size(len(body)) + body


def _uint(element_id: int, value: int) -> bytes:
    return element(element_id, value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big"))


def _string(element_id: int, value: str) -> bytes:
    return element(element_id, value.encode("ascii"))


def _codec_id(track: Track) -> str:
    if track.codec not in _CODEC_IDS:
        raise ValueError(f"track {track.track_id} has codec {track.codec!r}; Matroska mapping exists for {_CODEC_IDS}")
    return _CODEC_IDS[track.codec]


def header(movie: Movie) -> bytes:
    """EBML header, the start of an unknown-size Segment, Info (1 ms timestamps) and Tracks (video 1, audio 2)."""
    ebml = element(
        EBML,
        _uint(_EBML_VERSION, 1),
        _uint(_EBML_READ_VERSION, 1),
        _uint(_EBML_MAX_ID_LENGTH, 4),
        _uint(_EBML_MAX_SIZE_LENGTH, 8),
        _string(_DOC_TYPE, "matroska"),
        _uint(_DOC_TYPE_VERSION, 2),  # SimpleBlock is a version 2 element
        _uint(_DOC_TYPE_READ_VERSION, 2),
    )
    info = element(
        INFO, _uint(_TIMESTAMP_SCALE, 1_000_000), element(_MUXING_APP, _APP_NAME), element(_WRITING_APP, _APP_NAME)
    )
    video = movie.track("video")
    entries = [
        element(
            TRACK_ENTRY,
            _uint(_TRACK_NUMBER, VIDEO_TRACK),
            _uint(_TRACK_UID, VIDEO_TRACK),
            _uint(_TRACK_TYPE, 1),
            _uint(_FLAG_LACING, 0),
            _string(_CODEC_ID, _codec_id(video)),
            element(_CODEC_PRIVATE, video.codec_private),
            element(_VIDEO, _uint(_PIXEL_WIDTH, video.width), _uint(_PIXEL_HEIGHT, video.height)),
        )
    ]
    audio = [track for track in movie.tracks.values() if track.kind == "audio"]
    if len(audio) > 1:
        raise ValueError(f"init segment has {len(audio)} audio tracks; one at most is carried")
    for track in audio:
        entries.append(
            element(
                TRACK_ENTRY,
                _uint(_TRACK_NUMBER, AUDIO_TRACK),
                _uint(_TRACK_UID, AUDIO_TRACK),
                _uint(_TRACK_TYPE, 2),
                _uint(_FLAG_LACING, 0),
                _string(_CODEC_ID, _codec_id(track)),
                element(_CODEC_PRIVATE, track.codec_private),
                element(
                    _AUDIO,
                    element(_SAMPLING_FREQUENCY, struct.pack(">d", float(track.sample_rate))),
                    _uint(_CHANNELS, track.channels),
                ),
            )
        )
    segment_start = SEGMENT.to_bytes(4, "big") + UNKNOWN_SIZE
    return ebml + segment_start + info + element(TRACKS, *entries)


def _milliseconds(ticks: int, timescale: int) -> int:
    """ticks / timescale seconds in whole milliseconds, truncated (exact integer maths)."""
    return ticks * 1000 // timescale


@dataclass(frozen=True)
class Cluster:
    """One Matroska Cluster: its bytes, its Timestamp (ms) and its duration: up to the end of its last video frame.

    (The audio packets of a fragment start inside its video's span but the last one may end up to 21 ms later.)
    """

    timecode: int
    duration_ms: int
    data: bytes


def cluster(movie: Movie, fragment: Fragment, *, origin_ms: int, known_size: bool = False) -> Cluster:
    """The Cluster for one fragment: Timestamp = origin_ms + key frame time, key frame first, then by timestamp.

    Times are truncated to milliseconds, and a block starting in the last millisecond of the fragment's video (an
    audio packet can start 1/3 ms before the next key frame at 24 fps) is moved back into the previous one: the
    next fragment's key frame has that millisecond, and KVS wants every frame of a fragment before the next one's.
    ValueError if the fragment's first video sample is not a key frame (the cluster could not be decoded alone).
    """
    video = movie.track("video")
    video_samples = fragment.samples.get(video.track_id, [])
    if not video_samples or not video_samples[0].keyframe:
        raise ValueError("a cluster must start with a video key frame; the fragment's first video sample is not one")
    last = video_samples[-1]
    end_ms = origin_ms + _milliseconds(last.decode_time + last.composition_offset + last.duration, video.timescale)
    # (time ms, track number, position, keyframe, data); the position keeps equal timestamps in decode order.
    blocks: list[tuple[int, int, int, bool, bytes]] = []
    for track in movie.tracks.values():
        number = VIDEO_TRACK if track.kind == "video" else AUDIO_TRACK
        for position, sample in enumerate(fragment.samples.get(track.track_id, [])):
            time_ms = origin_ms + _milliseconds(sample.decode_time + sample.composition_offset, track.timescale)
            blocks.append((min(time_ms, end_ms - 1), number, position, sample.keyframe, sample.data))
    first = next(block for block in blocks if block[1] == VIDEO_TRACK and block[2] == 0)
    rest = sorted(block for block in blocks if block is not first)
    timecode = first[0]
    payload = [_uint(TIMESTAMP, timecode)]
    for time_ms, number, _, keyframe, data in [first, *rest]:
        relative = time_ms - timecode
        if not -32768 <= relative <= 32767:
            raise ValueError(f"block at {time_ms} ms is {relative} ms from its cluster's start, past int16")
        flags = _KEYFRAME if keyframe else 0
        payload.append(element(SIMPLE_BLOCK, _size(number), struct.pack(">hB", relative, flags), data))
    body = b"".join(payload)
    size = _size(len(body)) if known_size else UNKNOWN_SIZE
    return Cluster(timecode, end_ms - timecode, CLUSTER.to_bytes(4, "big") + size + body)


# --- reading (tests, the test server) --------------------------------------------------------------------------


def read_vint(data: bytes, position: int) -> tuple[int, int] | None:
    """(value with the length marker removed, length) of the EBML variable-size integer at `position`.

    None if `data` ends before it does; the all-ones value ("unknown") is returned as -1.
    """
    if position >= len(data):
        return None
    first = data[position]
    if first == 0:
        raise ValueError(f"invalid EBML variable-size integer at offset {position}")
    length = 9 - first.bit_length()
    if position + length > len(data):
        return None
    value = int.from_bytes(data[position : position + length], "big") & ((1 << (7 * length)) - 1)
    return (-1 if value == (1 << (7 * length)) - 1 else value), length


def read_element_header(data: bytes, position: int) -> tuple[int, int | None, int] | None:
    """(element ID, payload size or None if unknown, header length) at `position`; None if `data` ends first."""
    if position >= len(data):
        return None
    id_length = 9 - data[position].bit_length()
    if id_length > 4 or position + id_length > len(data):
        if id_length > 4:
            raise ValueError(f"invalid EBML element ID at offset {position}")
        return None
    element_id = int.from_bytes(data[position : position + id_length], "big")
    size = read_vint(data, position + id_length)
    if size is None:
        return None
    value, size_length = size
    return element_id, (None if value == -1 else value), id_length + size_length


# Top-level children of a Segment: where one begins, an unknown-size Cluster before it has ended.
SEGMENT_CHILDREN = frozenset({INFO, TRACKS, CLUSTER, 0x114D9B74, 0x1254C367, 0x1C53BB6B, 0x1043A770, 0x1941A469})


def iter_elements(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(ID, payload start, payload end) of the elements side by side in data[start:end].

    An unknown-size Cluster ends where a Segment-level element begins; any other unknown size runs to the end.
    """
    limit = len(data) if end is None else end
    position = start
    while position < limit:
        found = read_element_header(data, position)
        if found is None:
            raise ValueError(f"truncated EBML element at offset {position}")
        element_id, size, header_length = found
        payload_start = position + header_length
        payload_end = limit if size is None else payload_start + size
        if size is None and element_id == CLUSTER:
            payload_end = next(
                (
                    child_start
                    for child_start, child_id in _positions(data, payload_start, limit)
                    if child_id in SEGMENT_CHILDREN
                ),
                limit,
            )
        if payload_end > limit:
            raise ValueError(f"EBML element {element_id:#x} at offset {position} runs past the end ({limit})")
        yield element_id, payload_start, payload_end
        position = payload_end


def _positions(data: bytes, start: int, limit: int) -> Iterator[tuple[int, int]]:
    """(offset, ID) of the known-size elements from `start`, until one of unknown size or the limit."""
    position = start
    while position < limit:
        found = read_element_header(data, position)
        if found is None or found[1] is None:
            if found is not None:
                yield position, found[0]
            return
        yield position, found[0]
        position += found[2] + found[1]


@dataclass(frozen=True)
class SimpleBlock:
    """A SimpleBlock's fields: track number, timestamp relative to its cluster (ms), key frame flag, frame data."""

    track: int
    relative_ms: int
    keyframe: bool
    data: bytes


def read_simple_block(payload: bytes) -> SimpleBlock:
    """Parse a SimpleBlock payload (no lacing: one frame per block, as written here)."""
    found = read_vint(payload, 0)
    if found is None:
        raise ValueError("truncated SimpleBlock")
    track, length = found
    relative, flags = struct.unpack_from(">hB", payload, length)
    if flags & 0x06:
        raise ValueError(f"SimpleBlock on track {track} uses lacing (flags {flags:#x}), which is not read here")
    return SimpleBlock(track, relative, bool(flags & _KEYFRAME), payload[length + 3 :])
