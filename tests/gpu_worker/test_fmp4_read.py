from __future__ import annotations

import struct

from gpu_worker.publish import SegmentWriter, StreamFormat, audio_packet_range, init_segment
from gpu_worker.publish.audio import audio_specific_config, encode_packets
from gpu_worker.publish.video import ChunkEncoder, parameter_sets
from monologue.mp4.boxes import box, full_box
from monologue.mp4.fragments import read_fragment, read_init
from tests.gpu_worker.test_publish import MemoryAudio, indexed_frames, speech_like

FORMAT = StreamFormat(width=128, height=96, fps=25)


def test_init_segment_reads_back_codec_private_data_and_track_parameters() -> None:
    movie = read_init(init_segment(FORMAT))
    video, audio = movie.track("video"), movie.track("audio")
    assert (video.track_id, video.codec, video.width, video.height) == (1, "avc1", 128, 96)
    assert video.timescale == FORMAT.video_timescale
    sps, pps = parameter_sets(FORMAT)
    record = video.codec_private  # AVCDecoderConfigurationRecord: version, profile, ..., one SPS, one PPS
    assert record[0] == 1 and record[1:4] == sps[1:4] and record[5] & 0x1F == 1
    assert record[6:8] == struct.pack(">H", len(sps)) and record[8 : 8 + len(sps)] == sps
    after_sps = 8 + len(sps)
    assert record[after_sps] == 1 and record[after_sps + 3 : after_sps + 3 + len(pps)] == pps
    assert (audio.track_id, audio.codec, audio.timescale) == (2, "mp4a", 48_000)
    assert (audio.sample_rate, audio.channels) == (48_000, 1)
    assert audio.codec_private == audio_specific_config(48_000)


def test_fragment_samples_are_exactly_the_encoders_packets() -> None:
    first, count = 17, 23
    source = MemoryAudio(speech_like(2.0))
    frames = indexed_frames(first, count)
    writer = SegmentWriter(FORMAT, first_frame=first, audio=source)
    writer.write(frames)
    movie = read_init(init_segment(FORMAT))
    fragment = read_fragment(writer.finish(), movie)

    encoder = ChunkEncoder(FORMAT, first)
    encoder.encode(frames)
    expected_video = encoder.finish()
    first_packet, end_packet = audio_packet_range(first, count, FORMAT.fps, FORMAT.audio_rate)
    expected_audio = encode_packets(source, FORMAT.audio_rate, first_packet, end_packet)

    assert fragment.sequence_number == first + 1
    video, audio = fragment.samples[1], fragment.samples[2]
    assert [sample.data for sample in video] == expected_video
    assert [sample.decode_time for sample in video] == [frame * FORMAT.frame_ticks for frame in range(first, 40)]
    assert {sample.duration for sample in video} == {FORMAT.frame_ticks}
    assert [sample.keyframe for sample in video] == [True] + [False] * (count - 1)
    assert {sample.composition_offset for sample in video} == {0}
    assert [sample.data for sample in audio] == expected_audio
    assert [sample.decode_time for sample in audio] == [packet * 1024 for packet in range(first_packet, end_packet)]
    assert all(sample.keyframe and sample.duration == 1024 for sample in audio)


def test_trun_variants_read_back_sizes_flags_durations_and_composition_offsets() -> None:
    """Flag combinations our writer does not use: defaults in tfhd, signed offsets, a second trun without offset."""
    movie = read_init(init_segment(FORMAT))
    payload = [bytes([value]) * 3 for value in range(2)] + [b"\x07" * 5, b"\x08" * 6]

    def moof(data_offset: int) -> bytes:
        tfhd = full_box(b"tfhd", 0, 0x020000 | 0x10 | 0x20, struct.pack(">III", 1, 3, 0x01010000))
        tfdt = full_box(b"tfdt", 0, 0, struct.pack(">I", 1000))
        # version 1: signed composition offsets; per-sample duration and offset; the first sample a sync sample
        first_run = full_box(
            b"trun",
            1,
            0x001 | 0x004 | 0x100 | 0x800,
            struct.pack(">IiI", 2, data_offset, 0x02000000),
            struct.pack(">Ii", 10, 20),
            struct.pack(">Ii", 11, -5),
        )
        # no data offset: continues after the first run's data; explicit sizes and flags
        second_run = full_box(
            b"trun",
            0,
            0x100 | 0x200 | 0x400,
            struct.pack(">I", 2),
            struct.pack(">III", 12, 5, 0x01010000),
            struct.pack(">III", 13, 6, 0x02000000),
        )
        mfhd = full_box(b"mfhd", 0, 0, struct.pack(">I", 9))
        return box(b"moof", mfhd, box(b"traf", tfhd, tfdt, first_run, second_run))

    size = len(moof(0))
    data = box(b"styp", b"msdh", bytes(4)) + moof(size + 8) + box(b"mdat", *payload)
    # the styp in front moves the moof; offsets stay relative to the moof (default-base-is-moof)
    fragment = read_fragment(data, movie)
    samples = fragment.samples[1]
    assert fragment.sequence_number == 9
    assert [sample.data for sample in samples] == payload
    assert [sample.decode_time for sample in samples] == [1000, 1010, 1021, 1033]
    assert [sample.duration for sample in samples] == [10, 11, 12, 13]
    assert [sample.composition_offset for sample in samples] == [20, -5, 0, 0]
    assert [sample.keyframe for sample in samples] == [True, False, False, True]
