"""The two box layouts of fragmented MP4: the init segment (ftyp + moov) and a fragment (moof + mdat).

Track 1 is H.264 video (timescale fps × 2^k), track 2 AAC-LC mono (timescale = its sampling rate). Every time and
date field is zero and no encoder or tool name is written, so the bytes depend only on the parameters.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from monologue.mp4.boxes import Box, box, child, full_box, iter_boxes

VIDEO_TRACK = 1
AUDIO_TRACK = 2
_IDENTITY_MATRIX = struct.pack(">9i", 0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)
_LANGUAGE_UND = ((ord("u") - 0x60) << 10) | ((ord("n") - 0x60) << 5) | (ord("d") - 0x60)
# Sample flags (ISO 14496-12 8.8.3.1): a sync sample depends on nothing; the others depend on earlier samples.
SYNC_SAMPLE_FLAGS = 0x02000000
NON_SYNC_SAMPLE_FLAGS = 0x01010000
# tfhd / trun flag bits.
_TFHD_DEFAULT_DURATION = 0x000008
_TFHD_DEFAULT_FLAGS = 0x000020
_TFHD_BASE_IS_MOOF = 0x020000
_TRUN_DATA_OFFSET = 0x000001
_TRUN_FIRST_SAMPLE_FLAGS = 0x000004
_TRUN_SAMPLE_DURATION = 0x000100
_TRUN_SAMPLE_SIZE = 0x000200
_HIGH_PROFILES = (100, 110, 122, 144)  # avcC carries chroma format and bit depths for these (ISO 14496-15)


def _ftyp() -> bytes:
    # iso6: tfdt and default-base-is-moof in use; avc1/mp41 let plain MP4 players take the concatenated file.
    return box(b"ftyp", b"iso6", struct.pack(">I", 0), b"iso6", b"iso5", b"isom", b"avc1", b"mp41")


def _mvhd() -> bytes:
    return full_box(
        b"mvhd",
        0,
        0,
        struct.pack(">IIII", 0, 0, 1000, 0),  # creation, modification, timescale, duration (unknown: fragmented)
        struct.pack(">ihH8x", 0x00010000, 0x0100, 0),  # rate 1.0, volume 1.0
        _IDENTITY_MATRIX,
        bytes(24),
        struct.pack(">I", AUDIO_TRACK + 1),  # next_track_ID
    )


def _tkhd(track_id: int, *, volume: int, width: int, height: int) -> bytes:
    return full_box(
        b"tkhd",
        0,
        0x000003,  # enabled, in movie
        struct.pack(">IIIII", 0, 0, track_id, 0, 0),
        struct.pack(">8xhhhH", 0, 0, volume, 0),
        _IDENTITY_MATRIX,
        struct.pack(">II", width << 16, height << 16),
    )


def _mdia(timescale: int, handler: bytes, handler_name: bytes, media_header: bytes, sample_entry: bytes) -> bytes:
    mdhd = full_box(b"mdhd", 0, 0, struct.pack(">IIIIHH", 0, 0, timescale, 0, _LANGUAGE_UND, 0))
    hdlr = full_box(b"hdlr", 0, 0, struct.pack(">I4s12x", 0, handler), handler_name + b"\0")
    dinf = box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1)))
    stbl = box(
        b"stbl",
        full_box(b"stsd", 0, 0, struct.pack(">I", 1), sample_entry),
        full_box(b"stts", 0, 0, struct.pack(">I", 0)),
        full_box(b"stsc", 0, 0, struct.pack(">I", 0)),
        full_box(b"stsz", 0, 0, struct.pack(">II", 0, 0)),
        full_box(b"stco", 0, 0, struct.pack(">I", 0)),
    )
    return box(b"mdia", mdhd, hdlr, box(b"minf", media_header, dinf, stbl))


def _avcc(sps: bytes, pps: bytes) -> bytes:
    profile, compatibility, level = sps[1], sps[2], sps[3]
    payload = struct.pack(">BBBBBB", 1, profile, compatibility, level, 0xFF, 0xE1)  # 4-byte lengths, 1 SPS
    payload += struct.pack(">H", len(sps)) + sps + struct.pack(">BH", 1, len(pps)) + pps
    if profile in _HIGH_PROFILES:
        # The encoder is always fed 8-bit yuv420p: chroma_format_idc 1, bit depths 8, no SPS extensions.
        payload += bytes((0xFC | 1, 0xF8 | 0, 0xF8 | 0, 0))
    return box(b"avcC", payload)


def _avc1(width: int, height: int, sps: bytes, pps: bytes) -> bytes:
    return box(
        b"avc1",
        struct.pack(">6xH", 1),  # data_reference_index
        struct.pack(">HH12xHH", 0, 0, width, height),
        struct.pack(">IIIH", 0x00480000, 0x00480000, 0, 1),  # 72 dpi, reserved, frame_count
        bytes(32),  # compressorname: left empty on purpose (no tool names in the output)
        struct.pack(">Hh", 0x0018, -1),
        _avcc(sps, pps),
    )


def _descriptor(tag: int, payload: bytes) -> bytes:
    size = len(payload)
    length = bytearray([size & 0x7F])
    size >>= 7
    while size:
        length.insert(0, 0x80 | (size & 0x7F))
        size >>= 7
    return bytes([tag]) + bytes(length) + payload


def _mp4a(rate: int, audio_config: bytes, bit_rate: int) -> bytes:
    decoder_config = _descriptor(
        0x04,
        # MPEG-4 audio, audio stream, 768-byte decoder buffer (the AAC maximum for one channel), max/avg bit rate
        struct.pack(">BB", 0x40, (0x05 << 2) | 1)
        + (768).to_bytes(3, "big")
        + struct.pack(">II", bit_rate, bit_rate)
        + _descriptor(0x05, audio_config),
    )
    es_descriptor = _descriptor(0x03, struct.pack(">HB", AUDIO_TRACK, 0) + decoder_config + _descriptor(0x06, b"\x02"))
    return box(
        b"mp4a",
        struct.pack(">6xH", 1),
        struct.pack(">8xHHHH", 1, 16, 0, 0),  # mono, 16-bit
        struct.pack(">I", rate << 16),
        full_box(b"esds", 0, 0, es_descriptor),
    )


def _trex(track_id: int) -> bytes:
    return full_box(b"trex", 0, 0, struct.pack(">IIIII", track_id, 1, 0, 0, 0))


def build_init(
    *,
    width: int,
    height: int,
    video_timescale: int,
    sps: bytes,
    pps: bytes,
    audio_rate: int,
    audio_config: bytes,
    audio_bit_rate: int,
) -> bytes:
    """ftyp + moov (with mvex) for the H.264 track and the AAC mono track, with empty sample tables."""
    video = box(
        b"trak",
        _tkhd(VIDEO_TRACK, volume=0, width=width, height=height),
        _mdia(
            video_timescale,
            b"vide",
            b"VideoHandler",
            full_box(b"vmhd", 0, 1, struct.pack(">HHHH", 0, 0, 0, 0)),
            _avc1(width, height, sps, pps),
        ),
    )
    audio = box(
        b"trak",
        _tkhd(AUDIO_TRACK, volume=0x0100, width=0, height=0),
        _mdia(
            audio_rate,
            b"soun",
            b"SoundHandler",
            full_box(b"smhd", 0, 0, struct.pack(">hH", 0, 0)),
            _mp4a(audio_rate, audio_config, audio_bit_rate),
        ),
    )
    mvex = box(b"mvex", _trex(VIDEO_TRACK), _trex(AUDIO_TRACK))
    return _ftyp() + box(b"moov", _mvhd(), video, audio, mvex)


@dataclass(frozen=True)
class TrackRun:
    """One track's samples in a fragment: consecutive samples of equal duration starting at base_time."""

    track_id: int
    base_time: int  # in the track's timescale
    sample_duration: int
    samples: Sequence[bytes]
    first_sample_flags: int  # the rest of the samples get default_flags
    default_flags: int


def _traf(run: TrackRun, data_offset: int) -> bytes:
    tfhd = full_box(
        b"tfhd",
        0,
        _TFHD_BASE_IS_MOOF | _TFHD_DEFAULT_DURATION | _TFHD_DEFAULT_FLAGS,
        struct.pack(">III", run.track_id, run.sample_duration, run.default_flags),
    )
    tfdt = full_box(b"tfdt", 1, 0, struct.pack(">Q", run.base_time))
    flags = _TRUN_DATA_OFFSET | _TRUN_SAMPLE_SIZE
    header = struct.pack(">Ii", len(run.samples), data_offset)
    if run.first_sample_flags != run.default_flags:
        flags |= _TRUN_FIRST_SAMPLE_FLAGS
        header += struct.pack(">I", run.first_sample_flags)
    sizes = struct.pack(f">{len(run.samples)}I", *(len(sample) for sample in run.samples))
    return box(b"traf", tfhd, tfdt, full_box(b"trun", 0, flags, header, sizes))


def build_fragment(sequence_number: int, runs: Sequence[TrackRun]) -> bytes:
    """moof + mdat holding the runs' samples, each run's data contiguous, in the given order; empty runs left out."""
    runs = [run for run in runs if run.samples]
    if not runs:
        raise ValueError("a fragment needs at least one sample")

    def moof(offsets: Sequence[int]) -> bytes:
        mfhd = full_box(b"mfhd", 0, 0, struct.pack(">I", sequence_number))
        return box(b"moof", mfhd, *(_traf(run, offset) for run, offset in zip(runs, offsets, strict=True)))

    # Offsets are relative to the moof's first byte (default-base-is-moof); the moof's size does not depend on them.
    moof_size = len(moof([0] * len(runs)))
    offsets = []
    position = moof_size + 8  # past the mdat header
    for run in runs:
        offsets.append(position)
        position += sum(len(sample) for sample in run.samples)
    payload = b"".join(sample for run in runs for sample in run.samples)
    return moof(offsets) + box(b"mdat", payload)


@dataclass(frozen=True)
class TrackTiming:
    """Where one track's samples in a fragment sit on its timeline."""

    base_time: int
    duration: int
    sample_count: int


def fragment_timing(moof_bytes: bytes) -> dict[int, TrackTiming]:
    """Per track ID, the base time, total duration and sample count of the samples a moof box describes."""
    timings: dict[int, TrackTiming] = {}
    moof = next(iter_boxes(moof_bytes))
    if moof.kind != b"moof":
        raise ValueError(f"expected a moof box, found {moof.kind!r}")
    for traf in iter_boxes(moof_bytes, moof.payload_start, moof.end):
        if traf.kind != b"traf":
            continue
        track_id, default_duration = _tfhd_fields(moof_bytes, child(moof_bytes, traf, b"tfhd"))
        tfdt = child(moof_bytes, traf, b"tfdt")
        version = moof_bytes[tfdt.payload_start]
        base_format = ">Q" if version == 1 else ">I"
        (base_time,) = struct.unpack_from(base_format, moof_bytes, tfdt.payload_start + 4)
        duration = count = 0
        for trun in iter_boxes(moof_bytes, traf.payload_start, traf.end):
            if trun.kind == b"trun":
                run_duration, run_count = _trun_duration(moof_bytes, trun, default_duration)
                duration += run_duration
                count += run_count
        timings[track_id] = TrackTiming(base_time, duration, count)
    return timings


def _tfhd_fields(data: bytes, tfhd: Box) -> tuple[int, int]:
    flags = int.from_bytes(data[tfhd.payload_start + 1 : tfhd.payload_start + 4], "big")
    position = tfhd.payload_start + 4
    (track_id,) = struct.unpack_from(">I", data, position)
    position += 4
    position += 8 if flags & 0x000001 else 0  # base_data_offset
    position += 4 if flags & 0x000002 else 0  # sample_description_index
    default_duration = struct.unpack_from(">I", data, position)[0] if flags & _TFHD_DEFAULT_DURATION else 0
    return track_id, default_duration


def _trun_duration(data: bytes, trun: Box, default_duration: int) -> tuple[int, int]:
    flags = int.from_bytes(data[trun.payload_start + 1 : trun.payload_start + 4], "big")
    (count,) = struct.unpack_from(">I", data, trun.payload_start + 4)
    if not flags & _TRUN_SAMPLE_DURATION:
        return count * default_duration, count
    position = trun.payload_start + 8
    position += 4 if flags & _TRUN_DATA_OFFSET else 0
    position += 4 if flags & _TRUN_FIRST_SAMPLE_FLAGS else 0
    stride = 4 * bin(flags & 0x000F00).count("1")
    duration = sum(struct.unpack_from(">I", data, position + index * stride)[0] for index in range(count))
    return duration, count
