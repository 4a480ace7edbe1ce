"""Phones → visemes → the mouth's shape targets per video frame, with co-articulation.

Nine mouth shapes, after the ones animators and tools such as Rhubarb Lip Sync use: rest, closed (m b p),
lower lip under the teeth (f v), rounded (oo w), open rounded (oh aw), wide (ee), mid (eh a), open (ah) and
the clenched teeth of most consonants. A frame's shape blends the visemes of the phones around it (Cohen and
Massaro's dominance model: a raised-cosine window in time, each phone weighted by how much its lips must be
reached), so lips start rounding before an "oo" and m, b and p still close even between two open vowels.

Every frame is computed on its own from the phone steps around it, with the same arithmetic in the same
order whatever else is computed with it: a frame's targets never depend on the chunk that asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from gpu_worker.models.warp.phonemes import PHONES
from monologue.phone_windows import PHONE_WINDOWS, PhoneWindows


class Viseme(IntEnum):
    REST = 0
    CLOSED = 1  # m b p: lips pressed together
    LIP_TEETH = 2  # f v: lower lip under the upper teeth
    ROUND = 3  # uw uh w: lips narrow and pushed forward
    ROUND_OPEN = 4  # ow ao oy er r: rounded, jaw lower
    WIDE = 5  # iy ih ey y: spread, jaw nearly closed
    MID = 6  # eh ae: spread a little, jaw half open
    OPEN = 7  # aa ah ay aw: jaw open
    TEETH = 8  # s z t d n th l k g …: teeth nearly together, lips relaxed


@dataclass(frozen=True)
class Shape:
    """A viseme's mouth at full voice: opening 0..1 (of the loudness-driven opening), width -1 rounded ..
    +1 spread, press 0..1 (lips sealed), tuck 0..1 (lower lip under the upper teeth), pucker 0..1 (lips
    pushed forward), and its dominance in the blend."""

    opening: float
    width: float
    press: float = 0.0
    tuck: float = 0.0
    pucker: float = 0.0
    dominance: float = 1.0


SHAPES: dict[Viseme, Shape] = {
    Viseme.REST: Shape(0.0, 0.0, dominance=0.5),
    Viseme.CLOSED: Shape(0.0, 0.0, press=1.0, dominance=6.0),  # must close: it outweighs its neighbours
    Viseme.LIP_TEETH: Shape(0.25, 0.1, tuck=1.0, dominance=4.0),
    Viseme.ROUND: Shape(0.45, -1.0, pucker=1.0, dominance=2.5),
    Viseme.ROUND_OPEN: Shape(0.7, -0.6, pucker=0.6, dominance=1.5),
    Viseme.WIDE: Shape(0.35, 1.0, dominance=1.5),
    Viseme.MID: Shape(0.7, 0.5),
    Viseme.OPEN: Shape(1.0, 0.2),
    Viseme.TEETH: Shape(0.25, 0.3, dominance=0.6),  # consonants take their neighbours' lips
}

_PHONE_VISEME = {
    **dict.fromkeys(["M", "B", "P"], Viseme.CLOSED),
    **dict.fromkeys(["F", "V"], Viseme.LIP_TEETH),
    **dict.fromkeys(["UW", "UH", "W"], Viseme.ROUND),
    **dict.fromkeys(["OW", "AO", "OY", "ER", "R", "SH", "ZH", "CH", "JH"], Viseme.ROUND_OPEN),
    **dict.fromkeys(["IY", "IH", "EY", "Y"], Viseme.WIDE),
    **dict.fromkeys(["EH", "AE"], Viseme.MID),
    **dict.fromkeys(["AA", "AH", "AY", "AW"], Viseme.OPEN),
}
# (phones,) viseme of each phone id; anything not listed above (t d n s z th dh l k g ng hh) is TEETH.
PHONE_VISEMES = np.array(
    [Viseme.REST if name == "SIL" else _PHONE_VISEME.get(name, Viseme.TEETH) for name in PHONES], dtype=np.int64
)
TARGET_NAMES = ("opening", "width", "press", "tuck", "pucker")
# (visemes, 5) the targets above, and (visemes,) their dominance.
_TARGETS = np.array([[getattr(SHAPES[v], name) for name in TARGET_NAMES] for v in Viseme], dtype=np.float64)
_DOMINANCE = np.array([SHAPES[v].dominance for v in Viseme], dtype=np.float64)


def viseme_targets(
    phones: np.ndarray,
    first_step: int,
    first_frame: int,
    end_frame: int,
    fps: int,
    windows: PhoneWindows = PHONE_WINDOWS,
) -> np.ndarray:
    """(end_frame - first_frame, 5) targets (TARGET_NAMES) of each frame from the phone ids of steps
    [first_step, first_step + len(phones)), which must cover `windows.steps_for` of the frames."""
    frames = range(first_frame, end_frame)
    centres = np.array([windows.frame_step(frame, fps) + windows.lead_steps for frame in frames], dtype=np.int64)
    reach = windows.reach_steps
    if len(frames) and (centres[0] - reach < first_step or centres[-1] + reach >= first_step + phones.size):
        raise ValueError(f"phones of steps from {first_step} ({phones.size}) do not cover frames {first_frame}..")
    visemes = PHONE_VISEMES[phones]  # (S,)
    total = np.zeros((len(frames), len(TARGET_NAMES)), dtype=np.float64)  # (F, 5)
    weight = np.zeros(len(frames), dtype=np.float64)  # (F,)
    # One offset at a time, element-wise: every frame sums its 2·reach + 1 terms in the same order, whatever
    # the number of frames (a reduction over an axis could group them differently).
    for offset in range(-reach, reach + 1):
        kernel = 0.5 * (1.0 + np.cos(np.pi * offset / (reach + 1)))
        here = visemes[centres + offset - first_step]  # (F,)
        term = kernel * _DOMINANCE[here]  # (F,)
        total += term[:, None] * _TARGETS[here]
        weight += term
    blended: np.ndarray = total / weight[:, None]
    return blended
