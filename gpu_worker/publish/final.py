"""The final MP4 (init segment + every fragment, streamed) and the decode check used as "ffprobe without warnings"."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import av

from monologue.mp4.boxes import read_box

from .mp4 import AUDIO_TRACK, VIDEO_TRACK, TrackTiming, fragment_timing

_COPY_BLOCK = 1 << 20


def _read_moof(stream: BinaryIO, path: Path) -> bytes:
    """The fragment's moof box (skipping a leading styp), leaving `stream` where it was."""
    start = stream.tell()
    while True:
        header = read_box(stream)
        if header is None:
            raise ValueError(f"segment {path} holds no moof box")
        kind, size, raw = header
        if kind == b"moof":
            moof = raw + stream.read(size - len(raw))
            stream.seek(start)
            return moof
        if kind not in (b"styp", b"sidx", b"free"):
            raise ValueError(f"segment {path} starts with a {kind!r} box, not a fragment")
        stream.seek(size - len(raw), os.SEEK_CUR)


def concat(init: Path, segments: Iterable[Path], output: Path) -> None:
    """Write the final MP4: `init` then every fragment, in timeline order, copied byte for byte.

    Each fragment must start where the previous one ended (video frames, and audio packets when it has any);
    a missing or misordered segment raises ValueError and leaves no output. Memory stays flat however long.
    """
    partial = output.with_name(output.name + ".partial")
    video_end = 0
    audio_end = 0
    try:
        with partial.open("wb") as sink:
            with init.open("rb") as source:
                first = read_box(source)
                if first is None or first[0] != b"ftyp":
                    raise ValueError(f"init segment {init} does not start with an ftyp box")
                source.seek(0)
                shutil.copyfileobj(source, sink, _COPY_BLOCK)
            for path in segments:
                with path.open("rb") as source:
                    timings = fragment_timing(_read_moof(source, path))
                    video = timings.get(VIDEO_TRACK, TrackTiming(video_end, 0, 0))
                    audio = timings.get(AUDIO_TRACK, TrackTiming(audio_end, 0, 0))
                    if video.base_time != video_end or audio.base_time != audio_end:
                        raise ValueError(
                            f"segment {path} starts at video tick {video.base_time} / audio sample {audio.base_time}, "
                            f"expected {video_end} / {audio_end}: segments missing or out of timeline order"
                        )
                    video_end += video.duration
                    audio_end += audio.duration
                    shutil.copyfileobj(source, sink, _COPY_BLOCK)
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)


def probe_warnings(path: Path) -> list[str]:
    """FFmpeg's warnings and errors while demuxing and decoding every packet of every track of `path`.

    An empty list means the file reads cleanly (the "ffprobe without warnings" check). A playlist (.m3u8) is read
    through FFmpeg's HLS demuxer, segments included.
    """
    messages: list[str] = []
    previous = av.logging.get_level()
    av.logging.set_level(av.logging.WARNING)
    try:
        # Decoders run in their own threads; capture from every thread.
        with av.logging.Capture(local=False) as logs:
            try:
                with av.open(str(path)) as container:
                    for packet in container.demux():
                        for _ in packet.decode():
                            pass
            except av.FFmpegError as error:
                messages.append(f"error: {error}")
    finally:
        av.logging.set_level(previous)
    messages += [f"{name}: {message.strip()}" for level, name, message in logs if level <= av.logging.WARNING]
    return messages
