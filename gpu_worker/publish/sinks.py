"""Where published segments go besides storage: the Sink interface that live outputs implement.

A sink receives the session's init segment once per start and then every fMP4 fragment in timeline order, exactly
as stored. It owns its own delivery (connections, retries, the receiving service's format and limits) and reports,
through `acknowledged()`, how many leading segments the far side has durably accepted, so the caller can record that
number and, after a crash or a hand-over, start a new sink at that position. A sink never reorders, drops or
rewrites segments on its own: what it cannot deliver it reports as a SinkError.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path


class SinkError(Exception):
    """The sink could not deliver what it was given, and its own retries did not fix it."""


class Sink(ABC):
    """A live output fed with one session's segments, in timeline order."""

    name: str

    @abstractmethod
    def start(self, init_segment: bytes, next_index: int) -> None:
        """Open the sink; `next_index` is the timeline position of the first segment that will be put.

        0 on a fresh session, > 0 after a resume (the segments before it were acknowledged by an earlier sink).
        """

    @abstractmethod
    def put(self, index: int, segment: bytes) -> None:
        """Hand over segment `index` (0, 1, 2, ... in timeline order), fMP4 bytes as stored; calls must be in order."""

    @abstractmethod
    def acknowledged(self) -> int:
        """How many leading segments of the timeline the far side has durably accepted."""

    @abstractmethod
    def finish(self, *, ended: bool) -> None:
        """Wait until everything put is acknowledged, then close; SinkError if the far side reports errors.

        `ended` says whether the session's timeline is complete (True) or will be resumed by another sink (False).
        """

    @abstractmethod
    def close(self) -> None:
        """Abort without waiting for acknowledgements."""

    def playlist(self, durations: list[float], *, ended: bool) -> None:  # noqa: B027  (optional hook)
        """The timeline so far (segment durations in seconds, in timeline order, all already put); sinks that
        serve HLS themselves (S3) write their own playlist from it. `ended`: the session's timeline is complete."""

    def put_final(self, path: Path) -> None:  # noqa: B027  (optional hook)
        """The finished MP4 (completed sessions only), for sinks that keep a copy."""
