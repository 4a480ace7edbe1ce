"""Behaviour of upload normalisation: what users send, what the pipeline gets, what gets refused."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import struct
import tracemalloc
import wave
import zlib
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from cli.benches.upload import silence_flac
from monologue import SAMPLES
from monologue.errors import InputError
from monologue.media import (
    AUDIO_RATE,
    Portrait,
    Speech,
    decode_png,
    decode_wav,
    encode_wav,
    normalise_audio,
    normalise_portrait,
)
from monologue.settings import LimitSettings

SECONDS = 1.5
TOLERANCE = 0.030  # codecs pad to whole frames; 30 ms is under one video frame at 25 fps


# --------------------------------------------------------------------------- fixtures built at test time


def _has_encoder(name: str) -> bool:
    try:
        av.Codec(name, "w")
    except Exception:
        return False
    return True


@functools.cache
def encode_audio(codec: str, container: str, rate: int, layout: str, seconds: float = SECONDS) -> bytes:
    """A speech-like signal (220 Hz with harmonics, 4 Hz syllable envelope) encoded with PyAV."""
    n = round(seconds * rate)
    t = np.arange(n) / rate
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    tone = sum(np.sin(2 * np.pi * 220 * k * t) / k for k in (1, 2, 3))
    signal = (0.3 * envelope * tone).astype(np.float32)
    channels = 2 if layout == "stereo" else 1
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        if codec == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}  # FFmpeg's native Vorbis encoder
        frame = av.AudioFrame.from_ndarray(np.tile(signal, (channels, 1)), format="fltp", layout=layout)
        frame.rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def image_bytes(img: Image.Image, fmt: str = "PNG", **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def gradient(width: int, height: int) -> Image.Image:
    """A lossless-checkable RGB test card: every pixel differs from its neighbours."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x % 256, y % 256, (x + y) % 256], axis=2).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


@functools.cache
def image_fixture(fmt: str) -> bytes:
    return image_bytes(gradient(96, 80), fmt)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims a huge size but carries no pixels: a decompression bomb's calling card."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def pcm(speech: Speech) -> np.ndarray:
    return decode_wav(speech.wav)


AUDIO_FORMATS = {
    "mp3": ("libmp3lame", "mp3", 44_100, "stereo"),
    "flac": ("flac", "flac", 44_100, "stereo"),
    "ogg-opus": ("libopus", "ogg", 48_000, "stereo"),
    "ogg-vorbis": ("vorbis", "ogg", 44_100, "stereo"),
    "m4a-aac": ("aac", "ipod", 44_100, "stereo"),
    "wav-44k-stereo": ("pcm_s16le", "wav", 44_100, "stereo"),
    "wav-8k-mono": ("pcm_s16le", "wav", 8_000, "mono"),
    "wav-48k-mono": ("pcm_s16le", "wav", 48_000, "mono"),
}


def audio_fixture(name: str) -> bytes:
    codec = AUDIO_FORMATS[name][0]
    if not _has_encoder(codec):
        pytest.skip(f"PyAV's FFmpeg has no {codec} encoder, cannot build the {name} fixture")
    return encode_audio(*AUDIO_FORMATS[name])


# --------------------------------------------------------------------------- audio: accepted


@pytest.mark.parametrize("name", AUDIO_FORMATS)
def test_every_common_audio_format_normalises_to_16k_mono_with_its_duration(name: str) -> None:
    speech = normalise_audio(audio_fixture(name))

    with wave.open(io.BytesIO(speech.wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (AUDIO_RATE, 1, 2)
        assert w.getnframes() == speech.samples
    assert speech.seconds == pytest.approx(SECONDS, abs=TOLERANCE)
    assert rms(pcm(speech)) > 0.05  # the signal survived, not just its length


def test_sample_speech_has_speech_and_an_exactly_silent_gap() -> None:
    speech = normalise_audio((SAMPLES / "speech.wav").read_bytes())
    x = pcm(speech)

    assert 6.0 <= speech.seconds <= 7.5
    second = AUDIO_RATE
    assert rms(x[2 * second : 3 * second]) > 0.03  # inside "…a talking portrait."
    assert rms(x[int(4.7 * second) : int(6.0 * second)]) > 0.03  # inside "Every word you hear…"
    assert not x[int(3.5 * second) : int(4.4 * second)].any()  # the gap is digital silence
    assert not x[: int(0.55 * second)].any()


def test_already_normalised_audio_passes_through_unchanged() -> None:
    data = (SAMPLES / "speech.wav").read_bytes()
    assert normalise_audio(data).wav == data


def test_sample_portrait_normalises_to_512_square() -> None:
    portrait = normalise_portrait((SAMPLES / "portrait.jpg").read_bytes())
    assert (portrait.width, portrait.height) == (512, 512)
    assert decode_png(portrait.png).shape == (512, 512, 3)


def test_silent_audio_is_accepted_for_a_still_faced_avatar() -> None:
    speech = normalise_audio(encode_wav(np.zeros(AUDIO_RATE, dtype=np.float32)))
    assert speech.samples == AUDIO_RATE
    assert not pcm(speech).any()


def test_same_audio_bytes_give_identical_output() -> None:
    data = audio_fixture("mp3")
    assert normalise_audio(data) == normalise_audio(data)


def test_max_seconds_refuses_longer_audio_and_accepts_shorter() -> None:
    data = audio_fixture("wav-44k-stereo")
    with pytest.raises(InputError, match=r"longer than the 1 s limit"):
        normalise_audio(data, max_seconds=1.0)
    assert normalise_audio(data, max_seconds=2.0).seconds == pytest.approx(SECONDS, abs=TOLERANCE)


@functools.cache
def hour_of_silence_flac() -> bytes:
    """An hour of digital silence as 44.1 kHz stereo FLAC: about half a megabyte that decodes to 115 MB."""
    return silence_flac(3600)


def decode_peak_bytes(data: bytes, max_seconds: float) -> tuple[Speech | InputError, int]:
    """`normalise_audio`'s result (or refusal) and the peak of the Python and NumPy memory it allocated."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            result: Speech | InputError = normalise_audio(data, max_seconds=max_seconds)
        except InputError as err:
            result = err
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def memory_bound(data: bytes, max_seconds: float) -> float:
    """What a decode may cost: the upload plus 2.5 copies of the longest accepted audio (16 kHz s16).

    One copy is the samples, one the WAV bytes built from them; the half is headroom for the buffer's growth.
    The old decoder (list of chunks → concatenate → astype → WAV) held three to five copies."""
    return len(data) + 2.5 * max_seconds * AUDIO_RATE * 2


def test_an_hour_of_flac_silence_is_refused_past_the_limit_with_memory_bounded_by_it() -> None:
    """Half a megabyte of FLAC is not a reason to decode an hour of audio: decoding stops at the limit."""
    data = hour_of_silence_flac()
    assert len(data) < 1_000_000
    max_seconds = LimitSettings().max_audio_seconds  # the default the API runs with

    result, peak = decode_peak_bytes(data, max_seconds)

    assert isinstance(result, InputError)
    assert f"longer than the {max_seconds:g} s limit" in str(result)
    assert "MONOLOGUE_LIMITS__MAX_AUDIO_SECONDS" in str(result)
    assert peak < memory_bound(data, max_seconds)


def test_audio_just_under_the_limit_is_accepted_with_memory_bounded_by_the_limit() -> None:
    data = encode_audio("flac", "flac", 44_100, "stereo", seconds=59.5)

    result, peak = decode_peak_bytes(data, max_seconds=60.0)

    assert isinstance(result, Speech)
    assert result.seconds == pytest.approx(59.5, abs=TOLERANCE)
    assert result == normalise_audio(data)  # the limit changes nothing about what is decoded
    assert peak < memory_bound(data, 60.0)


# --------------------------------------------------------------------------- audio: refused


def test_empty_upload_is_refused_as_audio() -> None:
    with pytest.raises(InputError, match="empty"):
        normalise_audio(b"")


def test_zero_length_wav_is_refused_naming_the_zero_length() -> None:
    with pytest.raises(InputError, match="zero length"):
        normalise_audio(encode_wav(np.zeros(0, dtype=np.float32)))


def test_png_sent_as_audio_is_refused_naming_the_image() -> None:
    with pytest.raises(InputError, match="PNG image") as err:
        normalise_audio(image_bytes(gradient(64, 64)))
    assert "WAV, MP3" in str(err.value)  # says what to send instead


def test_text_sent_as_audio_is_refused() -> None:
    with pytest.raises(InputError, match="text file"):
        normalise_audio(b"this is not a recording\n" * 40)


def test_random_bytes_are_refused_as_audio() -> None:
    with pytest.raises(InputError):
        normalise_audio(np.random.default_rng(0).bytes(8192))


def test_video_without_sound_is_refused_for_having_no_audio_stream() -> None:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    with pytest.raises(InputError, match="no audio stream"):
        normalise_audio(buf.getvalue())


NOT_AUDIO = "not a recognised audio format"
ENDS_EARLY = "the file ends too early (truncated upload?)"
NO_STREAM = "no audio stream (or it is truncated)"


@pytest.mark.parametrize(
    ("name", "keep", "refusal"),
    [
        # A stream format decodes the frames before the cut; one whose index sits at the end (M4A's moov
        # atom) or whose header is cut off is refused with the reason. None: decoded partially.
        ("mp3", 0.5, None),
        ("mp3", 0.97, None),
        ("mp3", 0.01, NOT_AUDIO),
        ("wav-44k-stereo", 0.5, None),
        ("wav-44k-stereo", 0.97, None),
        ("wav-44k-stereo", 0.01, None),
        ("flac", 0.5, None),
        ("flac", 0.97, None),
        ("flac", 0.01, ENDS_EARLY),
        ("m4a-aac", 0.5, NOT_AUDIO),
        ("m4a-aac", 0.97, NO_STREAM),
        ("m4a-aac", 0.01, NOT_AUDIO),
    ],
)
def test_truncated_audio_is_decoded_up_to_the_cut_or_refused_with_the_reason(
    name: str, keep: float, refusal: str | None
) -> None:
    data = audio_fixture(name)[: int(len(audio_fixture(name)) * keep)]
    if refusal is not None:
        with pytest.raises(InputError, match=re.escape(refusal)):
            normalise_audio(data)
        return
    speech = normalise_audio(data)
    # About the part kept: not padded back to the header's full length, not cut to nothing (compressed
    # frames differ in size, so bytes kept and seconds kept differ by up to half).
    assert keep * SECONDS / 2 <= speech.seconds <= min(SECONDS, keep * SECONDS * 1.1) + TOLERANCE


def test_wav_at_the_wrong_rate_is_refused_by_decode_wav() -> None:
    with pytest.raises(InputError, match="16000 Hz mono"):
        decode_wav(audio_fixture("wav-8k-mono"))
    with pytest.raises(InputError, match="not a readable"):
        decode_wav(b"RIFF nonsense")


def test_encode_wav_round_trips_float_and_int16() -> None:
    x = np.sin(np.linspace(0, 20, 1000)).astype(np.float32) * 0.5
    assert np.allclose(decode_wav(encode_wav(x)), x, atol=1e-4)
    ints = (x * 32767).astype(np.int16)
    assert np.array_equal(decode_wav(encode_wav(ints)), ints / np.float32(32768))
    with pytest.raises(ValueError, match="mono"):
        encode_wav(np.zeros((10, 2), np.float32))


# --------------------------------------------------------------------------- portrait: accepted


def test_jpeg_portrait_becomes_rgb_png() -> None:
    portrait = normalise_portrait(image_bytes(gradient(200, 120), "JPEG", quality=95))
    assert isinstance(portrait, Portrait)
    assert (portrait.width, portrait.height) == (200, 120)
    assert portrait.png.startswith(b"\x89PNG")
    assert decode_png(portrait.png).shape == (120, 200, 3)


def test_png_portrait_keeps_its_pixels_exactly() -> None:
    img = gradient(128, 96)
    assert np.array_equal(decode_png(normalise_portrait(image_bytes(img)).png), np.asarray(img))


def test_odd_sized_portrait_is_cropped_to_even_not_scaled() -> None:
    img = gradient(101, 77)
    portrait = normalise_portrait(image_bytes(img))
    assert (portrait.width, portrait.height) == (100, 76)
    assert np.array_equal(decode_png(portrait.png), np.asarray(img)[:76, :100])


@pytest.mark.parametrize("mode", ["L", "P", "1", "CMYK", "LA"])
def test_portrait_in_any_colour_mode_becomes_rgb(mode: str) -> None:
    img = gradient(80, 80).convert(mode)
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    out = decode_png(normalise_portrait(image_bytes(img, fmt)).png)
    assert out.shape == (80, 80, 3) and out.dtype == np.uint8


def test_greyscale_portrait_has_equal_channels() -> None:
    out = decode_png(normalise_portrait(image_bytes(gradient(80, 80).convert("L"))).png)
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])


def test_sixteen_bit_greyscale_is_scaled_not_clipped() -> None:
    ramp = np.tile(np.linspace(0, 65535, 80).astype(np.uint16), (80, 1))
    out = decode_png(normalise_portrait(image_bytes(Image.fromarray(ramp))).png)
    assert out[0, 0, 0] == 0 and out[0, -1, 0] == 255
    assert 100 < out[0, 40, 0] < 156  # mid-grey stays mid-grey


def test_transparent_pixels_become_white() -> None:
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[:, :32] = (255, 0, 0, 255)  # opaque red left half, transparent black right half
    out = decode_png(normalise_portrait(image_bytes(Image.fromarray(rgba, "RGBA"))).png)
    assert tuple(out[10, 10]) == (255, 0, 0)
    assert tuple(out[10, 50]) == (255, 255, 255)


def test_exif_orientation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": a phone photo taken upright
    portrait = normalise_portrait(image_bytes(gradient(100, 80), "JPEG", exif=exif.tobytes()))
    assert (portrait.width, portrait.height) == (80, 100)


def test_same_image_bytes_give_identical_output() -> None:
    data = image_bytes(gradient(150, 99), "JPEG")
    assert normalise_portrait(data) == normalise_portrait(data)


# --------------------------------------------------------------------------- portrait: refused


def test_portrait_over_max_side_is_refused_naming_size_and_limit() -> None:
    with pytest.raises(InputError, match=r"300x200.*256px"):
        normalise_portrait(image_bytes(gradient(300, 200)), max_side=256)
    assert normalise_portrait(image_bytes(gradient(256, 200)), max_side=256).width == 256


def test_portrait_over_default_limit_is_refused() -> None:
    with pytest.raises(InputError, match="4096"):
        normalise_portrait(image_bytes(Image.new("L", (4100, 64))))


@pytest.mark.parametrize("size", [(12_000, 12_000), (30_000, 30_000)])
def test_decompression_bomb_is_refused(size: tuple[int, int]) -> None:
    with pytest.raises(InputError, match="too many pixels"):
        normalise_portrait(png_header_only(*size), max_side=100_000)


@pytest.mark.parametrize("size", [(63, 200), (200, 10)])
def test_tiny_portrait_is_refused(size: tuple[int, int]) -> None:
    with pytest.raises(InputError, match="smaller than 64x64"):
        normalise_portrait(image_bytes(gradient(*size)))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty"),
        (b"hello, I am a text file", "not an image"),
        (b"%PDF-1.4\n" + b"0" * 100, "not an image"),
    ],
)
def test_non_image_is_refused_as_portrait(data: bytes, problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        normalise_portrait(data)


def test_audio_sent_as_portrait_is_refused() -> None:
    with pytest.raises(InputError, match="not an image"):
        normalise_portrait((SAMPLES / "speech.wav").read_bytes())


def test_truncated_jpeg_is_refused() -> None:
    data = image_bytes(gradient(300, 300), "JPEG")
    with pytest.raises(InputError, match="corrupt or truncated"):
        normalise_portrait(data[: len(data) // 2])


# --------------------------------------------------------------------------- properties


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_never_raise_anything_but_input_error(data: bytes) -> None:
    for normalise in (normalise_audio, normalise_portrait):
        with contextlib.suppress(InputError):
            normalise(data)


@settings(max_examples=50, deadline=None)
@given(
    name=st.sampled_from(["mp3", "flac", "ogg-opus", "m4a-aac", "wav-8k-mono"]),
    damage=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_damaged_audio_files_never_raise_anything_but_input_error(name: str, damage: list[tuple[int, int]]) -> None:
    data = bytearray(audio_fixture(name))
    for where, value in damage:
        data[where % len(data)] = value
    with contextlib.suppress(InputError):
        normalise_audio(bytes(data))


@settings(max_examples=50, deadline=None)
@given(
    fmt=st.sampled_from(["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"]),
    damage=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_damaged_images_never_raise_anything_but_input_error(fmt: str, damage: list[tuple[int, int]]) -> None:
    data = bytearray(image_fixture(fmt))
    for where, value in damage:
        data[where % len(data)] = value
    with contextlib.suppress(InputError):
        normalise_portrait(bytes(data))


def test_stored_wav_reads_sample_ranges_like_the_whole_file(tmp_path: Path) -> None:
    from monologue.media import StoredWav
    from monologue.storage import LocalStore

    store = LocalStore(tmp_path)
    speech = normalise_audio((SAMPLES / "speech.wav").read_bytes())
    store.put("sessions/a/input/audio.wav", speech.wav)
    whole = decode_wav(speech.wav)
    source = StoredWav(store, "sessions/a/input/audio.wav")
    assert source.total_samples == len(whole) and source.rate == AUDIO_RATE
    assert np.array_equal(source.read(1000, 17_000), whole[1000:17_000])
    edges = source.read(-100, 50)  # zeros before the audio starts
    assert np.array_equal(edges[:100], np.zeros(100, np.float32)) and np.array_equal(edges[100:], whole[:50])
    tail = source.read(len(whole) - 10, len(whole) + 10)  # and after it ends
    assert np.array_equal(tail[:10], whole[-10:]) and not tail[10:].any()
