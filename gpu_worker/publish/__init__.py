"""Publishing rendered chunks: fragmented-MP4 segments with audio, an HLS playlist, and the final MP4.

Each chunk becomes one fMP4 fragment (moof + mdat) holding its H.264 frames and the AAC packets of its time span;
one init segment (ftyp + moov) serves every fragment of a session; the HLS playlist lists the fragments; the final
MP4 is the init segment followed by every fragment, concatenated without re-encoding.

The boxes are written by hand (mp4.py) from the encoders' packets rather than by driving FFmpeg's mp4 muxer:
a fragment must be producible on its own with absolute timestamps (tfdt = the chunk's start, mfhd from its first
frame) and be byte-identical when produced again, and the init segment must be identical for every chunk. With the
muxer that means patching its boxes after the fact and trusting its interleaving, edit-list and priming decisions;
writing ~20 small boxes directly is shorter and every byte is accounted for.

Video: libx264 with identical options for every chunk (so identical SPS/PPS, carried once in the init segment's
avcC), one GOP per chunk starting with an IDR, no B-frames; frame f has pts = dts = f / fps. Audio: AAC-LC mono at
48 kHz on a global 1024-sample packet grid, each segment carrying the grid packets that start inside its frames'
span, encoded by a fresh encoder with pre- and post-roll (audio.py), from speech upsampled 3× by a chunk-invariant
filter (resample.py). A/V offset is bounded by one packet (21 ms) at any length.

The first packet of a session (packet 0) has no predecessor in the file, so its first ~21 ms decode with a fade-in;
no edit list is written (players disagree on edit lists in fragmented files, and speech starts in silence).
"""

from __future__ import annotations

from .final import concat, probe_warnings
from .playlist import playlist
from .resample import AudioSource, upsample
from .segment import SegmentWriter, init_segment, sequence_number
from .stream_format import StreamFormat, audio_packet_range

__all__ = [
    "AudioSource",
    "SegmentWriter",
    "StreamFormat",
    "audio_packet_range",
    "concat",
    "init_segment",
    "playlist",
    "probe_warnings",
    "sequence_number",
    "upsample",
]
