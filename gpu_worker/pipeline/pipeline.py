"""The Pipeline: runs the stages for one chunk and owns the session state between chunks.

Only two things survive a chunk: the static reference conditioning (computed once per session) and
the anchors (a few named arrays at each N chunk's first and last frame). Audio features, noise,
latents and frames are released before `run_chunk` returns, so peak memory depends on the chunk
size and never on the session length. (A render's speech features, encoded whole when it starts
(`encode_speech`), are the one session-long array: the node keeps them in storage and each chunk reads
its rows.)

Residency (`monologue.contracts.Residency`, the node's `residency` setting). RESIDENT keeps every model
of the family on the accelerator. SWITCH keeps there only the models of the stage that is running (the
reference encoder's while a session starts): before each stage, `ModelSwitcher.activate` frees the
previous stage's weights (nothing is copied back: the host copy taken at load is the truth) and arms the
stage's own, which then stream in block by block, each block's copy overlapping the block before's
compute; after each stage, the next stage's root and first blocks start copying on a side stream (CUDA
only). Frames are bit-identical in both modes: the same weights run the same kernels. Families whose
modules have no torch models (warp) switch nothing.

Stage timings (`ChunkResult.stage_ms`, ms per stage name) include the device's work: when the family runs
on CUDA the compute stream is synchronised at every stage boundary, so a stage's kernels are charged to
it and not to the next stage that happens to wait for them. In SWITCH mode one more key, "switch", is the
visible cost of the chunk's switches (the compute stream's stalls for weights, `SwitchReport.visible_ms`,
summed); it is part of the stage times, not added to them. RESIDENT results have no "switch" key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_worker.pipeline.burn_in import CaptionBurner
from gpu_worker.pipeline.module import A2VOutput, Anchor, ModelSet, Reference, Role
from gpu_worker.pipeline.progress import Progress, no_progress
from gpu_worker.pipeline.stages import DEFAULT_STAGES, ChunkState, Stage
from gpu_worker.pipeline.types import (
    ArrayFeatures,
    AudioSource,
    ChunkRequest,
    FrameSink,
    OutputSpec,
    SpeechFeatures,
    chunk_rng,
)
from monologue.contracts.session import AnchorRef, Chunk, Residency

if TYPE_CHECKING:
    from gpu_worker.distributed.offload import ModelSwitcher, SwitchReport
    from gpu_worker.tts import TimedPhone

SWITCH_KEY = "switch"  # the stage_ms entry with a chunk's visible switch time (SWITCH residency)


class AnchorStore:
    """Anchors by `AnchorRef` (N index, head or tail), released once a chunk is done and nothing after it can
    need them: which anchors a chunk reads, leaves and releases is `Chunk`'s rule (`anchors_read`,
    `anchors_left`, `anchors_released`), so at most four are held whatever the session's length."""

    def __init__(self) -> None:
        self._anchors: dict[AnchorRef, Anchor] = {}

    def read(self, chunk: Chunk) -> list[Anchor]:
        """The anchors `chunk` is conditioned on, in `Chunk.anchors_read`'s order."""
        return [self.get(ref) for ref in chunk.anchors_read()]

    def put_left(self, chunk: Chunk, generated: A2VOutput) -> None:
        """Keep the anchors `chunk` leaves (an N chunk: its head and tail)."""
        for ref in chunk.anchors_left():
            anchor = generated.anchor(ref.end)
            if anchor is None:
                raise RuntimeError(f"an N chunk must leave head and tail anchors (chunk {chunk.name})")
            self._anchors[ref] = anchor

    def release(self, chunk: Chunk) -> None:
        """`chunk` is done: drop what nothing after it reads. Not before it is done: a chunk that fails in a
        later stage runs again, and reads its anchors again."""
        for ref in chunk.anchors_released(list(self._anchors)):
            del self._anchors[ref]

    def put_one(self, ref: AnchorRef, anchor: Anchor) -> None:
        """Put back one anchor loaded from storage (a node that did not generate its chunk)."""
        self._anchors[ref] = anchor

    def get(self, ref: AnchorRef) -> Anchor:
        try:
            return self._anchors[ref]
        except KeyError:
            raise LookupError(
                f"no anchor {ref.name}: its chunk has not been generated on this node, "
                f"or was released (have {sorted(self.names())})"
            ) from None

    def __contains__(self, ref: object) -> bool:
        return ref in self._anchors

    def names(self) -> list[str]:
        return [ref.name for ref in self._anchors]

    def export(self) -> dict[str, np.ndarray]:
        """Flat named arrays (for a checkpoint): `N3.tail.<field>`."""
        return {f"{ref.name}.{key}": value for ref, anchor in self._anchors.items() for key, value in anchor.items()}

    def restore(self, flat: dict[str, np.ndarray]) -> None:
        self._anchors.clear()
        for name, value in flat.items():
            chunk, end, key = name.split(".", 2)
            self._anchors.setdefault(AnchorRef.parse(f"{chunk}.{end}"), {})[key] = value

    def __len__(self) -> int:
        return len(self._anchors)


@dataclass
class Session:
    """What the pipeline keeps for one session: the family's models, its reference conditioning and the anchors."""

    models: ModelSet
    output: OutputSpec
    audio: AudioSource
    reference: Reference
    anchors: AnchorStore = field(default_factory=AnchorStore)
    prepared: Any = None  # the context module's work over the whole speech (`ContextGenerator.prepare`), if any
    speech: SpeechFeatures | None = None  # a render's speech encoded whole (`ContextGenerator.encode_speech`), if any
    captions: CaptionBurner | None = None  # captions=burn: draws the cues into the decoded frames

    @property
    def frame_width(self) -> int:
        return self.models.reference.frame_size(self.reference)[0]

    @property
    def frame_height(self) -> int:
        return self.models.reference.frame_size(self.reference)[1]


class StageTimer:
    """Milliseconds between `start` and `stop`, the device's queued work included: on CUDA both ends wait
    for the compute stream (not the copy streams, whose prefetches may keep running); on CPU perf_counter."""

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._started = 0.0

    def start(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        return (time.perf_counter() - self._started) * 1000

    def _sync(self) -> None:
        if self._cuda:
            import torch  # only families on CUDA get here

            torch.cuda.current_stream().synchronize()


class StageSwitcher:
    """SWITCH residency: gives the accelerator to one role's models at a time through a ModelSwitcher, and
    keeps the reports of the switches made since `take_visible_ms` last ran.

    It loads the models itself, one module at a time, registering each module's models (which takes their
    host copy and frees their device memory) before the next loads: the device never holds more than one
    module's weights, even at load."""

    def __init__(self, model_set: ModelSet) -> None:
        self._models: dict[Role, list[Any]] = {}
        self._switcher: ModelSwitcher | None = None
        self._reports: list[SwitchReport] = []
        for role in Role:
            module = model_set.module(role)
            if not module.loaded:
                module.load()
            self._models[role] = models = module.device_models()
            if not models:
                continue
            if self._switcher is None:
                from gpu_worker.distributed.offload import ModelSwitcher  # torch: only families with torch models

                self._switcher, device = ModelSwitcher(module.device), module.device
            elif module.device != device:
                raise ValueError(
                    f"{model_set.name}: switch residency needs one device, got {device} and {module.device}"
                )
            for index, model in enumerate(models):
                self._switcher.register(model, name=f"{role.value}.{index}.{type(model).__name__}")

    def enter(self, role: Role) -> None:
        """Give the device to `role`'s models (and free everyone else's)."""
        if self._switcher is None:
            return
        models = self._models[role]
        if models:
            self._reports.append(self._switcher.activate(models))
        else:
            self._switcher.deactivate()

    def prefetch(self, role: Role) -> None:
        """Start copying `role`'s first blocks while the current stage's work finishes (CUDA only)."""
        if self._switcher is not None:
            self._switcher.prefetch(self._models[role])

    def take_visible_ms(self) -> float:
        """The visible ms of the switches since the last call (reading them waits for their events)."""
        total = sum(report.visible_ms for report in self._reports)
        self._reports.clear()
        return total


@dataclass
class ChunkResult:
    chunk: ChunkRequest
    frame_hashes: list[str]
    stage_ms: dict[str, float]


class Pipeline:
    """Runs a family's modules, stage by stage, for one chunk at a time, with its models resident on the
    accelerator or switched in per stage (`residency`, see the module docstring)."""

    def __init__(
        self,
        models: ModelSet,
        stages: tuple[type[Stage], ...] = DEFAULT_STAGES,
        *,
        residency: Residency = Residency.RESIDENT,
    ) -> None:
        self.models = models
        self.stages: list[Stage] = [stage() for stage in stages]
        self.residency = residency
        self._switch = StageSwitcher(models) if residency is Residency.SWITCH else None  # loads the models
        models.load()
        self._timer = StageTimer(cuda=any(module.device.startswith("cuda") for module in models.modules()))

    def start_session(
        self, portrait: np.ndarray, output: OutputSpec, audio: AudioSource, reference: Reference | None = None
    ) -> Session:
        """Encode the reference once (or reuse a stored one, e.g. after moving to another node)."""
        if reference is None:
            if self._switch is not None:
                self._switch.enter(Role.REFERENCE)
            reference = self.models.reference.encode(portrait, output)
        return Session(models=self.models, output=output, audio=audio, reference=reference)

    @property
    def encodes_speech(self) -> bool:
        """Whether the family encodes a render's whole speech once (`encode_speech` returns rows)."""
        return self.models.context.encodes_speech

    def encode_speech(self, session: Session) -> np.ndarray | None:
        """Encode a render's whole speech once, before its first chunk (`ContextGenerator.encode_speech`), and keep
        the rows in memory as the session's `speech`; returns them (None: the family encodes per chunk). A node
        stores them and reads them back by range instead (`activities.speech_features`), as a node resuming the
        session does. Never for a live session: its speech is still arriving, and its chunks encode their own."""
        if self._switch is not None:
            self._switch.enter(Role.CONTEXT)
        rows = self.models.context.encode_speech(session.audio, session.output)
        session.speech = None if rows is None else ArrayFeatures(rows)
        return rows

    def prepare_speech(self, session: Session, transcript: str) -> None:
        """Let the context module prepare the session's whole speech with its transcript, before the first
        chunk (CPU work; done again, deterministically, when the session is rebuilt on another node)."""
        session.prepared = self.models.context.prepare(session.audio, transcript)

    def use_phones(self, session: Session, phones: tuple[TimedPhone, ...]) -> None:
        """Give the context module the phones a session's speech was synthesised from (text in), before the first
        chunk: the warp family's visemes follow them instead of recognising the audio."""
        session.prepared = self.models.context.prepare_phones(session.audio, phones)

    def run_chunk(
        self, session: Session, chunk: ChunkRequest, sink: FrameSink, progress: Progress = no_progress
    ) -> ChunkResult:
        """Run every stage for `chunk`, writing its frames to `sink`; returns hashes and stage timings.
        `progress` hears of each stage as it starts, and of the steps of long ones."""
        rng = chunk_rng(chunk.seed, chunk.kind, chunk.index)
        state = ChunkState(chunk=chunk, rng=rng, sink=sink, progress=progress)
        stage_ms: dict[str, float] = {}
        switch = self._switch
        if switch is not None:
            switch.take_visible_ms()  # the reference encoder's switch, or an aborted chunk's: not this chunk's
        for position, stage in enumerate(self.stages):
            progress(stage.name)
            self._timer.start()
            if switch is not None:
                switch.enter(stage.role)
            stage.run(session, state)
            if switch is not None:  # the next stage's (or the next chunk's first) blocks start coming in
                switch.prefetch(self.stages[(position + 1) % len(self.stages)].role)
            stage_ms[stage.name] = self._timer.stop()
        if switch is not None:
            stage_ms[SWITCH_KEY] = switch.take_visible_ms()
        session.anchors.release(chunk.chunk)
        return ChunkResult(chunk=chunk, frame_hashes=state.frame_hashes, stage_ms=stage_ms)
