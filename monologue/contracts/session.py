"""A session's model: its kinds and statuses, its queue classes, and its options (`RenderOptions`, THE definition of
every option), all of which cross Temporal inside the activity and workflow inputs (`monologue.contracts`
re-exports every name here).

Standard library only: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations` here: Temporal's converter resolves these field types at
# run time inside the workflow sandbox, where string annotations of nested dataclasses fail to resolve.
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, NamedTuple

from monologue.contracts.bounds import Bounds as Bounds
from monologue.contracts.chunks import (
    AnchorEnd as AnchorEnd,
    AnchorRef as AnchorRef,
    Chunk as Chunk,
    ChunkKind as ChunkKind,
)
from monologue.contracts.frames import INFINITETALK_SIZES, MAX_SIDE, MIN_SIDE, check_output_size
from monologue.contracts.sinks import (
    KvsSink as KvsSink,
    S3Sink as S3Sink,
    Sink as Sink,
    SinkType as SinkType,
    sink_spec,
)


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


class CaptionMode(StrEnum):
    """Captions of the words spoken (from `text` or `transcript`): none; files (WebVTT and SRT files and a subtitle
    rendition in the HLS stream); or burn (the files too, and the text drawn into the frames)."""

    NONE = "none"
    FILES = "files"
    BURN = "burn"


class Delivery(StrEnum):
    """How a live session's video reaches its viewers: hls (segments and a playlist, a few seconds behind) or
    webrtc (WHEP: frames sent as they are made, for conversations; live sessions only). With webrtc a live
    session's chunks default small (6 frames; warp: no I chunks) and its lips follow loudness, unless given."""

    HLS = "hls"
    WEBRTC = "webrtc"


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
    captions: Annotated[CaptionMode, Bounds(CaptionMode.__doc__ or "")] = CaptionMode.NONE
    delivery: Annotated[Delivery, Bounds(Delivery.__doc__ or "")] = Delivery.HLS

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
        if self.captions is not CaptionMode.NONE and not (self.text.strip() or self.transcript.strip()):
            raise ValueError(
                f"captions: need the words spoken (got captions={self.captions}): give text (speech synthesised) or "
                "transcript (the words of the audio), or leave captions out"
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
    sinks = tuple(sink_spec(spec) for spec in values.get("sinks") or ())  # type: ignore[attr-defined]
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
    if "captions" in values:
        enums["captions"] = CaptionMode(str(values["captions"]))
    if "delivery" in values:
        enums["delivery"] = Delivery(str(values["delivery"]))
    return RenderOptions(**{**values, **enums, "sinks": sinks})  # type: ignore[arg-type]


def check_delivery(kind: SessionKind, options: RenderOptions) -> None:
    """THE rule of `delivery`: only a live session's frames go out over WebRTC (a render has no viewers while it
    runs); a ValueError naming the option otherwise."""
    if kind != SessionKind.LIVE and options.delivery != Delivery.HLS:  # equal as strings too (StrEnum)
        raise ValueError(
            f"delivery: only live sessions deliver over {options.delivery} (got a {kind}); leave it out or use hls"
        )
