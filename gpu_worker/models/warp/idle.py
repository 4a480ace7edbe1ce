"""Idle motion: the head's slow sway and the eyes' blinks, as smooth random processes with small states.

The pose (roll, shift x, shift y) is a damped oscillator driven by noise (an Ornstein–Uhlenbeck process
on pose and velocity): it drifts and returns, never jerks, and its state at any frame is just
(pose, velocity). Blinks are a renewal process: none within `blink_min_seconds` of the last, then a
constant chance per frame, and always one by `blink_max_seconds`; its state is the frames since the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class IdleConfig:
    # Typical sway (the stationary standard deviation): roll in radians (0.6°), shifts in face heights
    # (about 1 px on a 100 px face); the crown of the head moves 1–3 px at 512.
    pose_std: tuple[float, float, float] = (0.0105, 0.0065, 0.0045)
    # The sway never exceeds these (2°, a few per cent of the face), however long the session.
    pose_limit: tuple[float, float, float] = (0.035, 0.025, 0.02)
    # Sway period and damping: a slow drift of a few seconds, slightly underdamped so it reads as balance.
    frequency_hz: float = 0.28
    damping: float = 0.75
    # Blinks: people blink every 2–6 s while talking, each one about 200 ms, closing faster than opening.
    blink_min_seconds: float = 2.0
    blink_max_seconds: float = 6.0
    blink_mean_wait_seconds: float = 1.6  # mean wait after the minimum: blinks average ~3.6 s apart
    blink_close_seconds: float = 0.08
    blink_open_seconds: float = 0.14
    # The first blink of a session comes no sooner than this share of the minimum gap.
    first_blink_share: float = 0.6


IDLE = IdleConfig()


def _smoothstep(value: float) -> float:
    clipped = min(max(value, 0.0), 1.0)
    return clipped * clipped * (3.0 - 2.0 * clipped)


class IdleMotion:
    """The idle processes at a given frame rate: steps, initial states and blink shape."""

    def __init__(self, fps: int, config: IdleConfig = IDLE) -> None:
        self.fps = fps
        self.config = config
        self.dt = 1.0 / fps
        self._omega = 2.0 * np.pi * config.frequency_hz
        self._std = np.array(config.pose_std, dtype=np.float64)
        self._limit = np.array(config.pose_limit, dtype=np.float64)
        # Noise strength that gives `pose_std` as the stationary spread of a damped oscillator.
        self._drive = self._std * np.sqrt(4.0 * config.damping * self._omega**3)
        self.blink_min_frames = round(config.blink_min_seconds * fps)
        self.blink_max_frames = round(config.blink_max_seconds * fps)
        self._blink_chance = 1.0 - np.exp(-self.dt / config.blink_mean_wait_seconds)

    def initial(self, normals: np.ndarray, uniform: float) -> tuple[np.ndarray, np.ndarray, int]:
        """(pose, velocity, frames since a blink) drawn from the stationary state; normals (6,)."""
        pose = self._std * normals[:3]
        velocity = self._std * self._omega * normals[3:6]
        blink = int(uniform * self.config.first_blink_share * self.blink_min_frames)
        return pose, velocity, blink

    def step_pose(
        self, pose: np.ndarray, velocity: np.ndarray, noise: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One frame of the oscillator; noise (3,) standard normals, or None for the expected path."""
        acceleration = -(self._omega**2) * pose - 2.0 * self.config.damping * self._omega * velocity
        velocity = velocity + acceleration * self.dt
        if noise is not None:
            velocity = velocity + self._drive * np.sqrt(self.dt) * noise
        return pose + velocity * self.dt, velocity

    def step_blink(self, frames_since: int, uniform: float | None) -> int:
        """Frames since the last blink began, one frame on; `uniform` None forbids starting a blink."""
        frames_since += 1
        if uniform is None or frames_since < self.blink_min_frames:
            return frames_since
        if frames_since >= self.blink_max_frames or uniform < self._blink_chance:
            return 0
        return frames_since

    def closure(self, frames_since: int) -> float:
        """Eyelid closure 0..1 for a blink that began `frames_since` frames ago: fast down, slower up."""
        if frames_since < 0:
            return 0.0
        seconds = (frames_since + 1) * self.dt  # the blink's first frame is already on its way down
        close, reopen = self.config.blink_close_seconds, self.config.blink_open_seconds
        if seconds <= close:
            return _smoothstep(seconds / close)
        return 1.0 - _smoothstep((seconds - close) / reopen)

    def limited(self, pose: np.ndarray) -> np.ndarray:
        """The pose as rendered: softly held within `pose_limit`, so rare excursions never look wrong."""
        bounded: np.ndarray = self._limit * np.tanh(pose / self._limit)
        return bounded

    def hermite(
        self,
        start: tuple[np.ndarray, np.ndarray],
        end: tuple[np.ndarray, np.ndarray],
        fraction: float,
        span_frames: int,
    ) -> np.ndarray:
        """Pose between two (pose, velocity) states `span_frames` apart, at `fraction` of the way: the
        cubic that matches both poses and both velocities, so the motion is smooth across both seams."""
        span = span_frames * self.dt
        s = fraction
        h00, h10 = 2 * s**3 - 3 * s**2 + 1, s**3 - 2 * s**2 + s
        h01, h11 = -2 * s**3 + 3 * s**2, s**3 - s**2
        pose: np.ndarray = h00 * start[0] + h10 * span * start[1] + h01 * end[0] + h11 * span * end[1]
        return pose
