"""The progressive MP4 (`monologue/mp4/progressive.py`) is the fragmented one remuxed: its index first, then the
very same samples, byte for byte, with the same timestamps; it plays without warnings."""

from __future__ import annotations

import io
from pathlib import Path

import av
import pytest

from gpu_worker.publish import StreamFormat, concat, init_segment, probe_warnings
from monologue.mp4.boxes import iter_boxes
from monologue.mp4.progressive import remux
from tests.gpu_worker.test_publish import FPS, MemoryAudio, read_index, speech_like, starts, write_segment

FORMAT = StreamFormat(width=128, height=96, fps=FPS)
LENGTHS = [40, 4, 40, 4, 13]  # N0 I0 N1 I1 N2, the last one short


def _packets(path: Path) -> list[tuple[str, int | None, int | None, bool, bytes]]:
    """Every packet of every track in decode order: (track kind, pts, dts, keyframe, bytes)."""
    with av.open(str(path)) as container:
        return [
            (packet.stream.type, packet.pts, packet.dts, packet.is_keyframe, bytes(packet))
            for packet in container.demux()
            if packet.size
        ]


@pytest.fixture(scope="module")
def fragmented(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fragmented")
    audio = MemoryAudio(speech_like(sum(LENGTHS) / FPS))
    paths = [
        write_segment(FORMAT, audio, start, n, folder / f"seg-{i}.m4s")
        for i, (start, n) in enumerate(zip(starts(LENGTHS), LENGTHS, strict=True))
    ]
    (folder / "init.mp4").write_bytes(init_segment(FORMAT))
    concat(folder / "init.mp4", paths, folder / "final.mp4")
    return folder / "final.mp4"


def test_the_progressive_mp4_has_its_index_first_and_the_same_samples(fragmented: Path, tmp_path: Path) -> None:
    data = fragmented.read_bytes()
    out = io.BytesIO()
    size = remux(lambda start, end: data[start:end], len(data), out)
    progressive = tmp_path / "progressive.mp4"
    progressive.write_bytes(out.getvalue())
    assert size == len(out.getvalue())
    assert [found.kind for found in iter_boxes(out.getvalue())] == [b"ftyp", b"moov", b"mdat"]  # no moof: no fragments
    assert [found.kind for found in iter_boxes(data)][:3] == [b"ftyp", b"moov", b"moof"]
    # Stream-copied: the same packets, bytes and timestamps, in the same order; no re-encoding.
    assert _packets(progressive) == _packets(fragmented)
    assert probe_warnings(progressive) == []
    with av.open(str(progressive)) as container:
        video = container.streams.video[0]
        assert video.frames == sum(LENGTHS)  # from the sample table
        assert [read_index(frame.to_ndarray(format="rgb24")) for frame in container.decode(video)] == list(
            range(sum(LENGTHS))
        )
        assert abs(float(container.duration or 0) / 1e6 - sum(LENGTHS) / FPS) < 0.05


def test_a_file_that_is_not_fragmented_is_refused(fragmented: Path) -> None:
    data = fragmented.read_bytes()
    out = io.BytesIO()
    remux(lambda start, end: data[start:end], len(data), out)
    again = out.getvalue()
    with pytest.raises(ValueError, match="no fragments"):
        remux(lambda start, end: again[start:end], len(again), io.BytesIO())
    with pytest.raises(ValueError, match="past the end"):
        remux(lambda start, end: data[start:end], len(data) - 5, io.BytesIO())
