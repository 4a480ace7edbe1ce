"""The encoding settings shared by every segment of a session, and the timescales derived from them."""

from __future__ import annotations

from dataclasses import dataclass

# Every preset x264 knows; anything else would only fail later, inside the encoder.
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)
# Sampling rates an AAC AudioSpecificConfig can name by index (ISO 14496-3, table 1.18), less 88.2 and 96 kHz:
# an mp4a sample entry stores the rate as 16.16 fixed point, which cannot hold them.
AAC_RATES = (64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
AAC_PACKET_SAMPLES = 1024
AUDIO_BIT_RATE = 96_000
# FFmpeg's habit: a video timescale of at least 10 000 ticks per second keeps players that assume fine-grained
# timestamps happy; fps × 2^k keeps every frame boundary an exact integer.
_MIN_VIDEO_TIMESCALE = 10_000


@dataclass(frozen=True)
class StreamFormat:
    """How every segment of one session is encoded; segments of one session must share one StreamFormat.

    `x264_threads` = 0 lets x264 pick from the core count. x264 does not promise the same bytes for different thread
    counts (here, superfast at 720p gave identical bytes with 1 thread and auto); set it explicitly when chunks of one
    session may be retried on machines with different core counts and byte identity matters.
    """

    width: int
    height: int
    fps: int
    audio_rate: int = 48_000
    # Constant quantiser rather than crf: every segment opens with an IDR, and with the same QP everywhere (no
    # adaptive quantisation, no macroblock tree) a static background is coded the same way at each IDR, so the
    # refresh at chunk seams is smaller (measured on the sample: seam/within-chunk frame difference 2.7 vs 4.1
    # with crf 20) and the files are smaller too (692 vs 828 KB) at slightly lower error.
    qp: int = 18
    preset: str = "superfast"
    x264_threads: int = 0

    def __post_init__(self) -> None:
        if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2:
            raise ValueError(f"StreamFormat: yuv420p needs positive even sizes, got {self.width}x{self.height}")
        if self.fps <= 0:
            raise ValueError(f"StreamFormat: fps must be positive, got fps={self.fps}")
        if self.audio_rate not in AAC_RATES:
            raise ValueError(f"StreamFormat: audio_rate={self.audio_rate} is not an AAC sampling rate {AAC_RATES}")
        if not 0 <= self.qp <= 51:
            raise ValueError(f"StreamFormat: qp must be in [0, 51], got qp={self.qp}")
        if self.preset not in X264_PRESETS:
            raise ValueError(f"StreamFormat: unknown x264 preset={self.preset!r}, expected one of {X264_PRESETS}")
        if self.x264_threads < 0:
            raise ValueError(f"StreamFormat: x264_threads must be >= 0 (0 = auto), got {self.x264_threads}")

    @property
    def frame_ticks(self) -> int:
        """One frame's duration in video timescale ticks (a power of two)."""
        ticks = 1
        while self.fps * ticks < _MIN_VIDEO_TIMESCALE:
            ticks *= 2
        return ticks

    @property
    def video_timescale(self) -> int:
        """Video track ticks per second: fps × frame_ticks, so frame f starts at tick f × frame_ticks."""
        return self.fps * self.frame_ticks


def ceil_div(numerator: int, denominator: int) -> int:
    """⌈numerator / denominator⌉ in exact integer maths (denominator > 0)."""
    return -(-numerator // denominator)


def audio_packet_range(first_frame: int, frame_count: int, fps: int, audio_rate: int) -> tuple[int, int]:
    """The global AAC packets [first, end) that belong to frames [first_frame, first_frame + frame_count).

    Packet j covers output samples [j × 1024, (j + 1) × 1024); a segment owns the packets whose first sample lies
    in its frames' span [f0 × rate / fps, f1 × rate / fps). Consecutive segments therefore tile the packet grid with
    no gap or overlap, whatever their lengths.
    """
    per_packet = AAC_PACKET_SAMPLES * fps
    first = ceil_div(first_frame * audio_rate, per_packet)
    end = ceil_div((first_frame + frame_count) * audio_rate, per_packet)
    return first, end
