"""A session's chunks: N chunks carry the timeline, I chunks smooth the seam between two (`monologue/plan.py`
orders them), and the anchors an N chunk leaves for the chunks after it. Standard library only."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time.
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class ChunkKind(StrEnum):
    """N chunks carry the timeline; an I chunk interpolates the seam after N(index)."""

    N = "N"
    I = "I"  # noqa: E741 (the name the whole design uses)


class AnchorEnd(StrEnum):
    """Which end of an N chunk an anchor holds: its state at its first frame or at its last."""

    HEAD = "head"
    TAIL = "tail"


@dataclass(frozen=True)
class AnchorRef:
    """One anchor: N(index)'s head or tail (only N chunks leave anchors). `name` is how it is shown and stored in
    flat arrays ("N3.tail"); a checkpoint file keeps its own chunk's anchors under "head." and "tail."."""

    index: int
    end: AnchorEnd

    @property
    def name(self) -> str:
        return f"{ChunkKind.N.value}{self.index}.{self.end.value}"

    @classmethod
    def parse(cls, name: str) -> "AnchorRef":
        """The anchor a name such as "N3.tail" stands for; ValueError for anything else."""
        chunk, _, end = name.partition(".")
        if not chunk.startswith(ChunkKind.N.value) or not chunk[1:].isdigit():
            raise ValueError(f"not an anchor name: {name!r} (expected N<index>.head or N<index>.tail)")
        return cls(int(chunk[1:]), AnchorEnd(end))


@dataclass(frozen=True)
class Chunk:
    """One chunk of the timeline, the one shape from the plan to the pipeline: N chunks carry the timeline, an
    I chunk fills the seam after N(index). A plain "N"/"I" given as `kind` becomes the enum."""

    kind: ChunkKind
    index: int
    first_frame: int
    n_frames: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ChunkKind(self.kind))  # ValueError naming anything but N or I

    @property
    def end_frame(self) -> int:
        return self.first_frame + self.n_frames

    @property
    def name(self) -> str:
        return f"{self.kind.value}{self.index}"

    # THE anchor rule: which anchors a chunk reads, leaves and releases. The generation order is N0 N1 I0 N2 I1 …:
    # N(k) continues from N(k-1)'s tail; I(k) fills the seam between N(k)'s tail and N(k+1)'s head.

    def anchors_read(self) -> tuple[AnchorRef, ...]:
        """The anchors this chunk is conditioned on: N(k) reads N(k-1)'s tail (N0 none); I(k) reads N(k)'s tail
        (its left) and N(k+1)'s head (its right), in that order."""
        if self.kind is ChunkKind.N:
            return (AnchorRef(self.index - 1, AnchorEnd.TAIL),) if self.index > 0 else ()
        return AnchorRef(self.index, AnchorEnd.TAIL), AnchorRef(self.index + 1, AnchorEnd.HEAD)

    def anchors_left(self) -> tuple[AnchorRef, ...]:
        """The anchors this chunk leaves behind (and its checkpoint stores): an N chunk its head and tail."""
        if self.kind is ChunkKind.N:
            return AnchorRef(self.index, AnchorEnd.HEAD), AnchorRef(self.index, AnchorEnd.TAIL)
        return ()

    def anchors_released(self, held: Iterable[AnchorRef]) -> tuple[AnchorRef, ...]:
        """Of the anchors `held`, those nothing after this chunk reads. After N(k), I(k-2) is done, so N(k-1)'s
        head and everything older than N(k-1) go (this also bounds seams without an I chunk; N(k-1)'s tail stays
        for I(k-1)). After I(k), its seam is done: N(k)'s head and tail and N(k+1)'s head go."""
        if self.kind is ChunkKind.N:
            stale = AnchorRef(self.index - 1, AnchorEnd.HEAD)
            return tuple(ref for ref in held if ref.index < self.index - 1 or ref == stale)
        seam = {AnchorRef(self.index, AnchorEnd.HEAD), *self.anchors_read()}
        return tuple(ref for ref in held if ref in seam)

    @property
    def depends_on(self) -> tuple[tuple[ChunkKind, int], ...]:
        """Chunks that must be generated first: the N chunks that leave the anchors this one reads."""
        return tuple((ChunkKind.N, ref.index) for ref in self.anchors_read())
