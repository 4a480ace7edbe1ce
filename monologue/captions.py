"""Captions: cues built from timed words, and their files (JSON, WebVTT, SRT).

The words come from the node (espeak-ng's word events for text, forced alignment for a transcript); this module
only groups them into cues and writes them out. Standard library only: the API reads the stored cues too. It never
changes the words: they are shown as the user wrote them (case, punctuation)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum


class CaptionFormat(StrEnum):
    """A captions file: json (the cues, what the node writes first and the burn-in reads), vtt (WebVTT, the HLS
    subtitle rendition and browsers' <track>) or srt (SubRip, for video editors)."""

    JSON = "json"
    VTT = "vtt"
    SRT = "srt"

    @property
    def file_name(self) -> str:
        """Its name in a session's out/ folder (`keys.captions`), and in the API's links (`PUBLISHED_CAPTIONS`)."""
        return f"captions.{self.value}"


# The files the API serves (`keys.PUBLIC_OUTPUT`); the JSON is the node's own.
PUBLISHED_CAPTIONS = (CaptionFormat.VTT, CaptionFormat.SRT)
# What a captions file is served as.
MEDIA_TYPES = {
    CaptionFormat.JSON: "application/json",
    CaptionFormat.VTT: "text/vtt; charset=utf-8",
    CaptionFormat.SRT: "application/x-subrip; charset=utf-8",
}


@dataclass(frozen=True)
class TimedWord:
    """One word as displayed (the user's spelling), with when it is spoken in the audio (seconds)."""

    text: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Cue:
    """One caption: its text (at most one "\\n", for two lines) and when it shows (seconds)."""

    start_s: float
    end_s: float
    text: str


def display_tokens(text: str) -> list[tuple[int, str]]:
    """The words as shown: the text split at whitespace, each with its character offset in `text`."""
    return [(match.start(), match.group()) for match in re.finditer(r"\S+", text)]


def timed_tokens(tokens: Sequence[str], times: Sequence[tuple[float, float] | None]) -> tuple[TimedWord, ...]:
    """Each shown token with its time (start, end in seconds). A token with none (a dash, a number the speech
    engine or the aligner did not time) joins the token before it, or the one after if it comes first: every token
    the user wrote is shown, and nothing gets a time of its own that the speech does not give."""
    words: list[TimedWord] = []
    waiting: list[str] = []  # untimed tokens before the first timed one
    for token, time in zip(tokens, times, strict=True):
        if time is None and words:
            last = words[-1]
            words[-1] = TimedWord(f"{last.text} {token}", last.start_s, last.end_s)
        elif time is None:
            waiting.append(token)
        else:
            words.append(TimedWord(" ".join([*waiting, token]), time[0], time[1]))
            waiting = []
    return tuple(words)


_SENTENCE_END = (".", "!", "?", "…", '."', '!"', '?"', ".)", ";")


def build_cues(
    words: Iterable[TimedWord], *, max_chars_per_line: int = 42, max_lines: int = 2, max_cue_s: float = 6.0
) -> tuple[Cue, ...]:
    """Group timed words into cues: a cue ends after a sentence's last word, when its lines are full or when it would
    last longer than `max_cue_s`. A cue runs from its first word's start to its last word's end, cut at the next
    cue's start so that cues never overlap. A word longer than a line gets a line of its own."""
    groups: list[list[TimedWord]] = []
    current: list[TimedWord] = []
    for word in words:
        if current and (
            not _fits([*current, word], max_chars_per_line, max_lines) or word.end_s - current[0].start_s > max_cue_s
        ):
            groups.append(current)
            current = []
        current.append(word)
        if word.text.endswith(_SENTENCE_END):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    cues: list[Cue] = []
    for number, group in enumerate(groups):
        end = group[-1].end_s
        if number + 1 < len(groups):
            end = min(end, groups[number + 1][0].start_s)
        start = min(group[0].start_s, end)
        cues.append(Cue(start, end, "\n".join(_lines([w.text for w in group], max_chars_per_line))))
    return tuple(cues)


def _lines(texts: Sequence[str], width: int) -> list[str]:
    """Words wrapped greedily into lines of at most `width` characters (a longer word stands alone)."""
    lines: list[str] = []
    for text in texts:
        if lines and len(lines[-1]) + 1 + len(text) <= width:
            lines[-1] += " " + text
        else:
            lines.append(text)
    return lines


def _fits(words: Sequence[TimedWord], width: int, max_lines: int) -> bool:
    return len(_lines([w.text for w in words], width)) <= max_lines


def cues_json(cues: Iterable[Cue]) -> bytes:
    """The cues as stored (`keys.captions(..., CaptionFormat.JSON)`)."""
    rows = [{"start_s": round(cue.start_s, 3), "end_s": round(cue.end_s, 3), "text": cue.text} for cue in cues]
    return json.dumps({"cues": rows}, ensure_ascii=False).encode()


def read_cues(data: bytes) -> tuple[Cue, ...]:
    """The cues `cues_json` wrote."""
    return tuple(Cue(float(row["start_s"]), float(row["end_s"]), str(row["text"])) for row in json.loads(data)["cues"])


def _timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _safe(text: str) -> str:
    # A blank line would end a cue early, and "-->" would read as a timing line, in both formats.
    return "\n".join(line.replace("-->", "->") for line in text.split("\n") if line.strip())


def to_vtt(cues: Iterable[Cue]) -> str:
    """WebVTT: the header, then each cue's times (HH:MM:SS.mmm) and text, separated by blank lines. `<` and `&` are
    escaped (WebVTT reads them as markup)."""
    blocks = ["WEBVTT"]
    for cue in cues:
        text = _safe(cue.text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        blocks.append(f"{_timestamp(cue.start_s, '.')} --> {_timestamp(cue.end_s, '.')}\n{text}")
    return "\n\n".join(blocks) + "\n"


def to_srt(cues: Iterable[Cue]) -> str:
    """SubRip: numbered cues from 1, times as HH:MM:SS,mmm, separated by blank lines."""
    blocks = [
        f"{number}\n{_timestamp(cue.start_s, ',')} --> {_timestamp(cue.end_s, ',')}\n{_safe(cue.text)}"
        for number, cue in enumerate(cues, start=1)
    ]
    return "\n\n".join(blocks) + "\n" if blocks else ""


def render(cues: Sequence[Cue], fmt: CaptionFormat) -> bytes:
    """The cues as one file of `fmt`."""
    if fmt is CaptionFormat.JSON:
        return cues_json(cues)
    return (to_vtt(cues) if fmt is CaptionFormat.VTT else to_srt(cues)).encode()
