"""Modules: one model (and its weights) each, in five roles that the stages drive.

A family provides one module per role, bundled in a `ModelSet`. Modules are stateless between chunks
apart from their weights: everything a chunk leaves for later is returned explicitly (reference
conditioning, anchors) and kept by the Pipeline, so memory stays flat and a session can move to another
node.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_worker.pipeline.progress import StepProgress, no_steps
from gpu_worker.pipeline.types import AudioSource, AudioWindow, ChunkRequest, OutputSpec
from monologue.contracts.session import AnchorEnd
from monologue.errors import InputError

if TYPE_CHECKING:
    from gpu_worker.tts import TimedPhone

# Named arrays: what crosses chunks (anchors) or is computed once per session (the reference
# conditioning). Flat and numpy so they serialise to safetensors as they are.
Anchor = dict[str, np.ndarray]
Reference = dict[str, np.ndarray]


class Role(StrEnum):
    """A family's five modules, by the name of their field in `ModelSet` (and their `Module.name`)."""

    REFERENCE = "reference"
    CONTEXT = "context"
    AUDIO_TO_VIDEO = "audio_to_video"
    SUPER_RESOLUTION = "super_resolution"
    DECODER = "decoder"


class Module:
    """One model and its weights, with its device placement.

    CPU families inherit the no-op defaults; GPU families override `load` (read safetensors), `to`
    (move weights), `offload`/`restore` (free the device between stages) and `device_models` (what the
    pipeline's switch residency moves on and off the accelerator).
    """

    name: str = "module"

    def __init__(self) -> None:
        self.device = "cpu"
        self.loaded = False

    def load(self) -> None:
        """Read the weights from the files the project ships or is given (never from a hub)."""
        self.loaded = True

    def to(self, device: str) -> None:
        self.device = device

    def offload(self) -> None:
        """Free the accelerator for the next stage's model."""
        self.to("cpu")

    def restore(self, device: str) -> None:
        self.to(device)

    def device_models(self) -> list[Any]:
        """The torch models (nn.Modules) this module runs on its device; none for a CPU family. With
        `Residency.SWITCH` the pipeline keeps them on the accelerator only while this module's stage runs."""
        return []


class ReferenceEncoder(Module, ABC):
    """Encodes the portrait once per session into the static reference conditioning."""

    name = "reference"

    @abstractmethod
    def encode(self, portrait: np.ndarray, output: OutputSpec) -> Reference:
        """portrait (H, W, 3) uint8 → named arrays every later chunk reads. Raises InputError if unusable."""

    def check(self, portrait: np.ndarray) -> None:
        """Raise InputError if `encode` could not use this portrait (the API calls it at submit time, so
        the user hears about it at once instead of from a failed session). Cheap: no weights needed."""

    @staticmethod
    def frame_size(reference: Reference) -> tuple[int, int]:
        """(width, height) of the frames this reference renders; every family stores it as `frame_size`."""
        width, height = (int(v) for v in reference["frame_size"])
        return width, height


class ContextGenerator(Module, ABC):
    """Audio slice → per-frame conditioning (features, tokens) and the chunk's noise."""

    name = "context"
    # Audio frames the context needs before and after the chunk (smoothing, look-ahead).
    margin_frames: tuple[int, int] = (0, 0)
    # Whether `encode_speech` encodes a render's whole speech once (else it returns None: per-chunk encoding).
    encodes_speech: bool = False

    def audio_range(self, chunk: ChunkRequest, fps: int, rate: int) -> tuple[int, int]:
        """The [start, end) samples `context` reads for `chunk` (the only audio a chunk's frames depend on):
        its frames plus `margin_frames`. A family whose context reads more overrides it; a live session must
        have stored the audio up to `end` before the chunk runs (`monologue.plan.live_samples_needed`)."""
        before, after = self.margin_frames
        return (chunk.first_frame - before) * rate // fps, (chunk.end_frame + after) * rate // fps

    def prepare(self, audio: AudioSource, transcript: str) -> Any:
        """Work over the session's whole speech done once, when the session starts (and again when it is rebuilt
        on another node: it must be deterministic); every chunk's window carries the result as `prepared`.
        Only called with a transcript; a family that takes none refuses it."""
        raise InputError(f"the {type(self).__name__} context takes no transcript")

    def prepare_phones(self, audio: AudioSource, phones: tuple[TimedPhone, ...]) -> Any:
        """Like `prepare`, for speech synthesised from text: the phones the engine spoke, with their times. A family
        whose mouth does not follow phones keeps nothing (None): its model hears the audio."""
        return None

    def encode_speech(self, audio: AudioSource, output: OutputSpec) -> np.ndarray | None:
        """A render's whole speech → per-frame features (one row per video frame, from frame 0), once per session,
        before its first chunk; every chunk's window reads its frames' rows (`AudioWindow.speech`), so a frame's
        features do not depend on which chunk it falls in. Deterministic (the node stores the rows and a node that
        resumes the session reads them instead). None: the family encodes each chunk's audio itself (the default,
        and a live session's only way: its speech is not all known when it starts)."""
        return None

    def speech_range(self, chunk: ChunkRequest) -> tuple[int, int]:
        """The [start, end) frames of the speech features (`encode_speech`) `context` reads for `chunk`, before
        clamping to the encoding (a multi-rank node forwards those rows with the chunk)."""
        before, after = self.margin_frames
        return chunk.first_frame - before, chunk.end_frame + after

    @abstractmethod
    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]: ...


@dataclass
class A2VOutput:
    latents: Any  # the family's low-resolution video representation for the chunk's frames
    head: Anchor | None = None  # state at the chunk's first frame (N chunks: the next seam's right anchor)
    tail: Anchor | None = None  # state at the chunk's last frame (N chunks: conditions the next N chunk)

    def anchor(self, end: AnchorEnd) -> Anchor | None:
        return self.head if end is AnchorEnd.HEAD else self.tail


class AudioToVideo(Module, ABC):
    """Generates a chunk's motion/latents, conditioned on the reference, the context and the anchors."""

    name = "audio_to_video"

    @abstractmethod
    def generate_n(
        self,
        reference: Reference,
        context: dict[str, Any],
        previous: Anchor | None,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        """An N chunk, continuing from the previous N chunk's tail (None for the first). A family whose
        generation takes many steps reports each to `progress` (it becomes the node's heartbeat)."""

    @abstractmethod
    def generate_i(
        self,
        reference: Reference,
        context: dict[str, Any],
        left: Anchor,
        right: Anchor,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        """An I chunk between the N chunk before (`left`: its last frame) and after (`right`: its first
        frame). The model may predict the anchor frames themselves; only the inner frames are returned."""


class SuperResolution(Module, ABC):
    name = "super_resolution"

    @abstractmethod
    def upscale(self, reference: Reference, latents: Any) -> Any:
        """Low-resolution latents → output-resolution latents (or pixels, for families without a VAE)."""


class Decoder(Module, ABC):
    name = "decoder"

    @abstractmethod
    def decode(self, reference: Reference, upscaled: Any) -> np.ndarray:
        """Output-resolution latents → frames (T, H, W, 3) uint8 RGB."""


@dataclass
class ModelSet:
    """What a model family runs: one module per role, loaded together (`gpu_worker.models.build_family` builds a
    `contracts.Family`'s). `name` is for messages: the family's, or a test's own."""

    name: str
    reference: ReferenceEncoder
    context: ContextGenerator
    audio_to_video: AudioToVideo
    super_resolution: SuperResolution
    decoder: Decoder

    def modules(self) -> list[Module]:
        return [self.reference, self.context, self.audio_to_video, self.super_resolution, self.decoder]

    def module(self, role: Role) -> Module:
        found: Module = getattr(self, role.value)
        return found

    def load(self) -> None:
        for module in self.modules():
            if not module.loaded:
                module.load()
