"""Measure the lips inside a detected face: where the mouth opens, how wide, how curved, and whether teeth
already show.

The warp splits the face along this line, so it has to be right to the pixel: a split inside a lip
tears the lip in two. Geometry gives the first guess; the pixels refine it: the darkest row between the
lips, the bottom of the upper teeth when the portrait smiles with them, and the dark corners of the mouth.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class LipConfig:
    # Mouth geometry relative to the face box, measured on frontal portraits: the line between the lips,
    # and the lips' half-width (the fallback when the corners cannot be seen).
    mouth_down: float = 0.81
    mouth_half_width: float = 0.21
    # The lip line is searched this far (face heights) either side of the geometric guess.
    search: float = 0.07
    # Grey levels added at the edge of the search range, so a dark beard or nostril shadow at the far end
    # loses to a nearly-as-dark row close to the guess.
    prior_grey: float = 20.0
    # Teeth under the upper lip: rows brighter and greyer than the lips around them, at least `teeth_rows`
    # face heights tall, starting within `teeth_offset` under the lip line.
    teeth_brighter: float = 12.0
    teeth_greyer: float = 8.0
    teeth_rows: float = 0.02
    teeth_offset: float = 0.03
    # Mouth corners: the darkest spots beside the lips, searched between these shares of the geometric
    # half-width, and trusted only if they stand out by `corner_contrast` grey levels and agree with each
    # other (a smile's corners rise together; a shadow or a dimple on one side does not).
    corner_inner: float = 0.55
    corner_outer: float = 1.35
    corner_above: float = 0.09  # face heights above the upper lip
    corner_below: float = 0.05  # face heights below the opening line
    corner_contrast: float = 15.0
    corner_mismatch: float = 0.06  # face heights between the two corners' heights
    # Curvature limits (face heights the corners sit above or below the centre): beyond these it is not a mouth.
    most_rise: float = 0.09
    most_drop: float = 0.05


LIPS = LipConfig()


@dataclass(frozen=True)
class Lips:
    """The mouth in working pixels (continuous coordinates: pixel i spans [i, i + 1))."""

    x: float
    y: float  # where the mouth opens, at the centre
    half_width: float
    rise: float  # corners' height below the centre (negative: above, a smile)
    teeth_showing: bool


def _opening_line(
    grey: np.ndarray, saturation: np.ndarray, face: tuple[int, int, int, int], config: LipConfig
) -> tuple[float, float, bool]:
    """(opening row, upper lip row, teeth showing): the darkest row near the guess, moved down under the
    upper teeth when they show (upper teeth stay with the upper lip when the jaw drops)."""
    x, y, w, h = face
    guess = y + config.mouth_down * h
    reach = max(2, round(config.search * h))
    half = max(1, round(0.5 * config.mouth_half_width * w))  # the central half of the lips: no corner shadows
    rows = np.arange(round(guess) - reach, round(guess) + 2 * reach + 1)  # (R,) room below for teeth
    rows = rows[(rows >= 1) & (rows < grey.shape[0] - 1)]
    if rows.size == 0:
        return guess, guess, False
    centre = round(x + w / 2)
    columns = slice(max(0, centre - half), min(grey.shape[1], centre + half + 1))
    profile = grey[rows[0] - 1 : rows[-1] + 2, columns].astype(np.float64).mean(axis=1)  # (R + 2,)
    smoothed = 0.25 * profile[:-2] + 0.5 * profile[1:-1] + 0.25 * profile[2:]  # (R,)
    cost = smoothed + config.prior_grey * ((rows - guess) / reach) ** 2
    near = np.flatnonzero(np.abs(rows - guess) <= reach)
    darkest = int(near[np.argmin(cost[near])])
    upper_lip = float(rows[darkest]) + 0.5  # the middle of the darkest pixel row
    colour = saturation[rows[0] : rows[-1] + 1, columns].astype(np.float64).mean(axis=1)  # (R,)
    brightness = profile[1:-1]
    teeth = (brightness > np.median(brightness) + config.teeth_brighter) & (
        colour < np.median(colour) - config.teeth_greyer
    )
    start = darkest + 1
    while start < rows.size and start <= darkest + max(2, round(config.teeth_offset * h)) and not teeth[start]:
        start += 1
    end = start
    while end < rows.size and teeth[end]:
        end += 1
    if end - start >= max(2, round(config.teeth_rows * h)):
        return float(rows[end - 1]) + 1.0, upper_lip, True  # the lower edge of the last teeth row
    return upper_lip, upper_lip, False


def _corner(blurred: np.ndarray, x0: int, x1: int, y0: int, y1: int) -> tuple[float, float, float] | None:
    """(x, y, contrast) of the darkest pixel in a window, contrast against the window's median."""
    x0, x1 = max(0, x0), min(blurred.shape[1], x1)
    y0, y1 = max(0, y0), min(blurred.shape[0], y1)
    if x1 - x0 < 2 or y1 - y0 < 2:
        return None
    window = blurred[y0:y1, x0:x1]
    row, column = np.unravel_index(int(np.argmin(window)), window.shape)
    return x0 + column + 0.5, y0 + row + 0.5, float(np.median(window) - window[row, column])


def find_lips(
    grey: np.ndarray, saturation: np.ndarray, face: tuple[int, int, int, int], config: LipConfig = LIPS
) -> Lips:
    """The lips of the face box `face` (x, y, w, h) in a working greyscale image and its HSV saturation."""
    x, _, w, h = face
    line, upper_lip, teeth = _opening_line(grey, saturation, face, config)
    centre_x, half_width = x + w / 2, config.mouth_half_width * w
    blurred = cv2.GaussianBlur(grey, (0, 0), max(0.8, 0.012 * w)).astype(np.float64)
    top, bottom = round(upper_lip - config.corner_above * h), round(line + config.corner_below * h)
    inner, outer = config.corner_inner * half_width, config.corner_outer * half_width
    left = _corner(blurred, round(centre_x - outer), round(centre_x - inner), top, bottom)
    right = _corner(blurred, round(centre_x + inner), round(centre_x + outer), top, bottom)
    if left is None or right is None:
        return Lips(centre_x, line, half_width, 0.0, teeth)
    corners_y = (left[1] + right[1]) / 2
    trusted = (
        min(left[2], right[2]) >= config.corner_contrast
        and abs(left[1] - right[1]) <= config.corner_mismatch * h
        and -config.most_rise * h <= corners_y - line <= config.most_drop * h
    )
    if not trusted:
        return Lips(centre_x, line, half_width, 0.0, teeth)
    return Lips(float(left[0] + right[0]) / 2, line, float(right[0] - left[0]) / 2, float(corners_y - line), teeth)
