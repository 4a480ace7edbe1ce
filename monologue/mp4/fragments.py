"""Reading our fMP4 back: track descriptions from the init segment and the samples of each fragment (or only where
they are: `index_fragment`, for a remux that copies them).

Live outputs that do not take fMP4 (Kinesis Video Streams takes Matroska) repackage the stored segments instead of
re-encoding them: this module recovers what mp4.py wrote, the codec private data (the avcC record, the AAC
AudioSpecificConfig) and, per fragment, every sample with its timing and sync flag. It reads what ISO 14496-12
allows in the boxes we write (any tfhd/trun flag combination, tfdt version 0 or 1, several truns per traf), so a
segment written by another muxer with the same tracks reads too; it never interprets the codec payloads.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from monologue.mp4.boxes import Box, child, iter_boxes

# tfhd flags
_TFHD_BASE_DATA_OFFSET = 0x000001
_TFHD_SAMPLE_DESCRIPTION_INDEX = 0x000002
_TFHD_DEFAULT_DURATION = 0x000008
_TFHD_DEFAULT_SIZE = 0x000010
_TFHD_DEFAULT_FLAGS = 0x000020
_TFHD_BASE_IS_MOOF = 0x020000
# trun flags
_TRUN_DATA_OFFSET = 0x000001
_TRUN_FIRST_SAMPLE_FLAGS = 0x000004
_TRUN_DURATION = 0x000100
_TRUN_SIZE = 0x000200
_TRUN_FLAGS = 0x000400
_TRUN_COMPOSITION_OFFSET = 0x000800
_NON_SYNC_SAMPLE = 0x00010000  # sample_is_non_sync_sample (ISO 14496-12 8.8.3.1)
_VISUAL_ENTRY_FIELDS = 8 + 70  # SampleEntry + VisualSampleEntry fields before the child boxes
_AUDIO_ENTRY_FIELDS = 8 + 20  # SampleEntry + AudioSampleEntry fields before the child boxes


@dataclass(frozen=True)
class Track:
    """One track of the init segment. `codec_private` is the avcC record (video) or the AudioSpecificConfig."""

    track_id: int
    kind: str  # "video" or "audio" (from the handler)
    codec: str  # sample entry type: "avc1", "mp4a"
    timescale: int
    codec_private: bytes
    width: int = 0
    height: int = 0
    sample_rate: int = 0
    channels: int = 0
    default_duration: int = 0  # trex defaults, used where a fragment states none
    default_size: int = 0
    default_flags: int = 0


@dataclass(frozen=True)
class Movie:
    """The tracks of an init segment, by track ID."""

    tracks: dict[int, Track]

    def track(self, kind: str) -> Track:
        """The one track of `kind` ("video" or "audio"); ValueError if there is none or several."""
        found = [track for track in self.tracks.values() if track.kind == kind]
        if len(found) != 1:
            raise ValueError(f"init segment has {len(found)} {kind} tracks, expected 1")
        return found[0]


@dataclass(frozen=True)
class Sample:
    """One sample; times in its track's timescale. Presentation time = decode_time + composition_offset."""

    data: bytes
    decode_time: int
    duration: int
    composition_offset: int
    keyframe: bool


@dataclass(frozen=True)
class Fragment:
    """One moof + mdat: its sequence number and each track's samples in decode order."""

    sequence_number: int
    samples: dict[int, list[Sample]] = field(default_factory=dict)


def _full_box_header(data: bytes, found: Box) -> tuple[int, int]:
    """(version, flags) of a FullBox."""
    word = int.from_bytes(data[found.payload_start : found.payload_start + 4], "big")
    return word >> 24, word & 0xFFFFFF


def _descriptor(data: bytes, position: int) -> tuple[int, int, int]:
    """(tag, payload start, payload end) of the MPEG-4 descriptor at `position` (ISO 14496-1 expandable size)."""
    tag = data[position]
    position += 1
    size = 0
    for _ in range(4):
        byte = data[position]
        position += 1
        size = (size << 7) | (byte & 0x7F)
        if not byte & 0x80:
            break
    return tag, position, position + size


def _audio_specific_config(data: bytes, esds: Box) -> bytes:
    """The DecoderSpecificInfo (AudioSpecificConfig) inside an esds box."""
    tag, start, end = _descriptor(data, esds.payload_start + 4)
    if tag != 0x03:
        raise ValueError(f"esds holds descriptor tag {tag:#x}, expected an ES_Descriptor (0x03)")
    es_flags = data[start + 2]
    position = start + 3
    position += 2 if es_flags & 0x80 else 0  # dependsOn_ES_ID
    position += 1 + data[position] if es_flags & 0x40 else 0  # URL
    position += 2 if es_flags & 0x20 else 0  # OCR_ES_Id
    while position < end:
        tag, payload, payload_end = _descriptor(data, position)
        if tag == 0x04:  # DecoderConfigDescriptor: 13 bytes of fields, then its own descriptors
            inner = payload + 13
            while inner < payload_end:
                inner_tag, inner_payload, inner_end = _descriptor(data, inner)
                if inner_tag == 0x05:
                    return data[inner_payload:inner_end]
                inner = inner_end
        position = payload_end
    raise ValueError("esds holds no DecoderSpecificInfo (AudioSpecificConfig)")


def _entry_children(entry: Box, fields: int) -> Box:
    """A sample entry seen as a plain container: its child boxes start after its fixed fields."""
    return Box(entry.kind, entry.start, entry.payload_start + fields, entry.end)


def _track(data: bytes, trak: Box) -> Track:
    tkhd = child(data, trak, b"tkhd")
    version, _ = _full_box_header(data, tkhd)
    (track_id,) = struct.unpack_from(">I", data, tkhd.payload_start + (20 if version == 1 else 12))
    mdia = child(data, trak, b"mdia")
    mdhd = child(data, mdia, b"mdhd")
    version, _ = _full_box_header(data, mdhd)
    (timescale,) = struct.unpack_from(">I", data, mdhd.payload_start + (20 if version == 1 else 12))
    hdlr = child(data, mdia, b"hdlr")
    handler = data[hdlr.payload_start + 8 : hdlr.payload_start + 12]  # past version/flags and pre_defined
    stbl = child(data, child(data, mdia, b"minf"), b"stbl")
    stsd = child(data, stbl, b"stsd")
    entry = next(iter_boxes(data, stsd.payload_start + 8, stsd.end))
    codec = entry.kind.decode("ascii")
    fields = entry.payload_start + 8  # past SampleEntry's reserved bytes and data_reference_index
    if handler == b"vide":
        width, height = struct.unpack_from(">HH", data, fields + 16)
        avcc = child(data, _entry_children(entry, _VISUAL_ENTRY_FIELDS), b"avcC")
        return Track(
            track_id, "video", codec, timescale, data[avcc.payload_start : avcc.end], width=width, height=height
        )
    if handler == b"soun":
        channels, _, _, _, rate = struct.unpack_from(">HHHHI", data, fields + 8)
        esds = child(data, _entry_children(entry, _AUDIO_ENTRY_FIELDS), b"esds")
        config = _audio_specific_config(data, esds)
        return Track(track_id, "audio", codec, timescale, config, sample_rate=rate >> 16, channels=channels)
    raise ValueError(f"track {track_id} has handler {handler!r}; only video and audio tracks are read")


def read_init(data: bytes) -> Movie:
    """The tracks of an init segment (ftyp + moov), with the trex defaults of mvex applied."""
    moov = next((found for found in iter_boxes(data) if found.kind == b"moov"), None)
    if moov is None:
        raise ValueError("init segment holds no moov box")
    tracks = {track.track_id: track for track in (_track(data, trak) for trak in _children(data, moov, b"trak"))}
    for mvex in _children(data, moov, b"mvex"):
        for trex in _children(data, mvex, b"trex"):
            track_id, _, duration, size, flags = struct.unpack_from(">IIIII", data, trex.payload_start + 4)
            if track_id in tracks:
                tracks[track_id] = replace(
                    tracks[track_id], default_duration=duration, default_size=size, default_flags=flags
                )
    if not tracks:
        raise ValueError("init segment's moov holds no track")
    return Movie(tracks)


def _children(data: bytes, parent: Box, kind: bytes) -> list[Box]:
    return [found for found in iter_boxes(data, parent.payload_start, parent.end) if found.kind == kind]


def read_fragment(data: bytes, movie: Movie) -> Fragment:
    """The samples of one fragment (optional styp/sidx, then moof + mdat), per track ID, in decode order."""
    moof = next((found for found in iter_boxes(data) if found.kind == b"moof"), None)
    if moof is None:
        raise ValueError("segment holds no moof box")
    fragment = Fragment(_sequence_number(data, moof))
    for track_id, runs in _index(data, moof, movie).items():
        for run in runs:
            for ref in run:
                if ref.offset + ref.size > len(data):
                    raise ValueError(f"track {track_id} sample {ref.number} runs past the end of the segment")
                sample = Sample(
                    bytes(data[ref.offset : ref.offset + ref.size]),
                    ref.decode_time,
                    ref.duration,
                    ref.composition_offset,
                    ref.keyframe,
                )
                fragment.samples.setdefault(track_id, []).append(sample)
    return fragment


@dataclass(frozen=True)
class SampleRef:
    """Where one sample of a fragment is (`offset`: from the moof's first byte, plus what the caller adds) and its
    timing, without its bytes: what a remux needs to copy it."""

    offset: int
    size: int
    decode_time: int
    duration: int
    composition_offset: int
    keyframe: bool
    number: int  # its place among its track's samples in the fragment


def index_fragment(moof: bytes, movie: Movie, *, offset: int = 0) -> dict[int, list[list[SampleRef]]]:
    """Per track ID, the samples one moof box describes, one list per trun (a trun's samples are contiguous), with
    `offset` (where the moof starts in its file) added to every sample's position. Reads the moof alone."""
    found = next(iter_boxes(moof), None)
    if found is None or found.kind != b"moof":
        raise ValueError("expected a moof box")
    runs = _index(moof, found, movie, origin=offset)
    return {
        track_id: [[replace(ref, offset=ref.offset + offset) for ref in run] for run in track_runs]
        for track_id, track_runs in runs.items()
    }


def _sequence_number(data: bytes, moof: Box) -> int:
    return int(struct.unpack_from(">I", data, child(data, moof, b"mfhd").payload_start + 4)[0])


def _index(data: bytes, moof: Box, movie: Movie, origin: int = 0) -> dict[int, list[list[SampleRef]]]:
    runs: dict[int, list[list[SampleRef]]] = {}
    previous_end = moof.start  # "base of the first traf is the moof; of the next ones, the end of the previous data"
    for traf in _children(data, moof, b"traf"):
        track_id = _tfhd_track(data, child(data, traf, b"tfhd"))
        numbered = sum(len(run) for run in runs.get(track_id, []))
        found, previous_end = _traf_runs(data, moof, traf, movie, previous_end, numbered, origin)
        runs.setdefault(track_id, []).extend(found)
    return runs


def _tfhd_track(data: bytes, tfhd: Box) -> int:
    return int(struct.unpack_from(">I", data, tfhd.payload_start + 4)[0])


def _traf_runs(
    data: bytes, moof: Box, traf: Box, movie: Movie, previous_end: int, numbered: int, origin: int
) -> tuple[list[list[SampleRef]], int]:
    tfhd = child(data, traf, b"tfhd")
    _, flags = _full_box_header(data, tfhd)
    track_id = _tfhd_track(data, tfhd)
    if track_id not in movie.tracks:
        raise ValueError(f"fragment has samples for track {track_id}, which the init segment does not declare")
    track = movie.tracks[track_id]
    position = tfhd.payload_start + 8
    base = previous_end
    if flags & _TFHD_BASE_DATA_OFFSET:
        (base,) = struct.unpack_from(">Q", data, position)
        base -= origin  # a file offset; `data` starts at file offset `origin`
        position += 8
    elif flags & _TFHD_BASE_IS_MOOF:
        base = moof.start
    position += 4 if flags & _TFHD_SAMPLE_DESCRIPTION_INDEX else 0
    defaults = {"duration": track.default_duration, "size": track.default_size, "flags": track.default_flags}
    for bit, name in (_TFHD_DEFAULT_DURATION, "duration"), (_TFHD_DEFAULT_SIZE, "size"), (_TFHD_DEFAULT_FLAGS, "flags"):
        if flags & bit:
            (defaults[name],) = struct.unpack_from(">I", data, position)
            position += 4
    tfdt = _children(data, traf, b"tfdt")
    decode_time = 0
    if tfdt:
        version, _ = _full_box_header(data, tfdt[0])
        (decode_time,) = struct.unpack_from(">Q" if version == 1 else ">I", data, tfdt[0].payload_start + 4)
    runs: list[list[SampleRef]] = []
    data_position = base
    for trun in _children(data, traf, b"trun"):
        version, run_flags = _full_box_header(data, trun)
        count, position = struct.unpack_from(">I", data, trun.payload_start + 4)[0], trun.payload_start + 8
        if run_flags & _TRUN_DATA_OFFSET:
            data_position = base + struct.unpack_from(">i", data, position)[0]
            position += 4
        first_flags = None
        if run_flags & _TRUN_FIRST_SAMPLE_FLAGS:
            (first_flags,) = struct.unpack_from(">I", data, position)
            position += 4
        run: list[SampleRef] = []
        for index in range(count):
            duration, size, sample_flags, offset = defaults["duration"], defaults["size"], defaults["flags"], 0
            if run_flags & _TRUN_DURATION:
                (duration,) = struct.unpack_from(">I", data, position)
                position += 4
            if run_flags & _TRUN_SIZE:
                (size,) = struct.unpack_from(">I", data, position)
                position += 4
            if run_flags & _TRUN_FLAGS:
                (sample_flags,) = struct.unpack_from(">I", data, position)
                position += 4
            if run_flags & _TRUN_COMPOSITION_OFFSET:
                (offset,) = struct.unpack_from(">i" if version == 1 else ">I", data, position)
                position += 4
            if index == 0 and first_flags is not None:
                sample_flags = first_flags
            keyframe = not sample_flags & _NON_SYNC_SAMPLE
            run.append(SampleRef(data_position, size, decode_time, duration, offset, keyframe, numbered))
            numbered += 1
            data_position += size
            decode_time += duration
        runs.append(run)
    return runs, data_position
