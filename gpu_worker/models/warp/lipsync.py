"""Lip sync: speech features → how open the mouth is and how the lips are shaped, frame by frame.

A smoothing filter with a little look-ahead (lips move just before the sound): its state is all the mouth
carries from one frame to the next, so it is the mouth's part of every anchor. With visemes the filter still
decides how far the voice opens the jaw; the frame's viseme targets (stateless: they come from the phones
around the frame) decide the shape, and how much of that opening the shape lets through.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_worker.models.warp.features import SpeechFeatures


@dataclass(frozen=True)
class MouthDynamics:
    # Lips move slightly before the sound comes out: the filter reads the features this many frames ahead.
    look_ahead_frames: int = 1
    # Share of the way to the target covered per frame at 25 fps: jaws open fast, close nearly as fast
    # (so a pause shuts the mouth within about three frames), and lip shape changes a little slower.
    attack: float = 0.65
    release: float = 0.6
    shape_rate: float = 0.45
    # Where an interrupt dropped the audio (barge-in) the mouth shuts faster than in a pause: at this share per
    # frame it is at rest (under `closed_below`) two frames after the cut, well within 100 ms.
    cut_release: float = 0.85
    reference_fps: int = 25
    # Loudness is judged against the speaker's recent peak level, so quiet and loud recordings both move
    # the mouth fully: the peak follows louder speech quickly and sinks slowly in quiet passages.
    start_peak_db: float = -26.0
    peak_attack: float = 0.5
    peak_decay_db_per_second: float = 1.5
    lowest_peak_db: float = -45.0
    # The mouth starts to open `open_range_db` under the peak and is fully open `full_below_peak_db` under
    # it; the curve keeps middling syllables half open, so the jaw's motion follows the syllables.
    open_range_db: float = 28.0
    full_below_peak_db: float = 1.0
    loudness_curve: float = 1.4
    # Fricatives bring the teeth together: a hissing frame opens the mouth this much less.
    hiss_closing: float = 0.7
    # Speakers' heads dip a little while they talk and come back up in pauses: the head's shift (face
    # heights) follows a slow average of the loudness (share of the way per frame at 25 fps).
    nod: float = 0.008
    nod_rate: float = 0.1
    # Openings below this render as a closed mouth, and lip shapes this close to neutral as neutral, so
    # the lips fully meet and rest in pauses.
    closed_below: float = 0.03
    neutral_within: float = 0.03
    # Visemes: the shapes show as much as there is voice (the filtered opening times this, at most 1), so a
    # phone heard in a pause does not twitch the lips; pressed lips seal the opening between these presses.
    voice_gain: float = 3.0
    seal_from: float = 0.3
    sealed_at: float = 0.7


DYNAMICS = MouthDynamics()


def _rate(share_at_reference: float, fps: int, reference_fps: int) -> float:
    """The per-frame share at `fps` that covers the same ground per second as `share_at_reference`."""
    return float(1.0 - (1.0 - share_at_reference) ** (reference_fps / fps))


class MouthFilter:
    """Smooths speech features into (opening, width) and a nod; its state is (opening, width, peak level
    dB, slow loudness)."""

    def __init__(self, fps: int, dynamics: MouthDynamics = DYNAMICS) -> None:
        self.dynamics = dynamics
        self._attack = _rate(dynamics.attack, fps, dynamics.reference_fps)
        self._release = _rate(dynamics.release, fps, dynamics.reference_fps)
        self._shape = _rate(dynamics.shape_rate, fps, dynamics.reference_fps)
        self._cut = _rate(dynamics.cut_release, fps, dynamics.reference_fps)
        self._peak_attack = _rate(dynamics.peak_attack, fps, dynamics.reference_fps)
        self._nod_rate = _rate(dynamics.nod_rate, fps, dynamics.reference_fps)
        self._decay = dynamics.peak_decay_db_per_second / fps

    def initial(self) -> np.ndarray:
        return np.array([0.0, 0.0, self.dynamics.start_peak_db, 0.0], dtype=np.float64)

    def step(self, state: np.ndarray, features: SpeechFeatures, frame: int) -> np.ndarray:
        """The state at `frame` from the state at the frame before; holds still where audio is missing."""
        ahead = frame + self.dynamics.look_ahead_frames
        if not features.has(ahead):
            return state.copy()
        level, spread, hiss = features.at(ahead)
        opening, width, peak, slow = (float(value) for value in state)
        dynamics = self.dynamics
        if level > peak:
            peak += self._peak_attack * (level - peak)
        else:
            peak = max(dynamics.lowest_peak_db, peak - self._decay)
        floor = peak - dynamics.open_range_db
        loudness = min(max((level - floor) / (dynamics.open_range_db - dynamics.full_below_peak_db), 0.0), 1.0)
        target = loudness**dynamics.loudness_curve * (1.0 - dynamics.hiss_closing * hiss)
        if features.is_cut(ahead):  # an interrupt dropped the audio: the lips shut and go neutral at once
            opening, width = opening - self._cut * opening, width - self._cut * width
        else:
            opening += (self._attack if target > opening else self._release) * (target - opening)
            # Lip shape only means something while there is voice; silence returns the lips to neutral.
            width += self._shape * (spread * min(1.0, 2.0 * loudness) - width)
        slow += self._nod_rate * (loudness - slow)
        return np.array([opening, width, peak, slow], dtype=np.float64)

    def parameters(self, state: np.ndarray) -> tuple[float, float]:
        """(opening, width) as rendered: small values snap to rest, so a pause shows the portrait's own lips."""
        closed, neutral = self.dynamics.closed_below, self.dynamics.neutral_within
        opening = max(0.0, (float(state[0]) - closed) / (1.0 - closed))
        width = float(np.clip(state[1], -1.0, 1.0))
        return opening, 0.0 if abs(width) < neutral else width

    def viseme_parameters(self, state: np.ndarray, targets: np.ndarray) -> tuple[float, float, float, float, float]:
        """(opening, width, press, tuck, pucker) as rendered, from the filter's state and a frame's viseme
        targets (`visemes.TARGET_NAMES`): loudness scales the opening the shape allows."""
        dynamics = self.dynamics
        loud, _ = self.parameters(state)
        voice = min(1.0, dynamics.voice_gain * max(0.0, float(state[0])))
        shape_opening, width, press, tuck, pucker = (float(value) for value in targets)
        press *= voice
        seal = min(max((press - dynamics.seal_from) / (dynamics.sealed_at - dynamics.seal_from), 0.0), 1.0)
        opening = loud * shape_opening * (1.0 - seal * seal * (3.0 - 2.0 * seal))
        width *= voice
        shaped = (press, tuck * voice, pucker * voice)
        press, tuck, pucker = (0.0 if value < dynamics.neutral_within else value for value in shaped)
        return opening, 0.0 if abs(width) < dynamics.neutral_within else width, press, tuck, pucker

    def nod(self, state: np.ndarray) -> np.ndarray:
        """(3,) pose offset (roll, shift x, shift y) that speaking adds to the idle sway."""
        return np.array([0.0, 0.0, self.dynamics.nod * float(state[3])], dtype=np.float64)
