"""The state of one KVS session, apart from the connections that carry it: its timeline (segments turned into
Matroska clusters with absolute timecodes, under KVS's fragment rules) and its ledger (the segments put but not
yet durable, retired in order by the service's acknowledgements).

The timeline lives on the caller's thread, the ledger on the sink's event loop thread; neither does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monologue.mp4.fragments import read_fragment, read_init

from . import mkv
from .kvs_client import error_acknowledgement
from .kvs_wire import ack_number

MAX_FRAGMENT_MS = 10_000


@dataclass
class PendingSegment:
    """A segment put but not yet durable: its cluster bytes are kept until then, for resending."""

    index: int
    timecode: int
    data: bytes
    state: str = "queued"  # then "sent" and the acknowledgements' event types


class Timeline:
    """The session's Matroska stream: its header, and each segment's cluster at producer start + media time,
    put in order from `next_index`."""

    def __init__(self, init_segment: bytes, *, origin_ms: int, next_index: int) -> None:
        self.origin_ms = origin_ms  # the producer start time (epoch ms) every timecode counts from
        self.movie = read_init(init_segment)
        self.header = mkv.header(self.movie)
        self.next_put = next_index
        self._last_timecode = -1

    def cluster(self, index: int, segment: bytes) -> PendingSegment:
        """Segment `index` as a cluster to send; ValueError for anything KVS would refuse or we cannot order."""
        if index != self.next_put:
            raise ValueError(f"segment {index} put out of order: the next segment must be {self.next_put}")
        fragment = read_fragment(segment, self.movie)
        for track in self.movie.tracks.values():
            if not fragment.samples.get(track.track_id):
                raise ValueError(
                    f"segment {index} has no {track.kind} samples; KVS refuses fragments missing a track (4011)"
                )
        built = mkv.cluster(self.movie, fragment, origin_ms=self.origin_ms)
        if built.duration_ms > MAX_FRAGMENT_MS:
            raise ValueError(
                f"segment {index} lasts {built.duration_ms / 1000:.3f} s; KVS refuses fragments over "
                f"{MAX_FRAGMENT_MS / 1000:.0f} s, and a segment (one GOP) cannot be split without re-encoding: "
                "use shorter chunks"
            )
        if built.timecode <= self._last_timecode:
            raise ValueError(
                f"segment {index} starts at {built.timecode} ms, not after the previous segment ({self._last_timecode})"
            )
        self._last_timecode = built.timecode
        self.next_put += 1
        return PendingSegment(index, built.timecode, built.data)


class Ledger:
    """The segments put but not yet `durable_event`, in put order; `acknowledged` is the first of them (every
    segment before it is durable)."""

    def __init__(self, durable_event: str) -> None:
        self.durable_event = durable_event
        self.acknowledged = 0
        self._pending: dict[int, PendingSegment] = {}
        self._by_timecode: dict[int, int] = {}

    @property
    def empty(self) -> bool:
        return not self._pending

    def add(self, pending: PendingSegment) -> None:
        self._pending[pending.index] = pending
        self._by_timecode[pending.timecode] = pending.index

    def durable(self, index: int) -> bool:
        return self._pending[index].state == self.durable_event

    def next_to_send(self, after: int) -> PendingSegment | None:
        """The first segment past index `after` that is not yet durable."""
        return next(
            (item for item in self._pending.values() if item.index > after and not self.durable(item.index)), None
        )

    def not_durable(self, sent: list[int]) -> list[int]:
        """Those of `sent` still waiting to be durable."""
        return [index for index in sent if index in self._pending and not self.durable(index)]

    def on_ack(self, ack: dict[str, Any]) -> None:
        """Record one acknowledgement; an ERROR raises ConnectionFailed (worth another connection) or Fatal."""
        event = str(ack.get("EventType", ""))
        timecode = ack_number(ack.get("FragmentTimecode"))
        index = None if timecode is None else self._by_timecode.get(timecode)
        if event == "ERROR":
            raise error_acknowledgement(ack, f"segment {index}" if index is not None else f"timecode {timecode}")
        if index is None or index not in self._pending:
            return  # IDLE, or an acknowledgement of a segment already durable
        if self._pending[index].state != self.durable_event:
            self._pending[index].state = event
        while self.acknowledged in self._pending and self.durable(self.acknowledged):
            done = self._pending.pop(self.acknowledged)
            del self._by_timecode[done.timecode]
            self.acknowledged += 1
