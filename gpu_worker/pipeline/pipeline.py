"""The Pipeline: runs the stages for one chunk and owns the session state between chunks.

Only two things survive a chunk: the static reference conditioning (computed once per session) and
the anchors (a few named arrays at each N chunk's first and last frame). Audio features, noise,
latents and frames are released before `run_chunk` returns, so peak memory depends on the chunk
size and never on the session length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from gpu_worker.pipeline.module import A2VOutput, Anchor, Family, Reference
from gpu_worker.pipeline.progress import Progress, no_progress
from gpu_worker.pipeline.stages import DEFAULT_STAGES, ChunkState, Stage
from gpu_worker.pipeline.types import AudioSource, ChunkRequest, FrameSink, OutputSpec, chunk_rng


class AnchorStore:
    """Anchors by (chunk kind, index, "head" | "tail"), pruned as soon as nothing can need them.

    N(k)'s tail conditions N(k+1) and anchors I(k) on the left; N(k+1)'s head anchors I(k) on the
    right. Once I(k) is done (or N(k+1) exists and no I chunk will come), the older ones go.
    """

    def __init__(self) -> None:
        self._anchors: dict[tuple[str, int, str], Anchor] = {}

    def put_n(self, index: int, generated: A2VOutput) -> None:
        if generated.head is None or generated.tail is None:
            raise RuntimeError(f"an N chunk must leave head and tail anchors (chunk N{index})")
        self._anchors[("N", index, "head")] = generated.head
        self._anchors[("N", index, "tail")] = generated.tail
        # Generation order is N0 N1 I0 N2 I1 …: by the time N(k) runs, I(k-2) is done, so nothing can need
        # N(k-1)'s head or anything older than N(k-1)'s tail (this also bounds seams that have no I chunk).
        for key in list(self._anchors):
            if key[1] < index - 1 or key == ("N", index - 1, "head"):
                del self._anchors[key]

    def put_one(self, kind: str, index: int, end: str, anchor: Anchor) -> None:
        """Put back one anchor loaded from storage (a node that did not generate its chunk)."""
        self._anchors[(kind, index, end)] = anchor

    def get(self, kind: str, index: int, end: str) -> Anchor:
        try:
            return self._anchors[(kind, index, end)]
        except KeyError:
            raise LookupError(
                f"no anchor {kind}{index}.{end}: its chunk has not been generated on this node, "
                f"or was released (have {sorted(self.names())})"
            ) from None

    def release_seam(self, index: int) -> None:
        """The seam between N(index) and N(index+1) is done: nothing needs N(index).tail or N(index+1).head."""
        self._anchors.pop(("N", index, "tail"), None)
        self._anchors.pop(("N", index + 1, "head"), None)
        self._anchors.pop(("N", index, "head"), None)

    def names(self) -> list[str]:
        return [f"{kind}{index}.{end}" for kind, index, end in self._anchors]

    def export(self) -> dict[str, np.ndarray]:
        """Flat named arrays (for a checkpoint): `N3.tail.<field>`."""
        return {
            f"{kind}{index}.{end}.{key}": value
            for (kind, index, end), anchor in self._anchors.items()
            for key, value in anchor.items()
        }

    def restore(self, flat: dict[str, np.ndarray]) -> None:
        self._anchors.clear()
        for name, value in flat.items():
            chunk, end, key = name.split(".", 2)
            self._anchors.setdefault((chunk[0], int(chunk[1:]), end), {})[key] = value

    def __len__(self) -> int:
        return len(self._anchors)


@dataclass
class Session:
    """What the pipeline keeps for one session: the family, its reference conditioning and the anchors."""

    family: Family
    output: OutputSpec
    audio: AudioSource
    reference: Reference
    anchors: AnchorStore = field(default_factory=AnchorStore)

    @property
    def frame_width(self) -> int:
        return self.family.reference.frame_size(self.reference)[0]

    @property
    def frame_height(self) -> int:
        return self.family.reference.frame_size(self.reference)[1]


@dataclass
class ChunkResult:
    chunk: ChunkRequest
    frame_hashes: list[str]
    stage_ms: dict[str, float]


class Pipeline:
    """Runs a family's modules, stage by stage, for one chunk at a time."""

    def __init__(self, family: Family, stages: tuple[type[Stage], ...] = DEFAULT_STAGES) -> None:
        self.family = family
        self.stages: list[Stage] = [stage() for stage in stages]
        family.load()

    def start_session(
        self, portrait: np.ndarray, output: OutputSpec, audio: AudioSource, reference: Reference | None = None
    ) -> Session:
        """Encode the reference once (or reuse a stored one, e.g. after moving to another node)."""
        if reference is None:
            reference = self.family.reference.encode(portrait, output)
        return Session(family=self.family, output=output, audio=audio, reference=reference)

    def run_chunk(
        self, session: Session, chunk: ChunkRequest, sink: FrameSink, progress: Progress = no_progress
    ) -> ChunkResult:
        """Run every stage for `chunk`, writing its frames to `sink`; returns hashes and stage timings.
        `progress` hears of each stage as it starts, and of the steps of long ones."""
        rng = chunk_rng(chunk.seed, chunk.kind, chunk.index)
        state = ChunkState(chunk=chunk, rng=rng, sink=sink, progress=progress)
        stage_ms: dict[str, float] = {}
        for stage in self.stages:
            progress(stage.name)
            started = time.perf_counter()
            stage.run(session, state)
            stage_ms[stage.name] = (time.perf_counter() - started) * 1000
        if chunk.kind == "I":
            session.anchors.release_seam(chunk.index)
        return ChunkResult(chunk=chunk, frame_hashes=state.frame_hashes, stage_ms=stage_ms)
