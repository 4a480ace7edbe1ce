"""The warp family's latents: one small vector of motion parameters per frame.

Every entry is in face-relative units (fractions of the face height, radians, 0..1), never pixels, so the
same parameters drive a preview and a full-quality render and the motion is identical at both.
"""

from __future__ import annotations

# How far the jaw has dropped: 0 closed (the portrait's own mouth), 1 the widest speech opening.
OPENING = 0
# Lip shape: -1 rounded ("oo", corners pulled in), 0 neutral, +1 spread ("ee", corners pulled out).
WIDTH = 1
# Head roll about the base of the neck, in radians (positive turns the top of the head to the right).
ROLL = 2
# Head translation, in face heights (positive is right and down in the image).
SHIFT_X = 3
SHIFT_Y = 4
# Eyelid closure: 0 open, 1 shut.
BLINK = 5
# Viseme shapes (0 with loudness lip sync, which then renders as it always did), 0..1 each: lips pressed
# together (m, b, p), lower lip tucked under the upper teeth (f, v), lips pushed forward (oo, oh).
PRESS = 6
TUCK = 7
PUCKER = 8

PARAMETER_COUNT = 9
PARAMETER_NAMES = ("opening", "width", "roll", "shift_x", "shift_y", "blink", "press", "tuck", "pucker")
