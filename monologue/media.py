"""Decode, validate and normalise user uploads (portrait image, speech audio).

Everything downstream works on one canonical form: an even-sized RGB PNG and 16 kHz mono s16 WAV.
The API calls these at submit time so unusable input gets a 4xx before any work starts; every
failure is an `InputError` whose message names the problem and what to send instead.
"""

from __future__ import annotations

import io
import struct
import warnings
import wave
from dataclasses import dataclass

import av
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from monologue.errors import InputError
from monologue.plan import AUDIO_RATE as AUDIO_RATE  # normalised audio: 16 kHz mono signed 16-bit PCM
from monologue.storage import ObjectStore

MIN_SIDE = 64

_IMAGE_HINT = "send a PNG, JPEG or WebP photo"
_AUDIO_HINT = "send WAV, MP3, FLAC, OGG or M4A"
# Only plain raster formats: Pillow's EPS plugin would run Ghostscript on untrusted bytes.
_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")  # JPEG covers MPO
# Only audio-file demuxers: playlist/concat demuxers could make FFmpeg open other files.
_AUDIO_DEMUXERS = "wav,w64,mp3,flac,ogg,mov,aac,matroska,aiff"
# Leading bytes of common non-audio uploads, to say what was sent instead of "invalid data".
_MAGIC = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"%PDF": "a PDF document",
    b"PK\x03\x04": "a ZIP archive",
}


@dataclass(frozen=True)
class Portrait:
    """A normalised portrait: RGB, even width and height (video encoders need even sizes)."""

    png: bytes
    width: int
    height: int


@dataclass(frozen=True)
class Speech:
    """Normalised speech: 16 kHz mono s16le WAV bytes and its length in samples."""

    wav: bytes
    samples: int

    @property
    def seconds(self) -> float:
        """Duration, which sets the length of the video."""
        return self.samples / AUDIO_RATE


# --------------------------------------------------------------------------- images


def _open_image(data: bytes, what: str, formats: tuple[str, ...], max_side: int) -> Image.Image:
    """Open and fully decode untrusted bytes; any decoder failure is the caller's input problem."""
    if not data:
        raise InputError(f"{what}: the file is empty (0 bytes); {_IMAGE_HINT}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=formats)
            w, h = img.size  # from the header: refuse before spending memory on the pixels
            if max(w, h) > max_side:
                raise InputError(
                    f"{what}: the image is {w}x{h}, larger than the {max_side}px limit on its longer side; "
                    f"resize it to at most {max_side}x{max_side}"
                )
            img.load()  # lazy by default: force the full decode so truncation shows up here
            return img
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"{what}: the image has too many pixels ({e}); {_IMAGE_HINT} of normal size") from e
    except UnidentifiedImageError as e:
        raise InputError(f"{what}: the file is not an image{_sniff(data)}; {_IMAGE_HINT}") from e
    except Exception as e:  # Pillow's plugins raise OSError, SyntaxError, ValueError, struct.error...
        msg = f"{what}: the image is corrupt or truncated ({e}); re-export it and {_IMAGE_HINT}"
        raise InputError(msg) from e


def _to_rgb(img: Image.Image) -> np.ndarray:
    """Any Pillow mode -> (H, W, 3) uint8; transparency over white, 16-bit scaled (not clipped) to 8."""
    if img.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N"):
        grey = (np.clip(np.asarray(img, dtype=np.int64), 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        canvas.alpha_composite(rgba)
        img = canvas
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


def normalise_portrait(data: bytes, *, max_side: int = 4096) -> Portrait:
    """Decode any common image into an upright RGB PNG with even sides (cropped, never rescaled)."""
    img = _open_image(data, "portrait", _IMAGE_FORMATS, max_side)
    w, h = img.size
    if min(w, h) < MIN_SIDE:
        msg = f"portrait: the image is {w}x{h}, smaller than {MIN_SIDE}x{MIN_SIDE}; send a larger photo"
        raise InputError(msg)
    try:
        rgb = _to_rgb(ImageOps.exif_transpose(img))
    except Exception as e:  # bad EXIF or an exotic colour mode Pillow cannot convert
        raise InputError(f"portrait: cannot convert the image to RGB ({e}); {_IMAGE_HINT}") from e
    h, w = rgb.shape[0] & ~1, rgb.shape[1] & ~1
    rgb = np.ascontiguousarray(rgb[:h, :w])
    out = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(out, format="PNG", compress_level=6)
    return Portrait(png=out.getvalue(), width=w, height=h)


def decode_png(data: bytes) -> np.ndarray:
    """A normalised portrait PNG -> (H, W, 3) uint8 RGB array."""
    img = _open_image(data, "png", ("PNG",), max_side=1 << 16)
    return _to_rgb(img).copy()


# --------------------------------------------------------------------------- audio


def _sniff(data: bytes) -> str:
    """' (got a PNG image?)' when the leading bytes say what the upload really is, else ''."""
    for magic, name in _MAGIC.items():
        if data.startswith(magic):
            return f" (got {name}?)"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return " (got a WebP image?)"
    head = data[:512]
    if head and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return " (got a text file?)"
    return ""


def _open_audio(data: bytes) -> av.container.InputContainer:
    """Open untrusted bytes with the audio demuxers only; any failure is the caller's input problem."""
    try:
        return av.open(io.BytesIO(data), "r", options={"format_whitelist": _AUDIO_DEMUXERS})
    except EOFError as e:  # av.EOFError is one too: the header or index is cut off
        raise InputError(f"audio: the file ends too early (truncated upload?); {_AUDIO_HINT}") from e
    except Exception as e:  # av.FFmpegError mostly; the demuxer probe is fed untrusted bytes
        if sniffed := _sniff(data):
            raise InputError(f"audio: the file has no audio stream{sniffed}; {_AUDIO_HINT}") from e
        why = getattr(e, "strerror", None) or e
        raise InputError(f"audio: the file is not a recognised audio format ({why}); {_AUDIO_HINT}") from e


_FIRST_CAPACITY = 30 * AUDIO_RATE  # samples (30 s, 960 kB): most speech fits without growing


class _Samples:
    """Decoded 16 kHz mono s16 samples in one array, never longer than `max_samples`.

    Why one array: a list of chunks, then their concatenation, then a converted copy held three copies of
    the audio at once; a small compressed upload (an hour of FLAC silence is half a megabyte) could cost
    the API hundreds of megabytes. Samples past the limit are counted, not kept, so that decoding can stop
    there and the refusal can say how long the audio is at least."""

    def __init__(self, max_samples: int | None) -> None:
        self.max_samples = max_samples
        self.count = 0  # decoded, kept or not
        self.kept = 0  # in the array
        first = _FIRST_CAPACITY if max_samples is None else min(_FIRST_CAPACITY, max_samples)
        self._buffer = np.empty(first, np.int16)

    @property
    def full(self) -> bool:
        """Past the limit: the caller stops decoding."""
        return self.max_samples is not None and self.count > self.max_samples

    def add(self, frames: list[av.AudioFrame]) -> None:
        for frame in frames:
            samples = frame.to_ndarray().reshape(-1)
            self.count += len(samples)
            if self.max_samples is not None:
                samples = samples[: max(0, self.max_samples - self.kept)]
            self._reserve(self.kept + len(samples))
            self._buffer[self.kept : self.kept + len(samples)] = samples
            self.kept += len(samples)

    def pcm(self) -> np.ndarray:
        """The kept samples (a view, not a copy)."""
        return self._buffer[: self.kept]

    def _reserve(self, size: int) -> None:
        """Room for `size` samples: the array doubles when too small, but never grows past the limit."""
        if size <= len(self._buffer):
            return
        capacity = max(size, 2 * len(self._buffer))
        if self.max_samples is not None:
            capacity = min(capacity, self.max_samples)  # `size` is never past it: add() keeps no more
        grown = np.empty(capacity, np.int16)
        grown[: self.kept] = self._buffer[: self.kept]
        self._buffer = grown


def _decode_pcm(data: bytes, max_samples: int | None) -> tuple[_Samples, int]:
    """Decode the first audio stream to 16 kHz mono s16, stopping once past `max_samples`.

    Returns the samples and the number of packets that failed to decode.
    """
    container = _open_audio(data)
    samples, bad = _Samples(max_samples), 0
    with container:
        if not container.streams.audio:
            hint = _sniff(data) or " (or it is truncated)"
            raise InputError(f"audio: the file has no audio stream{hint}; {_AUDIO_HINT}")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)
        key: tuple[str, str, int] | None = None
        try:
            for packet in container.demux(container.streams.audio[0]):
                try:
                    frames = packet.decode()
                except av.FFmpegError:
                    bad += 1  # a damaged packet: skip it like the ffmpeg CLI does
                    continue
                for frame in frames:
                    # A fresh resampler when the input format changes mid-stream (chained OGG, joined MP3s).
                    if key is not None and key != (frame.format.name, frame.layout.name, frame.sample_rate):
                        samples.add(resampler.resample(None))
                        resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)
                    key = (frame.format.name, frame.layout.name, frame.sample_rate)
                    samples.add(resampler.resample(frame))
                if samples.full:
                    break
            if key is not None:
                # The resampler's filter delay: losing it shortens the audio.
                samples.add(resampler.resample(None))
        except Exception as e:  # demuxer errors past the header: a damaged file
            raise InputError(f"audio: the file is corrupt ({e}); re-export it and {_AUDIO_HINT}") from e
    return samples, bad


def normalise_audio(data: bytes, *, max_seconds: float | None = None) -> Speech:
    """Decode any common audio file (any rate, any channels) into 16 kHz mono s16 WAV.

    Memory is bounded by `max_seconds`: decoding stops just past it, and the samples and the WAV built from
    them are the only copies of the audio."""
    if not data:
        raise InputError(f"audio: the file is empty (0 bytes); {_AUDIO_HINT}")
    max_samples = None if max_seconds is None else round(max_seconds * AUDIO_RATE)
    samples, bad = _decode_pcm(data, max_samples)
    if samples.count == 0 and bad:
        msg = f"audio: the file is corrupt (no packet could be decoded); re-export it and {_AUDIO_HINT}"
        raise InputError(msg)
    if samples.count == 0:
        msg = f"audio: the file contains no audio samples (zero length); {_AUDIO_HINT} with speech in it"
        raise InputError(msg)
    if samples.full:
        raise InputError(
            f"audio: the recording is longer than the {max_seconds:g} s limit"
            f" (at least {samples.count / AUDIO_RATE:.1f} s; setting MONOLOGUE_LIMITS__MAX_AUDIO_SECONDS);"
            " trim it or split it"
        )
    return Speech(wav=_wav(samples.pcm()), samples=samples.kept)


def decode_wav(data: bytes) -> np.ndarray:
    """A normalised WAV (16 kHz mono s16) -> float32 samples in [-1, 1]."""
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            shape = (w.getnchannels(), w.getsampwidth(), w.getframerate())
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError, ValueError) as e:
        msg = f"wav: not a readable PCM WAV file ({e}); normalise it with normalise_audio first"
        raise InputError(msg) from e
    if shape != (1, 2, AUDIO_RATE):
        raise InputError(
            f"wav: expected {AUDIO_RATE} Hz mono 16-bit, got {shape[2]} Hz, {shape[0]} channel(s), "
            f"{8 * shape[1]}-bit; normalise it with normalise_audio first"
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def encode_wav(samples: np.ndarray, rate: int = AUDIO_RATE) -> bytes:
    """Mono float32 in [-1, 1] (clipped) or int16 samples -> WAV bytes."""
    x = np.asarray(samples)
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"encode_wav needs mono samples, got shape {x.shape}")
    if x.dtype == np.int16:
        pcm = x
    elif np.issubdtype(x.dtype, np.floating):
        pcm = np.round(np.clip(np.nan_to_num(x), -1.0, 1.0) * 32767.0).astype(np.int16)
    else:
        raise ValueError(f"encode_wav needs float or int16 samples, got {x.dtype}")
    return _wav(pcm, rate)


def _wav(pcm: np.ndarray, rate: int = AUDIO_RATE) -> bytes:
    """Mono int16 samples -> WAV bytes (the header `wave` writes), copying the samples once."""
    data = np.ascontiguousarray(pcm, dtype="<i2")  # no copy for contiguous int16 on little-endian hosts
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        *(b"RIFF", 36 + data.nbytes, b"WAVE"),
        *(b"fmt ", 16, 1, 1, rate, 2 * rate, 2, 16),  # PCM, mono, rate, bytes per second, block, bits
        *(b"data", data.nbytes),
    )
    return b"".join((header, data.data.cast("B")))


class StoredWav:
    """A normalised WAV in object storage, read by sample range (an `AudioSource` for the node).

    Each chunk reads only the samples it needs, so a node's memory does not grow with the length of
    the audio, and the whole file is never downloaded for one chunk.
    """

    rate = AUDIO_RATE

    def __init__(self, store: ObjectStore, key: str) -> None:
        self._store = store
        self._key = key
        header = store.get_range(key, 0, 4096)
        if header[:4] != b"RIFF" or header[8:12] != b"WAVE":
            raise InputError(f"wav: {key} is not a RIFF/WAVE file")
        position, fmt = 12, None
        while position + 8 <= len(header):
            chunk_id, size = (
                header[position : position + 4],
                int.from_bytes(header[position + 4 : position + 8], "little"),
            )
            if chunk_id == b"fmt ":
                fmt = header[position + 8 : position + 24]
            elif chunk_id == b"data":
                self._data_offset = position + 8
                self.total_samples: int | None = size // 2
                break
            position += 8 + size + (size & 1)
        else:
            raise InputError(f"wav: {key} has no data chunk in its first 4 KiB")
        if fmt is None or int.from_bytes(fmt[2:4], "little") != 1 or int.from_bytes(fmt[4:8], "little") != AUDIO_RATE:
            raise InputError(f"wav: {key} is not {AUDIO_RATE} Hz mono; normalise it with normalise_audio first")

    def read(self, start: int, end: int) -> np.ndarray:
        """float32 samples [start, end); zeros outside the audio."""
        total = self.total_samples or 0
        out = np.zeros(max(0, end - start), dtype=np.float32)
        lo, hi = max(start, 0), min(end, total)
        if hi > lo:
            raw = self._store.get_range(self._key, self._data_offset + 2 * lo, self._data_offset + 2 * hi)
            out[lo - start : hi - start] = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        return out
