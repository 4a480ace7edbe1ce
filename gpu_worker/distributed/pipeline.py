"""DistributedPipeline: rank 0's Pipeline on a multi-GPU node. Same `start_session` and `run_chunk` as
`gpu_worker.pipeline.Pipeline` (so the node's activities use it unchanged), but every rank runs each call.

Sharded models need every rank in every forward: the ranks all-gather each block together. So every
rank holds its own Pipeline of the same family and a *mirror* of each session (its reference
conditioning and anchors), and runs the same stages on the same inputs. Only rank 0 publishes: the
others decode into a sink that drops the frames. What crosses the control plane per chunk is small:
the chunk, its audio window (the samples the context stage reads), the rows of a render's speech
features it reads (encoded whole on rank 0, `encode_speech`) and the anchors it reads. The
reference conditioning crosses once per session (every rank encodes the portrait, since the encoder may
be sharded, then all keep rank 0's encoding, the one that is stored), or again when a rank lost its
mirror.

Sequence parallelism. With an SP group (`RankGroup.sp`, from MONOLOGUE_SP_DEGREE: every rank by default)
each rank runs its chunks under `sequence_parallel`: the models that support it (the dit and infinitetalk
families' DiTs and VAE decoders) split their work across the group inside each forward and all-gather the result,
so every rank still sees the full, identical output of every stage, and nothing here changes but the speed. Models
that do not support it ignore it and run whole on every rank, as without SP.

Mirrors live in an LRU that every rank updates with the same operations in the same order, so rank 0
knows, without asking, whether the others still hold a session; after a failed step every rank
drops its mirrors and the next chunk of each session brings its reference again.
"""

from __future__ import annotations

import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpu_worker.distributed.errors import StepFailed
from gpu_worker.distributed.runtime import RankContext, RankGroup
from gpu_worker.distributed.sequence import sequence_parallel
from gpu_worker.models import build_family
from gpu_worker.pipeline.module import Anchor, ModelSet, Reference
from gpu_worker.pipeline.pipeline import ChunkResult, Pipeline, Session
from gpu_worker.pipeline.progress import Progress, no_progress
from gpu_worker.pipeline.stages import DEFAULT_STAGES, Stage
from gpu_worker.pipeline.types import ArrayFeatures, AudioSource, ChunkRequest, FrameSink, OutputSpec
from monologue.contracts import Family
from monologue.contracts.session import AnchorRef
from monologue.errors import InputError

FamilyBuilder = Callable[[Family], ModelSet]

MIRRORED_SESSIONS = 8  # twice the node's session cache: a session it still holds is never evicted first


class ForwardedAudio:
    """The audio a rank other than 0 sees: exactly the window rank 0 sent for the current chunk.

    A read outside it means this module and ContextStage disagree about the window: fail loudly."""

    def __init__(self, rate: int, total_samples: int | None, start: int = 0, samples: np.ndarray | None = None) -> None:
        self.rate = rate
        self.total_samples = total_samples
        self.start = start
        self.samples = samples if samples is not None else np.zeros(0, dtype=np.float32)

    def read(self, start: int, end: int) -> np.ndarray:
        if start < self.start or end > self.start + len(self.samples):
            raise LookupError(
                f"audio [{start}, {end}) requested, but rank 0 sent [{self.start}, {self.start + len(self.samples)})"
            )
        return self.samples[start - self.start : end - self.start].copy()


class DiscardFrames:
    """The sink of ranks other than 0: rank 0 alone encodes and publishes."""

    def write(self, frames: np.ndarray) -> None:
        pass


class SessionMirrors:
    """Each rank's sessions by key, least recently used first out, the same on every rank."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def put(self, key: str, session: Session) -> None:
        self._sessions[key] = session
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.capacity:
            self._sessions.popitem(last=False)

    def get(self, key: str) -> Session | None:
        session = self._sessions.get(key)
        if session is not None:
            self._sessions.move_to_end(key)
        return session

    def clear(self) -> None:
        self._sessions.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._sessions


@dataclass(frozen=True)
class LoadFamily:
    """Build and load a family on every rank (a sharded family shards its models here, all ranks at once)."""

    family: Family
    builder: FamilyBuilder
    stages: tuple[type[Stage], ...]

    def run(self, context: RankContext) -> Pipeline:
        pipelines: dict[Family, Pipeline] = context.local.setdefault("pipelines", {})
        if self.family not in pipelines:
            # Loaded under SP: compile warm-ups (the SR's attention buckets) are for the heads a rank runs.
            with sequence_parallel(context.group.sp):
                pipelines[self.family] = Pipeline(self.builder(self.family), self.stages)
        return pipelines[self.family]


@dataclass(frozen=True)
class StartSession:
    """Set up a session on every rank: encode the portrait (every rank, as the encoder may be sharded) or
    take the stored reference conditioning."""

    family: Family
    key: str
    output: OutputSpec
    audio_rate: int
    total_samples: int | None
    portrait: np.ndarray | None  # sent only when the reference must be encoded
    reference: Reference | None
    capacity: int

    def run(self, context: RankContext) -> Session:
        pipeline: Pipeline = context.local["pipelines"][self.family]
        audio: AudioSource | None = context.extras.get("audio")  # rank 0: the session's own audio
        if audio is None:
            audio = ForwardedAudio(self.audio_rate, self.total_samples)  # filled chunk by chunk
        portrait = self.portrait if self.portrait is not None else np.zeros((0, 0, 3), dtype=np.uint8)
        session = pipeline.start_session(portrait, self.output, audio, self.reference)
        _mirrors(context, self.capacity).put(self.key, session)
        return session


@dataclass(frozen=True)
class AdoptReference:
    """Give every rank rank 0's encoding of the reference, so the mirrors never depend on every GPU having
    encoded the portrait bit for bit alike (and match what a session brought back from storage sees)."""

    key: str
    reference: Reference

    def run(self, context: RankContext) -> None:
        if context.rank == 0:
            return
        session = _mirrors(context, MIRRORED_SESSIONS).get(self.key)
        if session is None:
            raise LookupError(f"rank {context.rank} holds no mirror of session {self.key}")
        session.reference = self.reference


@dataclass(frozen=True)
class RunChunk:
    """Run every stage of one chunk on every rank; rank 0 writes the frames to the real sink."""

    family: Family
    key: str
    chunk: ChunkRequest
    audio_start: int
    audio: np.ndarray
    total_samples: int | None  # grows while a live session's audio arrives
    anchors: dict[AnchorRef, Anchor]  # the ones the chunk reads (`Chunk.anchors_read`)
    rehydrate: StartSession | None  # the session's reference, when the other ranks no longer hold it
    capacity: int
    speech: ArrayFeatures | None = None  # a render's speech feature rows the chunk reads (rank 0 encoded them)

    def run(self, context: RankContext) -> ChunkResult:
        pipeline: Pipeline = context.local["pipelines"][self.family]
        mirrors = _mirrors(context, self.capacity)
        if context.rank == 0:
            session: Session = context.extras["session"]
            sink: FrameSink = context.extras["sink"]
            progress: Progress = context.extras["progress"]  # rank 0 runs in the activity's thread: it heartbeats
            mirrors.put(self.key, session)  # the same LRU move the other ranks make
        else:
            found = mirrors.get(self.key)
            if found is None:
                if self.rehydrate is None:
                    raise LookupError(f"rank {context.rank} holds no mirror of session {self.key}")
                found = self.rehydrate.run(context)
            session, sink, progress = found, DiscardFrames(), no_progress
            session.audio = ForwardedAudio(session.audio.rate, self.total_samples, self.audio_start, self.audio)
            session.speech = self.speech
            for ref, anchor in self.anchors.items():
                session.anchors.put_one(ref, anchor)
        with sequence_parallel(context.group.sp):  # None (SP off): the models run whole on every rank
            return pipeline.run_chunk(session, self.chunk, sink, progress)


def _mirrors(context: RankContext, capacity: int) -> SessionMirrors:
    mirrors: SessionMirrors | None = context.local.get("sessions")
    if mirrors is None:
        mirrors = context.local["sessions"] = SessionMirrors(capacity)
        context.group.on_step_failure(mirrors.clear)  # whatever a failed step left behind is not trusted
    return mirrors


class DistributedPipeline(Pipeline):
    """Rank 0's stand-in for `Pipeline(build_family(family))`: each call is a step every rank runs."""

    def __init__(
        self,
        group: RankGroup,
        family: Family,
        *,
        builder: FamilyBuilder = build_family,
        stages: tuple[type[Stage], ...] = DEFAULT_STAGES,
        mirrors: int = MIRRORED_SESSIONS,
        check_replicas: bool = False,
    ) -> None:
        """builder: a module-level function (it is pickled by name) from family to its ModelSet.
        check_replicas: gather every rank's frame hashes and fail the chunk if they differ (debugging
        a family's determinism across ranks; costs one more round trip per chunk)."""
        # Not Pipeline.__init__: building and loading the family is a step that every rank runs together.
        if not group.is_leader:
            raise RuntimeError("DistributedPipeline runs on rank 0; the other ranks serve")
        self.group = group
        self.family = family
        self._capacity = mirrors
        self._check_replicas = check_replicas
        self._keys: dict[int, str] = {}  # id(session) → key, while the session object lives
        local = group.run_on_all(LoadFamily(family, builder, stages))
        self.models = local.models
        self.stages = local.stages

    def start_session(
        self, portrait: np.ndarray, output: OutputSpec, audio: AudioSource, reference: Reference | None = None
    ) -> Session:
        work = self._start_work(uuid.uuid4().hex, output, audio, portrait=portrait, reference=reference)
        with self.group.exclusive():
            session = self.group.run_on_all(work, extras={"audio": audio})
            if reference is None:  # every rank encoded the portrait: keep rank 0's, which is the one stored
                self.group.run_on_all(AdoptReference(work.key, session.reference))
        self._keys[id(session)] = work.key
        weakref.finalize(session, self._keys.pop, id(session), None)
        return session

    def encode_speech(self, session: Session) -> np.ndarray | None:
        """On rank 0 alone (wav2vec2 is never sharded, and only rank 0 has the session's whole audio); each chunk
        then forwards the rows it reads to the other ranks (`RunChunk.speech`), so every rank sees rank 0's."""
        with self.group.exclusive():
            rows = self.models.context.encode_speech(session.audio, session.output)
        session.speech = None if rows is None else ArrayFeatures(rows)
        return rows

    def prepare_speech(self, session: Session, transcript: str) -> None:
        """Not on a multi-rank node yet: the ranks' mirrored sessions would each need the prepared speech."""
        raise InputError("a transcript (warp forced alignment) runs on one-rank nodes only")

    def run_chunk(
        self, session: Session, chunk: ChunkRequest, sink: FrameSink, progress: Progress = no_progress
    ) -> ChunkResult:
        key = self._keys.get(id(session))
        if key is None:
            raise ValueError("this session was not started by this DistributedPipeline")
        start, end = self.models.context.audio_range(chunk, session.output.fps, session.audio.rate)
        samples = session.audio.read(start, end)
        anchors = {ref: session.anchors.get(ref) for ref in chunk.chunk.anchors_read()}
        speech = None
        if session.speech is not None:  # the rows the chunk reads, clamped to the encoding as `read` clamps them
            first, end = self.models.context.speech_range(chunk)
            first, end = max(first, 0), min(end, session.speech.frames)
            speech = ArrayFeatures(session.speech.read(first, end), first, session.speech.frames)
        extras = {"session": session, "sink": sink, "progress": progress}  # rank 0's alone
        with self.group.exclusive():  # the mirrors cannot change between this check and the step
            rehydrate = None
            if key not in _mirrors(self.group.context, self._capacity):
                rehydrate = self._start_work(key, session.output, session.audio, reference=session.reference)
            work = RunChunk(
                self.family,
                key,
                chunk,
                start,
                samples,
                session.audio.total_samples,
                anchors,
                rehydrate,
                self._capacity,
                speech,
            )
            if not self._check_replicas:
                return self.group.run_on_all(work, extras=extras)
            results = self.group.gather_from_all(work, extras=extras)
        differing = [rank for rank, result in enumerate(results) if result.frame_hashes != results[0].frame_hashes]
        if differing:
            raise StepFailed(f"chunk {chunk.name}: ranks {differing} decoded different frames than rank 0")
        return results[0]

    def _start_work(
        self,
        key: str,
        output: OutputSpec,
        audio: AudioSource,
        *,
        portrait: np.ndarray | None = None,
        reference: Reference | None = None,
    ) -> StartSession:
        return StartSession(
            family=self.family,
            key=key,
            output=output,
            audio_rate=audio.rate,
            total_samples=audio.total_samples,
            portrait=portrait if reference is None else None,
            reference=reference,
            capacity=self._capacity,
        )
