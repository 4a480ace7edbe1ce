"""The HLS media playlist over the fMP4 segments."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Durations are rounded to microseconds before taking the ceiling, so 40 / 25 = 1.6000000000000001 counts as 1.6.
_DECIMALS = 6


def _check_uri(uri: str) -> None:
    if not uri or any(character in uri for character in '\r\n"'):
        raise ValueError(f"playlist URI {uri!r} is empty or holds a quote or line break")


def playlist(
    segments: Sequence[tuple[str, float]], *, init_uri: str, ended: bool, target_duration: float | None = None
) -> str:
    """An HLS (version 7) EVENT media playlist of fMP4 segments, (uri, seconds) in timeline order.

    `target_duration` should be given while the session runs (the longest chunk it may produce): HLS forbids the
    target duration from changing, and without it the longest segment so far sets it.
    """
    _check_uri(init_uri)
    for uri, duration in segments:
        _check_uri(uri)
        if not duration > 0 or not math.isfinite(duration):
            raise ValueError(f"segment {uri!r} has duration={duration}, expected a positive number of seconds")
    longest = max((round(duration, _DECIMALS) for _, duration in segments), default=0.0)
    if target_duration is None:
        if not segments:
            raise ValueError("playlist: an empty playlist needs target_duration")
        target = math.ceil(longest)
    else:
        target = math.ceil(round(target_duration, _DECIMALS))
        if target < longest:
            raise ValueError(f"target_duration={target_duration} is shorter than the longest segment ({longest} s)")
    lines = [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        f"#EXT-X-TARGETDURATION:{target}",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-PLAYLIST-TYPE:EVENT",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        f'#EXT-X-MAP:URI="{init_uri}"',
    ]
    for uri, duration in segments:
        lines += [f"#EXTINF:{duration:.{_DECIMALS}f},", uri]
    if ended:
        lines.append("#EXT-X-ENDLIST")
    return "\n".join(lines) + "\n"


def subtitle_playlist(vtt_uri: str, duration_s: float) -> str:
    """An HLS (version 7) VOD media playlist of one WebVTT segment spanning the whole timeline: a render's captions
    are all known before its first chunk, so the rendition is complete from the start. The cues carry their own
    times from 0, which is where the fMP4 timeline starts too (tfdt 0), so no X-TIMESTAMP-MAP is needed."""
    _check_uri(vtt_uri)
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"subtitle playlist: duration_s={duration_s}, expected a positive number of seconds")
    lines = [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        f"#EXT-X-TARGETDURATION:{math.ceil(round(duration_s, _DECIMALS))}",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        f"#EXTINF:{duration_s:.{_DECIMALS}f},",
        vtt_uri,
        "#EXT-X-ENDLIST",
    ]
    return "\n".join(lines) + "\n"


def multivariant_playlist(
    stream_uri: str, subtitles_uri: str, *, language: str, bandwidth: int, resolution: tuple[int, int], codecs: str
) -> str:
    """An HLS multivariant playlist: the one video variant (`stream_uri`) with one subtitle rendition (`subtitles_uri`,
    shown by default). `bandwidth` is the peak bits per second of the segments."""
    for uri in (stream_uri, subtitles_uri):
        _check_uri(uri)
    for value in (language, codecs):
        if not value or any(character in value for character in '\r\n"'):
            raise ValueError(f"multivariant playlist: {value!r} is empty or holds a quote or line break")
    width, height = resolution
    lines = [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        f'#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="subs",NAME="Captions",LANGUAGE="{language}",DEFAULT=YES,'
        f'AUTOSELECT=YES,URI="{subtitles_uri}"',
        f'#EXT-X-STREAM-INF:BANDWIDTH={bandwidth},RESOLUTION={width}x{height},CODECS="{codecs}",SUBTITLES="subs"',
        stream_uri,
    ]
    return "\n".join(lines) + "\n"
