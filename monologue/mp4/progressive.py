"""A progressive MP4 from our fragmented one: the same samples, byte for byte, with the index (moov) first.

The stored final MP4 is an init segment (ftyp + moov with empty sample tables and an mvex) followed by one moof +
mdat per chunk, which players handle but editors and some players do not. Here the moofs are read (only they: a
few hundred bytes a chunk), the sample tables every player expects are built from them (stts, ctts, stss, stsc,
stsz, stco or co64), and the samples are copied after that index in one mdat: each trun's samples stay one chunk,
in their order. Nothing is decoded or encoded (no media stack: the API runs it), and memory holds the tables,
never the video. The sample descriptions (stsd: avcC, esds) are copied from the original untouched."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from monologue.mp4.boxes import Box, box, full_box, iter_boxes
from monologue.mp4.fragments import index_fragment, read_init

ReadRange = Callable[[int, int], bytes]  # bytes [start, end) of the source
_HEADER = struct.Struct(">I4s")
_COPY_BLOCK = 1 << 20
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"dinf"}
_TABLES = {b"stts", b"ctts", b"stss", b"stsc", b"stsz", b"stz2", b"stco", b"co64", b"sdtp", b"sbgp", b"sgpd"}
_FTYP = box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isom", b"iso2", b"avc1", b"mp41")


@dataclass
class _Track:
    """One track's samples as the tables need them, and its chunks (one per trun)."""

    timescale: int
    sizes: list[int] = field(default_factory=list)
    durations: list[int] = field(default_factory=list)
    composition_offsets: list[int] = field(default_factory=list)
    sync: list[int] = field(default_factory=list)  # 1-based numbers of sync samples
    chunk_samples: list[int] = field(default_factory=list)
    chunk_offsets: list[int] = field(default_factory=list)  # in the output, once known


@dataclass(frozen=True)
class _Chunk:
    track_id: int
    start: int  # in the source
    end: int


def remux(read: ReadRange, size: int, out: BinaryIO) -> int:
    """Write the progressive MP4 of the fragmented MP4 `read` gives (`size` bytes) to `out`; returns its size.
    ValueError if the source is not an init segment followed by moof + mdat fragments."""
    moov, fragments = _layout(read, size)
    moov_bytes = read(moov.start, moov.end)
    movie = read_init(moov_bytes)
    tracks = {track_id: _Track(track.timescale) for track_id, track in movie.tracks.items()}
    chunks: list[_Chunk] = []
    for moof, mdat in fragments:
        for track_id, runs in index_fragment(read(moof.start, moof.end), movie, offset=moof.start).items():
            for run in runs:
                if not run:
                    continue
                start, end = run[0].offset, run[-1].offset + run[-1].size
                if start < mdat.payload_start or end > mdat.end:
                    raise ValueError(f"a run of track {track_id} lies outside the mdat after the moof at {moof.start}")
                _add_run(
                    tracks[track_id], [(ref.size, ref.duration, ref.composition_offset, ref.keyframe) for ref in run]
                )
                chunks.append(_Chunk(track_id, start, end))
    payload = sum(chunk.end - chunk.start for chunk in chunks)
    wide = len(_FTYP) + len(moov_bytes) + payload + (1 << 20) > 0xFFFFFFFF  # offsets past 4 GiB: co64
    index = _movie_box(moov_bytes, tracks, wide=wide)  # with zero offsets: its size does not depend on them
    large_mdat = payload + 8 > 0xFFFFFFFF
    position = len(_FTYP) + len(index) + (16 if large_mdat else 8)
    for chunk in chunks:
        tracks[chunk.track_id].chunk_offsets.append(position)
        position += chunk.end - chunk.start
    index = _movie_box(moov_bytes, tracks, wide=wide)
    out.write(_FTYP + index)
    out.write(struct.pack(">I4sQ", 1, b"mdat", payload + 16) if large_mdat else _HEADER.pack(payload + 8, b"mdat"))
    for chunk in chunks:
        for start in range(chunk.start, chunk.end, _COPY_BLOCK):
            out.write(read(start, min(chunk.end, start + _COPY_BLOCK)))
    return position


def _layout(read: ReadRange, size: int) -> tuple[Box, list[tuple[Box, Box]]]:
    """The source's moov and its (moof, mdat) pairs, from the box headers alone."""
    boxes: list[Box] = []
    position = 0
    while position < size:
        header = read(position, min(size, position + 16))
        if len(header) < 8:
            raise ValueError(f"truncated box header at offset {position}")
        length, kind = _HEADER.unpack_from(header)
        payload_start = position + 8
        if length == 1:
            (length,) = struct.unpack_from(">Q", header, 8)
            payload_start += 8
        elif length == 0:
            length = size - position
        if length < payload_start - position or position + length > size:
            raise ValueError(f"box {kind!r} at offset {position} has size {length}, past the end ({size})")
        boxes.append(Box(kind, position, payload_start, position + length))
        position += length
    moov = next((found for found in boxes if found.kind == b"moov"), None)
    if moov is None:
        raise ValueError("the video has no moov box")
    fragments: list[tuple[Box, Box]] = []
    for moof, mdat in itertools.pairwise(boxes):
        if moof.kind == b"moof":
            if mdat.kind != b"mdat":
                raise ValueError(f"the moof at offset {moof.start} is not followed by an mdat")
            fragments.append((moof, mdat))
    if not fragments:
        raise ValueError("the video has no fragments (moof + mdat): is it already progressive?")
    return moov, fragments


def _add_run(track: _Track, samples: list[tuple[int, int, int, bool]]) -> None:
    for sample_size, duration, composition_offset, keyframe in samples:
        track.sizes.append(sample_size)
        track.durations.append(duration)
        track.composition_offsets.append(composition_offset)
        if keyframe:
            track.sync.append(len(track.sizes))
    track.chunk_samples.append(len(samples))


def _movie_box(moov: bytes, tracks: dict[int, _Track], *, wide: bool) -> bytes:
    """The original moov with durations filled in, each track's sample tables built and no mvex."""
    (root,) = iter_boxes(moov)
    movie_timescale = _timescale(moov, _child(moov, root, b"mvhd"))
    track_seconds = {track_id: sum(track.durations) / track.timescale for track_id, track in tracks.items()}
    movie_duration = round(max(track_seconds.values(), default=0) * movie_timescale)
    parts = []
    for found in iter_boxes(moov, root.payload_start, root.end):
        if found.kind == b"mvhd":
            parts.append(_with_duration(moov, found, movie_duration, base=12))
        elif found.kind == b"trak":
            track_id = _track_id(moov, found)
            track = tracks[track_id]
            parts.append(_trak(moov, found, track, round(track_seconds[track_id] * movie_timescale), wide=wide))
        elif found.kind != b"mvex":  # no fragments follow
            parts.append(moov[found.start : found.end])
    return box(b"moov", *parts)


def _trak(moov: bytes, trak: Box, track: _Track, movie_duration: int, *, wide: bool) -> bytes:
    def rebuild(parent: Box) -> bytes:
        parts = []
        for found in iter_boxes(moov, parent.payload_start, parent.end):
            if found.kind == b"tkhd":
                parts.append(_with_duration(moov, found, movie_duration, base=16))
            elif found.kind == b"mdhd":
                parts.append(_with_duration(moov, found, sum(track.durations), base=12))
            elif found.kind == b"stbl":
                stsd = _child(moov, found, b"stsd")
                kept = [moov[b.start : b.end] for b in iter_boxes(moov, found.payload_start, found.end)]
                others = [raw for raw in kept if raw[4:8] not in _TABLES and raw[4:8] != b"stsd"]
                parts.append(box(b"stbl", moov[stsd.start : stsd.end], *_tables(track, wide=wide), *others))
            elif found.kind in _CONTAINERS:
                parts.append(box(found.kind, rebuild(found)))
            else:
                parts.append(moov[found.start : found.end])
        return b"".join(parts)

    return box(b"trak", rebuild(trak))


def _tables(track: _Track, *, wide: bool) -> list[bytes]:
    """stts, ctts (when any sample has a composition offset), stss (when not every sample is a sync sample),
    stsc, stsz and stco/co64 (ISO 14496-12 8.6-8.7)."""
    tables = [full_box(b"stts", 0, 0, *_runs(track.durations))]
    if any(track.composition_offsets):
        signed = any(offset < 0 for offset in track.composition_offsets)
        tables.append(full_box(b"ctts", 1 if signed else 0, 0, *_runs(track.composition_offsets, signed=signed)))
    if len(track.sync) != len(track.sizes):
        tables.append(full_box(b"stss", 0, 0, struct.pack(f">I{len(track.sync)}I", len(track.sync), *track.sync)))
    entries: list[tuple[int, int]] = []
    for number, samples in enumerate(track.chunk_samples, start=1):
        if not entries or entries[-1][1] != samples:
            entries.append((number, samples))
    stsc = struct.pack(">I", len(entries)) + b"".join(struct.pack(">III", first, n, 1) for first, n in entries)
    tables.append(full_box(b"stsc", 0, 0, stsc))
    sizes = track.sizes
    tables.append(full_box(b"stsz", 0, 0, struct.pack(f">II{len(sizes)}I", 0, len(sizes), *sizes)))
    offsets = track.chunk_offsets or [0] * len(track.chunk_samples)
    kind, code = (b"co64", "Q") if wide else (b"stco", "I")
    tables.append(full_box(kind, 0, 0, struct.pack(f">I{len(offsets)}{code}", len(offsets), *offsets)))
    return tables


def _runs(values: list[int], *, signed: bool = False) -> list[bytes]:
    """Run-length (count, value) entries, with the entry count first (stts and ctts)."""
    entries: list[list[int]] = []
    for value in values:
        if entries and entries[-1][1] == value:
            entries[-1][0] += 1
        else:
            entries.append([1, value])
    code = ">Ii" if signed else ">II"
    return [struct.pack(">I", len(entries)), *(struct.pack(code, count, value) for count, value in entries)]


def _with_duration(data: bytes, found: Box, duration: int, *, base: int) -> bytes:
    """A copy of an mvhd, tkhd or mdhd box with its duration set. `base`: the duration's offset in a version-0
    payload after version and flags (mvhd, mdhd: 12; tkhd: 16); version 1 widens the two times before it to 64
    bits (8 bytes more) and the duration itself."""
    raw = bytearray(data[found.start : found.end])
    start = found.payload_start - found.start
    version = raw[start]
    if version == 1:
        struct.pack_into(">Q", raw, start + 4 + base + 8, duration)
    else:
        if duration > 0xFFFFFFFF:
            raise ValueError(f"a duration of {duration} does not fit a version-0 {found.kind!r} box")
        struct.pack_into(">I", raw, start + 4 + base, duration)
    return bytes(raw)


def _timescale(data: bytes, mvhd: Box) -> int:
    version = data[mvhd.payload_start]
    return int(struct.unpack_from(">I", data, mvhd.payload_start + (20 if version == 1 else 12))[0])


def _track_id(data: bytes, trak: Box) -> int:
    tkhd = _child(data, trak, b"tkhd")
    version = data[tkhd.payload_start]
    return int(struct.unpack_from(">I", data, tkhd.payload_start + (20 if version == 1 else 12))[0])


def _child(data: bytes, parent: Box, kind: bytes) -> Box:
    found = next((b for b in iter_boxes(data, parent.payload_start, parent.end) if b.kind == kind), None)
    if found is None:
        raise ValueError(f"box {parent.kind!r} has no {kind!r} box")
    return found
