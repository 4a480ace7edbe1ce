"""A session's model: its kinds, statuses and chunks, and its options (`RenderOptions`, THE definition of
every option), all of which cross Temporal inside the activity and workflow inputs (`monologue.contracts`
re-exports every name here).

Standard library only: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations` here: Temporal's converter resolves these field types at
# run time inside the workflow sandbox, where string annotations of nested dataclasses fail to resolve.
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal, NamedTuple

from monologue.contracts.frames import INFINITETALK_SIZES, MAX_SIDE, MIN_SIDE, check_output_size


class SessionKind(StrEnum):
    """A render has all its audio up front; a live session's audio streams in while it runs."""

    RENDER = "render"
    LIVE = "live"


class SessionStatus(StrEnum):
    """Where a session is; the workflow decides, the database follows (StrEnum: equal to the stored strings)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.CANCELLED})
RESUMABLE = frozenset({SessionStatus.FAILED, SessionStatus.CANCELLED})  # resume starts these again


class RenderPriority(StrEnum):
    """How urgently a render asks for a node: high (a key with the `priority` scope), normal, or low (batch work
    that yields first). Live sessions and sessions moving to another node have classes of their own (`QueueClass`)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class QueueClass(StrEnum):
    """A session's place in the lease queue, most urgent first: a live session; a session moving after its node was
    lost (or resuming, or continuing as new); a render that gave its slot up to one of those (`yielded`: below them, so
    it never competes for the slot it gave); then renders by `RenderPriority`. `priority_key` is Temporal's
    (`temporalio.common.Priority`: lower runs first, 1-6; the servers run with `matching.priorityLevels=6`,
    docs/scheduling.md)."""

    LIVE = "live"
    MOVING = "moving"
    YIELDED = "yielded"
    HIGH = RenderPriority.HIGH.value
    NORMAL = RenderPriority.NORMAL.value
    LOW = RenderPriority.LOW.value

    @property
    def priority_key(self) -> int:
        return list(QueueClass).index(self) + 1

    @classmethod
    def of(cls, kind: "SessionKind", priority: RenderPriority, *, moving: bool, yielded: bool = False) -> "QueueClass":
        """THE rule: live sessions first, then a session already under way (moving, then one that yielded), then
        renders by their priority."""
        if kind is SessionKind.LIVE:
            return cls.LIVE
        if moving:
            return cls.MOVING
        return cls.YIELDED if yielded else cls(priority.value)


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


@dataclass(frozen=True)
class Bounds:
    """What an option accepts, kept with its definition (`Annotated[int, Bounds(...)]`): the API's schema, the
    settings and the CLI read it from here (`monologue/options.py`), so a limit is written once."""

    doc: str
    ge: float | None = None
    le: float | None = None
    pattern: str | None = None
    max_length: int | None = None
    multiple_of: int | None = None
    # The default a new session gets (the HTTP form, the settings, the CLI), where it differs from the field's
    # dataclass default, which is what an input recorded before the option existed means (a running session's
    # Temporal payloads and stored rows have no such field). None: the dataclass default serves both.
    new_sessions: object = None


class Family(StrEnum):
    """Model family: warp (CPU, real time), dit (the diffusion-transformer family) or infinitetalk (the open
    InfiniteTalk checkpoints: Wan2.1-I2V-14B with its audio adapter)."""

    WARP = "warp"
    DIT = "dit"
    INFINITETALK = "infinitetalk"

    @property
    def grid(self) -> "LatentGrid":
        """The family's latent grid (`LATENT_GRIDS`): the workflows plan chunks on it, so it is part of the
        contract; what a node loads for the family is in `gpu_worker.models.FAMILIES`."""
        return LATENT_GRIDS[self]

    @property
    def output_sizes(self) -> "frozenset[tuple[int, int]] | None":
        """The (width, height) the family renders when a session asks for a size (`OUTPUT_SIZES`), or None: any
        even size within the bounds (`contracts.frames`)."""
        return OUTPUT_SIZES[self]

    @property
    def temporal_stride(self) -> int:
        """Video frames per latent frame: every chunk boundary but a session's end falls on the latent grid."""
        return self.grid.stride

    @property
    def leading_frames(self) -> int:
        """Frames the first latent stands for alone before the stride starts (see `LatentGrid.lead`)."""
        return self.grid.lead

    def first_chunk_on_grid(self, frames: int) -> int:
        """The smallest first-chunk size of at least `frames` frames on this family's grid (lead + a multiple
        of the stride); 0 stays 0 ("derived"). The live sessions' short first chunk is a setting for every family."""
        if frames <= 0:
            return 0
        lead, stride = self.leading_frames, self.temporal_stride
        return lead + -(-max(frames - lead, 0) // stride) * stride


class LatentGrid(NamedTuple):
    """Where a family's chunk boundaries may fall: `lead` + a multiple of `stride` frames from the start."""

    stride: int  # video frames per latent frame
    lead: int  # frames the first latent stands for alone before the stride starts


# One row per family. The dit family's video VAE compresses 4 frames into one latent (gpu_worker/models/dit/vae.py
# checks its checkpoint agrees), as does infinitetalk's Wan VAE, which also encodes a video's first frame on its own
# (1 + 4k frames make k + 1 latents: its first chunk has 1 + 4k frames, every later boundary falls on 1 + 4m); warp
# works frame by frame.
LATENT_GRIDS: dict[Family, LatentGrid] = {
    Family.WARP: LatentGrid(stride=1, lead=0),
    Family.DIT: LatentGrid(stride=4, lead=0),
    Family.INFINITETALK: LatentGrid(stride=4, lead=1),
}

# The sizes a session may ask each family for. Warp frames its portrait to any size; dit generates on a canvas
# rounded up to its patch grid and crops that back to the size asked (as it does for the named resolutions), so
# both take any even size; infinitetalk renders only its buckets, the sizes Wan2.1 was trained at.
OUTPUT_SIZES: dict[Family, frozenset[tuple[int, int]] | None] = {
    Family.WARP: None,
    Family.DIT: None,
    Family.INFINITETALK: INFINITETALK_SIZES,
}


class Residency(StrEnum):
    """Where a node keeps the models of a render that it is not running: RESIDENT keeps every model on the
    accelerator (fastest, needs memory for all of them); SWITCH keeps only the running stage's models there
    and parks the others in pinned host memory, streaming each in block by block when its stage starts."""

    RESIDENT = "resident"
    SWITCH = "switch"


class Resolution(StrEnum):
    """Output size: the portrait's own, 512x512, 1280x720 or 1920x1080 (tall portraits get the tall variant)."""

    SOURCE = "source"
    SQUARE_512 = "512"
    HD_720 = "720p"
    HD_1080 = "1080p"


class LipSync(StrEnum):
    """How the warp family moves the lips: visemes (mouth shapes from phoneme timings, scaled by loudness) or
    loudness (the opening follows loudness alone; the behaviour of sessions from before visemes)."""

    VISEMES = "visemes"
    LOUDNESS = "loudness"


class SamplingPreset(StrEnum):
    """How infinitetalk samples: quality (the original's 40 steps with text and audio guidance) or fast (the few
    steps a distilled LoRA expects, guidance off; on nodes that merged one, MONOLOGUE_INFINITETALK_LORA)."""

    QUALITY = "quality"
    FAST = "fast"


_SINK_NAME = Bounds("Unique per session; default: type.", pattern=r"^[a-z0-9-]{0,32}$")
_ENDPOINT = Bounds("Endpoint (default AWS's own).", pattern=r"^https?://[^\s/]+(/\S*)?$")
_REGION = Bounds("AWS region.", pattern=r"^[a-z0-9-]{1,32}$")


@dataclass(frozen=True)
class S3Sink:
    """Publish the stream to an S3-compatible bucket: keys under <prefix>/<session id>/. Credentials are the
    nodes' (boto3's usual chain)."""

    bucket: Annotated[str, Bounds("Bucket.", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]
    type: Literal["s3"] = "s3"
    name: Annotated[str, _SINK_NAME] = ""
    prefix: Annotated[str, Bounds("Keys go under <prefix>/<session id>/.", pattern=r"^[A-Za-z0-9/_.-]{0,200}$")] = ""
    endpoint_url: Annotated[str | None, _ENDPOINT] = None
    region: Annotated[str | None, _REGION] = None

    def __post_init__(self) -> None:
        if ".." in self.prefix.split("/"):
            raise ValueError(f"an s3 prefix may not contain '..' (got {self.prefix!r})")

    @property
    def label(self) -> str:
        return self.name or self.type


@dataclass(frozen=True)
class KvsSink:
    """Publish the stream to a Kinesis Video stream (PutMedia). Credentials are the nodes'."""

    stream_name: Annotated[str, Bounds("Kinesis Video stream name.", pattern=r"^[a-zA-Z0-9_.-]{1,256}$")]
    type: Literal["kvs"] = "kvs"
    name: Annotated[str, _SINK_NAME] = ""
    endpoint_url: Annotated[str | None, _ENDPOINT] = None
    region: Annotated[str | None, _REGION] = None

    @property
    def label(self) -> str:
        return self.name or self.type


# A sink, told apart by `type` (S3 first: Temporal's converter tries a union's members in order, and the
# `type` literal refuses the wrong one).
Sink = S3Sink | KvsSink


class SinkType(StrEnum):
    """Which publisher a sink is: its spec's `type` tag (the literal that tells the union's members apart on the
    wire), as an enum for everything past the spec (the sink's row, the API, metrics)."""

    S3 = S3Sink.type
    KVS = KvsSink.type


# A transcript travels with every chunk's activity input (the options do): 10,000 characters is about 11 minutes
# of speech at 15 characters a second, and keeps a long render's history well inside Temporal's limits.
TRANSCRIPT_MAX_CHARS = 10_000
# Text to speak travels the same way; 5,000 characters is about 5 minutes of speech, synthesised within the time a
# node has to check a new session's inputs (espeak-ng: a fraction of a second; Piper on a CPU: tens of seconds).
TEXT_MAX_CHARS = 5_000
# `<engine>:<voice>`: espeak-ng's voices by name or language (en-us, en-gb-x-rp, de, variants such as en-us+f3), or
# the deployment's one Piper voice (`piper`, or `piper:<its name>`).
VOICE_PATTERN = r"^(espeak:[A-Za-z0-9_+-]{1,40}|piper(:[A-Za-z0-9_.+-]{1,100})?)$"


def _side_bounds(name: str) -> Bounds:
    return Bounds(
        f"Output {name} in pixels, with {'height' if name == 'width' else 'width'}, instead of a resolution: even, "
        f"{MIN_SIDE}-{MAX_SIDE} (infinitetalk: one of its size buckets). The frames are exactly this size, the "
        "portrait cut to its shape (warp: around the face, never cutting it).",
        ge=MIN_SIDE,
        le=MAX_SIDE,
        multiple_of=2,
    )


@dataclass(frozen=True)
class RenderOptions:
    """A session's options: THE definition. The HTTP schema, the settings' per-render defaults
    (`MONOLOGUE_RENDER__*`), the CLI's options and the pipeline's view are all derived from these fields
    (`monologue/options.py`); add an option here and it appears everywhere."""

    fps: Annotated[int, Bounds("Frames per second of the output video.", ge=1, le=60)] = 25
    chunk_frames: Annotated[int, Bounds("Frames per N chunk (about 1-2 s).", ge=2, le=250)] = 40
    first_chunk_frames: Annotated[
        int,
        Bounds(
            "Frames in the first chunk (0: chunk_frames, +1 for infinitetalk); fewer: faster first frame.", ge=0, le=250
        ),
    ] = 0
    i_frames: Annotated[int, Bounds("Frames per I chunk, the seam between two N chunks (0: none).", ge=0, le=32)] = 4
    seed: Annotated[int, Bounds("Seed: the same inputs and seed give the same frames.", ge=0, le=2**63 - 1)] = 0
    resolution: Annotated[Resolution, Bounds(Resolution.__doc__ or "")] = Resolution.SOURCE
    # Any other size: both or neither, instead of a named resolution (`contracts.frames` has the bounds).
    width: Annotated[int | None, _side_bounds("width")] = None
    height: Annotated[int | None, _side_bounds("height")] = None
    preview: Annotated[bool, Bounds("Render fast at half resolution; the same seed gives the same motion.")] = False
    family: Annotated[Family, Bounds(Family.__doc__ or "")] = Family.WARP
    sinks: Annotated[
        tuple[Sink, ...], Bounds("Publishers besides the HLS stream (S3, Kinesis Video); at most 4.", max_length=4)
    ] = ()
    prompt: Annotated[str, Bounds("Optional scene/text conditioning (dit, infinitetalk).", max_length=500)] = ""
    sampling_steps: Annotated[
        int, Bounds("Denoising steps (0: the family's default; infinitetalk: 40, as the original).", ge=0, le=100)
    ] = 0
    sampling_preset: Annotated[SamplingPreset, Bounds(SamplingPreset.__doc__ or "")] = SamplingPreset.QUALITY
    # Sessions from before this option have no field: they keep loudness (their chunks already published, their
    # checkpoints and, live, their workflow's shorter look-ahead all assume it); new sessions get visemes.
    lip_sync: Annotated[LipSync, Bounds(LipSync.__doc__ or "", new_sessions=LipSync.VISEMES)] = LipSync.LOUDNESS
    priority: Annotated[RenderPriority, Bounds(RenderPriority.__doc__ or "")] = RenderPriority.NORMAL
    transcript: Annotated[
        str,
        Bounds(
            "Optional: the words spoken (warp visemes, renders): lips follow forced alignment to them instead of "
            "recognised phones. English words of the pronunciation dictionary; about 11 minutes of speech at most.",
            max_length=TRANSCRIPT_MAX_CHARS,
        ),
    ] = ""
    text: Annotated[
        str,
        Bounds(
            "Instead of audio (renders): the words to speak, synthesised on a node in `voice`; the lips follow the "
            "synthesised phones. About 5 minutes of speech at most.",
            max_length=TEXT_MAX_CHARS,
        ),
    ] = ""
    voice: Annotated[
        str,
        Bounds(
            "The voice `text` is spoken in: espeak:<voice> (espeak-ng's, e.g. en-us, en-gb, de, fr, en-us+f3) or "
            "piper (the deployment's Piper voice, if it has one).",
            pattern=VOICE_PATTERN,
        ),
    ] = "espeak:en-us"

    def __post_init__(self) -> None:
        if self.text.strip() and self.transcript.strip():
            raise ValueError(
                "transcript: a session spoken from text follows the phones of its synthesis; leave transcript out"
            )
        if self.resolution is not Resolution.SOURCE and (self.width, self.height) != (None, None):
            raise ValueError(
                f"width and height replace resolution: give a size or a resolution, not both (got resolution="
                f"{self.resolution}, width={self.width}, height={self.height})"
            )
        check_output_size(self.width, self.height, family=self.family, allowed=self.family.output_sizes)
        if self.transcript.strip() and (self.family is not Family.WARP or self.lip_sync is not LipSync.VISEMES):
            raise ValueError(
                f"transcript: only the warp family's visemes follow a transcript (got family={self.family}, "
                f"lip_sync={self.lip_sync}); leave it out or use family=warp, lip_sync=visemes"
            )
        if self.sampling_preset is SamplingPreset.FAST and self.family is not Family.INFINITETALK:
            raise ValueError(
                f"sampling_preset: only the infinitetalk family has a fast preset (got family={self.family}, "
                f"sampling_preset={self.sampling_preset}); leave it out or use family=infinitetalk"
            )
        labels = [sink.label for sink in self.sinks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"sink names must be unique within a session (got {labels}); set 'name'")
        stride, lead = self.family.temporal_stride, self.family.leading_frames
        sizes = {name: getattr(self, name) for name in ("chunk_frames", "first_chunk_frames", "i_frames")}
        # The first chunk starts the video (its first latent stands for `lead` frames alone); 0 means "derived".
        offsets = {"chunk_frames": 0, "i_frames": 0, "first_chunk_frames": lead}
        off_grid = {name: size for name, size in sizes.items() if size and (size - offsets[name]) % stride}
        if off_grid:
            given = ", ".join(f"{name}={size}" for name, size in off_grid.items())
            rule = (
                f"chunk_frames and i_frames must be multiples of {stride} and first_chunk_frames 0 or {lead} + a "
                f"multiple of {stride}"
                if lead
                else f"chunk_frames, i_frames and first_chunk_frames must be multiples of {stride}"
            )
            raise ValueError(
                f"the {self.family} family makes one latent frame of every {stride} video frames, so {rule} "
                f"(got {given})"
            )


def render_options(values: dict[str, object]) -> RenderOptions:
    """RenderOptions from plain values already validated (a stored session's options, a model_dump)."""
    sinks = tuple(_sink(spec) for spec in values.get("sinks") or ())  # type: ignore[attr-defined]
    enums: dict[str, object] = {
        "resolution": Resolution(str(values.get("resolution", Resolution.SOURCE))),
        "family": Family(str(values.get("family", Family.WARP))),
    }
    if "priority" in values:
        enums["priority"] = RenderPriority(str(values["priority"]))
    if "sampling_preset" in values:
        enums["sampling_preset"] = SamplingPreset(str(values["sampling_preset"]))
    if "lip_sync" in values:  # a row stored before the option has none: the dataclass default (loudness)
        enums["lip_sync"] = LipSync(str(values["lip_sync"]))
    return RenderOptions(**{**values, **enums, "sinks": sinks})  # type: ignore[arg-type]


def _sink(spec: object) -> Sink:
    if isinstance(spec, S3Sink | KvsSink):
        return spec
    fields = {key: value for key, value in dict(spec).items() if value not in ("", None)}  # type: ignore[call-overload]
    if fields.get("type") == SinkType.KVS:
        return KvsSink(**{k: v for k, v in fields.items() if k in _KVS_FIELDS})
    return S3Sink(**{k: v for k, v in fields.items() if k in _S3_FIELDS})


_S3_FIELDS = frozenset(S3Sink.__dataclass_fields__)
_KVS_FIELDS = frozenset(KvsSink.__dataclass_fields__)
