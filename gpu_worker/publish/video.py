"""H.264 encoding of one chunk: one GOP starting with an IDR, samples in MP4 (length-prefixed) form."""

from __future__ import annotations

import struct
from fractions import Fraction
from typing import Any

import av
import cv2
import numpy as np
from av.codec.context import Flags, ThreadType

from .stream_format import StreamFormat

_NAL_SEI = 6
_NAL_SPS = 7
_NAL_PPS = 8
_NAL_IDR = 5
# One GOP per chunk (keyint larger than any chunk, no scene cuts), no B-frames (decode order = display order), and
# the colour signalled in the SPS to match the conversion below: sRGB (BT.709 primaries and transfer) converted
# with the BT.601 matrix to limited range. Identical for every segment, so every segment has the same SPS/PPS as
# the init segment.
_X264_PARAMS = (
    "keyint=infinite:min-keyint=1:scenecut=0:bframes=0:open-gop=0:"
    "colorprim=bt709:transfer=bt709:colormatrix=smpte170m:range=tv:aq-mode=0:mbtree=0"
)


def split_annexb(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte stream (start-code separated), without start codes or trailing zeros."""
    units = []
    position = data.find(b"\x00\x00\x01")
    while position != -1:
        start = position + 3
        position = data.find(b"\x00\x00\x01", start)
        # Emulation prevention guarantees a NAL unit ends in a non-zero byte; zeros before a start code are padding
        # or the first byte of a 4-byte start code.
        unit = data[start : len(data) if position == -1 else position].rstrip(b"\x00")
        if unit:
            units.append(unit)
    return units


def _length_prefixed(units: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(unit)) + unit for unit in units)


def _encoder(fmt: StreamFormat) -> av.VideoCodecContext:
    context = av.CodecContext.create("libx264", "w")
    if not isinstance(context, av.VideoCodecContext):
        raise RuntimeError(f"FFmpeg's libx264 encoder gave a {type(context).__name__}")
    context.width = fmt.width
    context.height = fmt.height
    context.pix_fmt = "yuv420p"
    context.time_base = Fraction(1, fmt.fps)
    context.framerate = Fraction(fmt.fps)
    context.thread_count = fmt.x264_threads
    # x264's own default; PyAV's default (slice threads) would split frames into slices and compress worse.
    context.thread_type = ThreadType.FRAME
    # global_header: SPS/PPS go to extradata (for avcC) instead of every IDR.
    context.flags |= Flags.global_header | Flags.bitexact
    context.options = {"qp": str(fmt.qp), "preset": fmt.preset, "x264-params": _X264_PARAMS}
    context.open()
    return context


def _parameter_sets(context: av.VideoCodecContext) -> tuple[bytes, bytes]:
    units = split_annexb(bytes(context.extradata or b""))
    sps = [unit for unit in units if unit[0] & 0x1F == _NAL_SPS]
    pps = [unit for unit in units if unit[0] & 0x1F == _NAL_PPS]
    if len(sps) != 1 or len(pps) != 1:
        raise RuntimeError(f"libx264 extradata holds {len(sps)} SPS and {len(pps)} PPS, expected one of each")
    return sps[0], pps[0]


def parameter_sets(fmt: StreamFormat) -> tuple[bytes, bytes]:
    """(SPS, PPS) NAL units libx264 uses for `fmt`: the same for every segment encoded with `fmt`."""
    return _parameter_sets(_encoder(fmt))


class ChunkEncoder:
    """Encodes consecutive RGB frames starting at an absolute frame index into MP4 video samples."""

    def __init__(self, fmt: StreamFormat, first_frame: int) -> None:
        self._fmt = fmt
        self._context = _encoder(fmt)
        self.parameter_sets = _parameter_sets(self._context)
        self._next_pts = first_frame
        self._first_frame = first_frame
        self.samples: list[bytes] = []

    def encode(self, frames: np.ndarray) -> None:
        """Encode frames (T, H, W, 3) uint8 RGB, already validated."""
        for image in frames:
            # OpenCV's fixed-point BT.601 conversion: ~0.3 ms at 720p where swscale's bit-exact path takes
            # ~3 ms, a fifth of the whole per-frame budget. Integer arithmetic, so the same on every CPU.
            planes = cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420)  # (H * 3 / 2, W): Y, then U, then V
            frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
            frame.pts = self._next_pts
            frame.time_base = self._context.time_base
            self._next_pts += 1
            self._keep(self._context.encode(frame))

    def finish(self) -> list[bytes]:
        """Flush the encoder; the samples (one per frame, in order), checked to be one GOP of the right length."""
        self._keep(self._context.encode(None))
        expected = self._next_pts - self._first_frame
        if len(self.samples) != expected:
            raise RuntimeError(f"libx264 produced {len(self.samples)} frames for {expected} input frames")
        return self.samples

    def _keep(self, packets: list[av.Packet[Any]]) -> None:
        for packet in packets:
            index = self._first_frame + len(self.samples)
            if packet.pts != index or packet.dts != index:
                raise RuntimeError(f"libx264 packet pts={packet.pts} dts={packet.dts}, expected frame {index}")
            # x264's SEI carries its version and full option string (thread count included): dropped so that
            # segments do not depend on the encoder build or the machine.
            units = [unit for unit in split_annexb(bytes(packet)) if unit[0] & 0x1F != _NAL_SEI]
            is_idr = any(unit[0] & 0x1F == _NAL_IDR for unit in units)
            if is_idr != (index == self._first_frame):
                raise RuntimeError(f"frame {index}: IDR={is_idr}, but only a chunk's first frame may be an IDR")
            self.samples.append(_length_prefixed(units))
