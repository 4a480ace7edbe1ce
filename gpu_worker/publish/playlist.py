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
