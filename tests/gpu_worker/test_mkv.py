from __future__ import annotations

import io
import itertools
from dataclasses import replace
from pathlib import Path

import av
import pytest

from gpu_worker.publish import SegmentWriter, StreamFormat, audio_packet_range, init_segment, mkv, probe_warnings
from monologue.mp4.fragments import Fragment, Movie, Sample, Track, read_fragment, read_init
from tests.gpu_worker.test_publish import MemoryAudio, indexed_frames, read_index, speech_like, starts

FPS = 25
FORMAT = StreamFormat(width=128, height=96, fps=FPS)
LENGTHS = [20, 7, 33, 4]
ORIGIN_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def stream() -> tuple[Movie, list[Fragment]]:
    audio = MemoryAudio(speech_like(sum(LENGTHS) / FPS))
    movie = read_init(init_segment(FORMAT))
    fragments = []
    for first, count in zip(starts(LENGTHS), LENGTHS, strict=True):
        writer = SegmentWriter(FORMAT, first_frame=first, audio=audio)
        writer.write(indexed_frames(first, count))
        fragments.append(read_fragment(writer.finish(), movie))
    return movie, fragments


def mkv_stream(movie: Movie, fragments: list[Fragment], *, known_size: bool = False) -> bytes:
    clusters = [mkv.cluster(movie, fragment, origin_ms=ORIGIN_MS, known_size=known_size) for fragment in fragments]
    return mkv.header(movie) + b"".join(cluster.data for cluster in clusters)


def clusters_of(data: bytes) -> list[tuple[int, list[mkv.SimpleBlock]]]:
    """(Timestamp, blocks) of each cluster, walking the stream with our own EBML reader."""
    elements = list(mkv.iter_elements(data))
    assert [element_id for element_id, _, _ in elements] == [mkv.EBML, mkv.SEGMENT]
    _, segment_start, segment_end = elements[1]
    children = list(mkv.iter_elements(data, segment_start, segment_end))
    assert [element_id for element_id, _, _ in children[:2]] == [mkv.INFO, mkv.TRACKS]
    found = []
    for element_id, start, end in children[2:]:
        assert element_id == mkv.CLUSTER
        inner = list(mkv.iter_elements(data, start, end))
        assert inner[0][0] == mkv.TIMESTAMP, "a cluster's first child must be its Timestamp"
        timecode = int.from_bytes(data[inner[0][1] : inner[0][2]], "big")
        assert {element_id for element_id, _, _ in inner[1:]} == {mkv.SIMPLE_BLOCK}
        found.append((timecode, [mkv.read_simple_block(data[start:end]) for _, start, end in inner[1:]]))
    return found


def test_pyav_decodes_every_frame_and_audio_packet_of_the_stream(
    stream: tuple[Movie, list[Fragment]], tmp_path: Path
) -> None:
    movie, fragments = stream
    data = mkv_stream(movie, fragments)
    with av.open(io.BytesIO(data), mode="r", format="matroska") as container:
        indices = [read_index(frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)]
    assert indices == list(range(sum(LENGTHS)))
    with av.open(io.BytesIO(data), mode="r", format="matroska") as container:
        audio_frames = list(container.decode(audio=0))
    first_packet, end_packet = audio_packet_range(0, sum(LENGTHS), FPS, FORMAT.audio_rate)
    assert len(audio_frames) == end_packet - first_packet
    assert all(frame.samples == 1024 and frame.sample_rate == 48_000 for frame in audio_frames)
    (tmp_path / "stream.mkv").write_bytes(data)
    assert probe_warnings(tmp_path / "stream.mkv") == []


def test_every_cluster_opens_with_the_video_keyframe_then_blocks_by_time(stream: tuple[Movie, list[Fragment]]) -> None:
    """FFmpeg's Matroska muxer may open a cluster with audio; KVS needs each fragment to start on a key frame."""
    movie, fragments = stream
    clusters = clusters_of(mkv_stream(movie, fragments))
    assert [timecode for timecode, _ in clusters] == [ORIGIN_MS + first * 1000 // FPS for first in starts(LENGTHS)]
    for (_, blocks), count, fragment in zip(clusters, LENGTHS, fragments, strict=True):
        assert blocks[0].track == mkv.VIDEO_TRACK and blocks[0].keyframe and blocks[0].relative_ms == 0
        video = [block for block in blocks if block.track == mkv.VIDEO_TRACK]
        audio = [block for block in blocks if block.track == mkv.AUDIO_TRACK]
        assert len(video) == count and [block.keyframe for block in video[1:]] == [False] * (count - 1)
        assert len(audio) == len(fragment.samples[2]) > 0 and all(block.keyframe for block in audio)
        assert [block.relative_ms for block in blocks] == sorted(block.relative_ms for block in blocks)
        # samples are copied unchanged: H.264 in AVCC (length-prefixed) form, AAC raw
        assert [block.data for block in video] == [sample.data for sample in fragment.samples[1]]
        assert [block.data for block in audio] == [sample.data for sample in fragment.samples[2]]
    # Every block of a cluster comes before the next cluster's key frame.
    for (timecode, blocks), (next_timecode, _) in itertools.pairwise(clusters):
        assert timecode + max(block.relative_ms for block in blocks) < next_timecode
    # In the first cluster an audio packet shares the key frame's timestamp: the key frame still comes first.
    first_blocks = clusters[0][1]
    assert first_blocks[1].track == mkv.AUDIO_TRACK and first_blocks[1].relative_ms == 0


def test_clusters_of_known_size_read_and_decode_the_same(stream: tuple[Movie, list[Fragment]]) -> None:
    movie, fragments = stream
    unknown, known = mkv_stream(movie, fragments), mkv_stream(movie, fragments, known_size=True)
    assert mkv.UNKNOWN_SIZE in unknown and len(known) < len(unknown)
    assert clusters_of(known) == clusters_of(unknown)
    with av.open(io.BytesIO(known), mode="r", format="matroska") as container:
        assert sum(1 for _ in container.decode(video=0)) == sum(LENGTHS)


def test_the_header_declares_avc_and_aac_with_their_codec_private_data(stream: tuple[Movie, list[Fragment]]) -> None:
    movie, _ = stream
    with av.open(io.BytesIO(mkv_stream(movie, stream[1][:1])), mode="r", format="matroska") as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert (video.codec_context.name, video.width, video.height) == ("h264", 128, 96)
        assert bytes(video.codec_context.extradata or b"") == movie.track("video").codec_private
        assert (audio.codec_context.name, audio.rate, audio.channels) == ("aac", 48_000, 1)
        assert bytes(audio.codec_context.extradata or b"") == movie.track("audio").codec_private


def test_a_fragment_not_starting_with_a_keyframe_is_refused(stream: tuple[Movie, list[Fragment]]) -> None:
    movie, fragments = stream
    samples = dict(fragments[0].samples)
    samples[1] = samples[1][1:]
    with pytest.raises(ValueError, match="key frame"):
        mkv.cluster(movie, replace(fragments[0], samples=samples), origin_ms=0)


def test_no_block_takes_the_millisecond_of_the_next_clusters_key_frame() -> None:
    """At 24 fps, audio packet 166 starts at 3541.33 ms, 1/3 ms before frame 85 at 3541.67 ms: same millisecond."""
    movie = Movie(
        {
            1: Track(1, "video", "avc1", 24 * 512, b"", width=64, height=48),
            2: Track(2, "audio", "mp4a", 48_000, b"", sample_rate=48_000, channels=1),
        }
    )

    def fragment(first: int, count: int) -> Fragment:
        packets = range(*audio_packet_range(first, count, 24, 48_000))
        video = [Sample(b"v", frame * 512, 512, 0, frame == first) for frame in range(first, first + count)]
        audio = [Sample(b"a", packet * 1024, 1024, 0, True) for packet in packets]
        return Fragment(first + 1, {1: video, 2: audio})

    before, after = (mkv.cluster(movie, fragment(first, count), origin_ms=0) for first, count in ((0, 85), (85, 10)))
    (_, blocks), (next_timecode, _) = clusters_of(mkv.header(movie) + before.data + after.data)
    assert next_timecode == 3541 and before.duration_ms == 3541
    assert max(before.timecode + block.relative_ms for block in blocks) == 3540
