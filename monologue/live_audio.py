"""A live session's audio in object storage: written by the API in small fixed-size pieces as it
arrives, read by the node by sample range.

Pieces have a fixed size (0.1 s), so sample s is in piece s // LIVE_PIECE_SAMPLES and no index is
needed; the API acknowledges audio to the client only once the pieces holding it are stored. When the
audio ends, the last (short) piece and `end.json` (the total) are written. Object keys come from
`monologue.keys` (ids only).

An `interrupt` (barge-in) drops the audio not yet spoken: what the workflow has not been told of (its chunks never
read it). The writer's unstored rest goes at once; the stored part becomes a `Cut` (`cuts/<start>.json`), which
every later read sees as silence: the frames after the cut close the mouth and idle, its audio is never heard,
and since the cut is stored before any chunk could read past its start, a rebuilt session reads the same.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from monologue import keys
from monologue.errors import NotFound
from monologue.plan import AUDIO_RATE
from monologue.storage import ObjectStore

LIVE_PIECE_SAMPLES = AUDIO_RATE // 10  # 0.1 s: what the API holds back from storage at most
# A sender (the API's audio socket, a node's WHIP connection) that brought no audio for this long loses its session to a
# new sender of the session: its client has reconnected after a drop the server has not noticed yet, or it died.
TAKEOVER_S = 3.0
_CACHED_PIECES = 64


@dataclass(frozen=True)
class Cut:
    """Stored samples [start, end) an `interrupt` dropped: read as silence, so never rendered or heard."""

    start: int
    end: int

    def to_json(self) -> bytes:
        return json.dumps({"start": self.start, "end": self.end}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Cut:
        value = json.loads(raw)
        return cls(int(value["start"]), int(value["end"]))


class LiveAudioWriter:
    """Appends PCM to a live session's stored audio. Not thread-safe: one writer per session at a time (the API
    lets one audio socket hold a session). A socket that reconnects continues after `stored` samples, the whole
    pieces already in storage (`stored_live_audio`): what was buffered and never stored was never acknowledged."""

    def __init__(self, store: ObjectStore, session_id: str, *, stored: int = 0) -> None:
        if stored % LIVE_PIECE_SAMPLES:
            raise ValueError(f"a writer continues after whole pieces of {LIVE_PIECE_SAMPLES} samples, not {stored}")
        self._store = store
        self._session_id = session_id
        self._pending = np.zeros(0, dtype="<i2")
        self.stored = stored  # samples in storage
        self.ended = False

    def append(self, samples: np.ndarray) -> int:
        """Buffer int16 samples and store every full piece; returns the samples now stored. A piece leaves the buffer
        only once stored, so after a storage error the writer carries on where it stopped: nothing lost or doubled."""
        if self.ended:
            raise ValueError("the audio has ended; no more can be appended")
        self._pending = np.concatenate([self._pending, samples.astype("<i2", copy=False)])
        while len(self._pending) >= LIVE_PIECE_SAMPLES:
            self._put_piece(self._pending[:LIVE_PIECE_SAMPLES])
            self._pending = self._pending[LIVE_PIECE_SAMPLES:]
        return self.stored

    def finish(self) -> int:
        """Store the rest and mark the audio ended; returns the total samples."""
        if not self.ended:
            if len(self._pending):
                self._put_piece(self._pending)
                self._pending = self._pending[:0]
            self.mark_ended(self._store, self._session_id, self.stored)
            self.ended = True
        return self.stored

    def interrupt(self, spoken: int) -> Cut | None:
        """Barge-in: drop the audio after the first `spoken` samples (what the workflow may have planned: its chunks
        read no further). The buffered rest was never acknowledged and goes; the stored rest becomes a stored `Cut`
        (the same start again widens it: no chunk has read past it meanwhile). Returns it; None if nothing stored was
        past `spoken`. Later audio is stored after the dropped samples: the timeline keeps their length, as silence."""
        if self.ended:
            raise ValueError("the audio has ended; there is nothing left to interrupt")
        self._pending = self._pending[:0]
        if self.stored <= spoken:
            return None
        cut = Cut(spoken, self.stored)
        key = keys.live_audio_cut(self._session_id, cut.start)
        self._store.put(key, cut.to_json(), content_type="application/json")
        return cut

    @staticmethod
    def mark_ended(store: ObjectStore, session_id: str, samples: int) -> None:
        """End a live session's audio at `samples` (resuming a session whose socket is gone)."""
        store.put(
            keys.live_audio_end(session_id), json.dumps({"samples": samples}).encode(), content_type="application/json"
        )

    def _put_piece(self, piece: np.ndarray) -> None:
        number = self.stored // LIVE_PIECE_SAMPLES
        self._store.put(keys.live_audio_piece(self._session_id, number), piece.tobytes())
        self.stored += len(piece)


def stored_live_audio(store: ObjectStore, session_id: str) -> tuple[int, bool]:
    """(samples stored, ended) from storage alone, for resuming a live session: the end marker if it was
    written, else the run of consecutive full pieces."""
    try:
        return int(json.loads(store.get(keys.live_audio_end(session_id)))["samples"]), True
    except NotFound:
        pass
    prefix = keys.live_audio_piece(session_id, 0).rsplit("/", 1)[0] + "/"
    numbers = sorted(int(key.rsplit("/", 1)[1].split(".")[0]) for key in store.list(prefix) if key.endswith(".pcm"))
    count = 0
    while count < len(numbers) and numbers[count] == count:
        count += 1
    return count * LIVE_PIECE_SAMPLES, False


def live_audio_cuts(store: ObjectStore, session_id: str) -> tuple[Cut, ...]:
    """A live session's interruptions, in order."""
    found = (Cut.from_json(store.get(key)) for key in store.list(keys.live_audio_cuts(session_id)))
    return tuple(sorted(found, key=lambda cut: cut.start))


class LiveAudio:
    """An AudioSource over a live session's stored pieces. `update` tells it how much audio the workflow
    knows of; reading past that before the audio has ended is a bug (the frames would depend on when the
    chunk ran), so it raises instead of padding."""

    rate = AUDIO_RATE

    def __init__(self, store: ObjectStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id
        self.available = 0
        self.total_samples: int | None = None  # known once the audio has ended
        self._pieces: OrderedDict[int, np.ndarray] = OrderedDict()
        self.cuts: tuple[Cut, ...] = ()
        self._cuts_read = (-1, False)  # (available, ended) when the cuts were last listed

    def update(self, samples: int, ended: bool) -> None:
        """What the workflow says is stored. The cuts are listed again when that grows: an interrupt stores its cut
        before the workflow can hear of audio past its start, so every cut a read up to `available` meets is known."""
        self.available = max(self.available, samples)
        if ended:
            self.total_samples = samples
        if (self.available, ended) != self._cuts_read:
            self.cuts = live_audio_cuts(self._store, self._session_id)
            self._cuts_read = (self.available, ended)

    def silenced(self, start: int, end: int) -> tuple[tuple[int, int], ...]:
        """The parts of samples [start, end) an interrupt dropped (absolute sample ranges)."""
        parts = ((max(start, cut.start), min(end, cut.end)) for cut in self.cuts)
        return tuple((lo, hi) for lo, hi in parts if lo < hi)

    def read(self, start: int, end: int) -> np.ndarray:
        """float32 samples [start, end); zeros before 0 and past the end of ended audio."""
        limit = self.total_samples if self.total_samples is not None else self.available
        if self.total_samples is None and end > self.available:
            raise RuntimeError(
                f"live audio of session {self._session_id}: read up to sample {end}, but only"
                f" {self.available} are known stored (the chunk was planned too early)"
            )
        out = np.zeros(max(0, end - start), dtype=np.float32)
        lo, hi = max(start, 0), min(end, limit)
        position = lo
        while position < hi:
            number = position // LIVE_PIECE_SAMPLES
            piece = self._piece(number)
            piece_start = number * LIVE_PIECE_SAMPLES
            take = min(hi, piece_start + len(piece)) - position
            if take <= 0:
                raise RuntimeError(f"live audio piece {number} of session {self._session_id} is short")
            offset = position - piece_start
            out[position - start : position - start + take] = piece[offset : offset + take]
            position += take
        for lo, hi in self.silenced(start, end):
            out[lo - start : hi - start] = 0.0
        return out

    def _piece(self, number: int) -> np.ndarray:
        if number in self._pieces:
            self._pieces.move_to_end(number)
            return self._pieces[number]
        raw = self._store.get(keys.live_audio_piece(self._session_id, number))
        piece = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        self._pieces[number] = piece
        while len(self._pieces) > _CACHED_PIECES:
            self._pieces.popitem(last=False)
        return piece
