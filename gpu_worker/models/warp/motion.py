"""Speech features and chance → one parameter vector per frame (the warp family's latents), and anchors.

The mouth follows the speech through a smoothing filter with a little look-ahead; the head and eyes
follow the idle processes. Everything that carries over a seam (the filter, the pose and its velocity,
the blink timer, the frame index) is the anchor, so the next chunk continues exactly where this one left
off, and an I chunk joins two anchors without a jump.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_worker.models.warp import parameters as p
from gpu_worker.models.warp.features import SpeechFeatures
from gpu_worker.models.warp.idle import IdleMotion
from gpu_worker.models.warp.lipsync import MouthFilter
from gpu_worker.pipeline.module import A2VOutput, Anchor, AudioToVideo, Reference
from gpu_worker.pipeline.progress import StepProgress, no_steps
from gpu_worker.pipeline.types import ChunkRequest


def _uniform(normals: np.ndarray) -> np.ndarray:
    """Standard normals → uniforms in (0, 1) through the normal CDF."""
    uniform: np.ndarray = 0.5 * (1.0 + np.vectorize(math.erf)(normals / math.sqrt(2.0)))
    return uniform


@dataclass
class MotionState:
    """Everything that carries motion from one frame to the next; an anchor is this at one frame."""

    frame: int
    pose: np.ndarray  # (3,) roll, shift x, shift y (unbounded; `IdleMotion.limited` bounds the render)
    velocity: np.ndarray  # (3,) per second
    mouth: np.ndarray  # (4,) MouthFilter state
    blink: int  # frames since the last blink began

    def to_anchor(self) -> Anchor:
        return {
            "frame": np.array([self.frame], dtype=np.int64),
            "pose": self.pose.astype(np.float64),
            "velocity": self.velocity.astype(np.float64),
            "mouth": self.mouth.astype(np.float64),
            "blink": np.array([self.blink], dtype=np.int64),
        }

    @classmethod
    def from_anchor(cls, anchor: Anchor) -> MotionState:
        return cls(
            frame=int(anchor["frame"][0]),
            pose=np.asarray(anchor["pose"], dtype=np.float64),
            velocity=np.asarray(anchor["velocity"], dtype=np.float64),
            mouth=np.asarray(anchor["mouth"], dtype=np.float64),
            blink=int(anchor["blink"][0]),
        )


class WarpMotion(AudioToVideo):
    """Latents (T, PARAMETER_COUNT) float32: see `parameters` for the layout. Depends only on the audio,
    the anchors and the chunk's rng, never on the output size, so preview and full quality move alike."""

    def generate_n(
        self,
        reference: Reference,
        context: dict[str, Any],
        previous: Anchor | None,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,  # one quick pass: the pipeline's per-stage report is enough
    ) -> A2VOutput:
        """An N chunk continuing from `previous` (N(k-1)'s tail), carried over the I gap before this chunk."""
        features = SpeechFeatures.from_context(context)
        idle, mouth = IdleMotion(features.fps), MouthFilter(features.fps)
        # A fixed set of draws in a fixed order, whatever the chunk's history, frame by frame: the same chunk
        # always draws the same numbers, and a shorter chunk draws a prefix of a longer one's.
        start = rng.standard_normal(7)
        per_frame = rng.standard_normal((chunk.n_frames, 4))  # (T, 4) pose noise and the blink's chance
        pose_noise, blink_uniforms = per_frame[:, :3], _uniform(per_frame[:, 3])
        if previous is None:
            pose, velocity, blink = idle.initial(start[:6], float(_uniform(start[6:])[0]))
            state = MotionState(chunk.first_frame - 1, pose, velocity, mouth.initial(), blink)
        else:
            state = MotionState.from_anchor(previous)
            if state.frame >= chunk.first_frame:
                raise ValueError(
                    f"{chunk.name} starts at frame {chunk.first_frame}, not after its anchor's frame {state.frame}"
                )
        # The gap (the I chunk's frames): the expected path, no new blink, the mouth on the gap's own audio.
        while state.frame < chunk.first_frame - 1:
            state = self._step(state, idle, mouth, features, None, None)
        latents = np.empty((chunk.n_frames, p.PARAMETER_COUNT), dtype=np.float32)
        head: Anchor | None = None
        for index in range(chunk.n_frames):
            state = self._step(state, idle, mouth, features, pose_noise[index], float(blink_uniforms[index]))
            latents[index] = self._latent(state, idle, mouth, idle.closure(state.blink), features.shape(state.frame))
            if index == 0:
                head = state.to_anchor()
        return A2VOutput(latents=latents, head=head, tail=state.to_anchor())

    @staticmethod
    def _step(
        state: MotionState,
        idle: IdleMotion,
        mouth: MouthFilter,
        features: SpeechFeatures,
        noise: np.ndarray | None,
        uniform: float | None,
    ) -> MotionState:
        frame = state.frame + 1
        pose, velocity = idle.step_pose(state.pose, state.velocity, noise)
        return MotionState(
            frame, pose, velocity, mouth.step(state.mouth, features, frame), idle.step_blink(state.blink, uniform)
        )

    @staticmethod
    def _latent(
        state: MotionState, idle: IdleMotion, mouth: MouthFilter, closure: float, shape: np.ndarray | None
    ) -> np.ndarray:
        """One frame's parameters; `shape` is its viseme targets (None: the lips follow loudness alone)."""
        roll, shift_x, shift_y = idle.limited(state.pose + mouth.nod(state.mouth))
        if shape is None:
            opening, width = mouth.parameters(state.mouth)
            return np.array([opening, width, roll, shift_x, shift_y, closure, 0.0, 0.0, 0.0], dtype=np.float32)
        opening, width, press, tuck, pucker = mouth.viseme_parameters(state.mouth, shape)
        return np.array([opening, width, roll, shift_x, shift_y, closure, press, tuck, pucker], dtype=np.float32)

    def generate_i(
        self,
        reference: Reference,
        context: dict[str, Any],
        left: Anchor,
        right: Anchor,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,  # one quick pass: the pipeline's per-stage report is enough
    ) -> A2VOutput:
        """The frames strictly between two anchors: the pose on the cubic through both (matching their
        velocities), the mouth filtered on this chunk's audio from the left anchor and eased into the right
        one, and any blink either anchor has under way."""
        features = SpeechFeatures.from_context(context)
        idle, mouth = IdleMotion(features.fps), MouthFilter(features.fps)
        start, end = MotionState.from_anchor(left), MotionState.from_anchor(right)
        span = end.frame - start.frame
        if not start.frame < chunk.first_frame <= chunk.end_frame <= end.frame:
            raise ValueError(
                f"{chunk.name} (frames {chunk.first_frame}..{chunk.end_frame - 1}) is not between its "
                f"anchors at frames {start.frame} and {end.frame}"
            )
        # The mouth filter run from the left anchor up to the right anchor's frame; whatever it misses the
        # right anchor by (nothing, when the N chunk saw the same audio) is eased in linearly.
        states = [start.mouth]
        for frame in range(start.frame + 1, end.frame + 1):
            states.append(mouth.step(states[-1], features, frame))
        miss = end.mouth - states[-1]
        latents = np.empty((chunk.n_frames, p.PARAMETER_COUNT), dtype=np.float32)
        for index, frame in enumerate(range(chunk.first_frame, chunk.end_frame)):
            offset = frame - start.frame
            mouth_state = states[offset] + miss * (offset / span)
            pose = idle.hermite((start.pose, start.velocity), (end.pose, end.velocity), offset / span, span)
            # A blink begun before the gap carries on; one the right anchor began inside the gap shows too.
            closure = max(idle.closure(start.blink + offset), idle.closure(end.blink - (end.frame - frame)))
            state = MotionState(frame, pose, start.velocity, mouth_state, 0)
            latents[index] = self._latent(state, idle, mouth, closure, features.shape(frame))
        return A2VOutput(latents=latents)
