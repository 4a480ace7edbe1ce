"""Output frame sizes a session may ask for (`RenderOptions.width` and `height`): the bounds every family shares,
and the sizes a family with fixed size buckets renders, so a size no node would render is refused with a 422
before anything starts, naming the family and the nearest sizes it does render.

Standard library only: workflow code imports it inside the sandbox (`monologue.contracts.session` reads it)."""

from collections.abc import Collection

# Each side in pixels. At least 32, so preview's halves keep the 16-px minimum every family's frames have
# (`gpu_worker.pipeline.frame_size`); at most 2048: above 1080p's long side (1920) and the widest infinitetalk
# bucket (2048), the largest frames a named resolution renders.
MIN_SIDE = 32
MAX_SIDE = 2048

# The `RenderOptions` fields that together choose the output size: one choice, so a request giving any of them
# replaces the server's default size whole (`monologue.options.merge`) rather than conflicting with it.
OUTPUT_SIZE = frozenset({"resolution", "width", "height"})

# InfiniteTalk `wan/utils/multitalk_utils.py` lines 26-39: (height, width) buckets by aspect ratio h/w; the
# portrait is resized to cover the nearest bucket and centre-cropped (`wan/multitalk.py` lines 437-448). THE
# definition: `gpu_worker.models.infinitetalk.config` frames with them, the API checks a requested size with them.
INFINITETALK_BUCKETS_480 = {
    0.26: (320, 1216), 0.38: (384, 1024), 0.50: (448, 896), 0.67: (512, 768), 0.82: (576, 704), 1.00: (640, 640),
    1.22: (704, 576), 1.50: (768, 512), 1.86: (832, 448), 2.00: (896, 448), 2.50: (960, 384), 2.83: (1088, 384),
    3.60: (1152, 320), 3.80: (1216, 320), 4.00: (1280, 320),
}  # fmt: skip
INFINITETALK_BUCKETS_720 = {
    0.22: (448, 2048), 0.29: (512, 1792), 0.36: (576, 1600), 0.45: (640, 1408), 0.55: (704, 1280),
    0.63: (768, 1216), 0.76: (832, 1088), 0.88: (896, 1024), 1.00: (960, 960), 1.14: (1024, 896),
    1.31: (1088, 832), 1.50: (1152, 768), 1.58: (1216, 768), 1.82: (1280, 704), 1.91: (1344, 704),
    2.20: (1408, 640), 2.30: (1472, 640), 2.67: (1536, 576), 2.89: (1664, 576), 3.62: (1856, 512),
    3.75: (1920, 512),
}  # fmt: skip
# The (width, height) infinitetalk renders when asked for a size: its buckets of both classes (Wan2.1 was trained
# at these; a 720-class size samples with the 720-class shift).
INFINITETALK_SIZES = frozenset(
    (width, height)
    for table in (INFINITETALK_BUCKETS_480, INFINITETALK_BUCKETS_720)
    for height, width in table.values()
)


def check_output_size(
    width: int | None, height: int | None, *, family: str, allowed: Collection[tuple[int, int]] | None
) -> None:
    """ValueError naming the fields unless `width` and `height` are both None (the size comes from `resolution`)
    or both even, within MIN_SIDE..MAX_SIDE and, where the family has fixed sizes (`allowed`), one of them."""
    if width is None and height is None:
        return
    if width is None or height is None:
        given = "width" if height is None else "height"
        raise ValueError(f"width and height go together: give both or neither (got only {given}={width or height})")
    sides = (("width", width), ("height", height))
    bad = [f"{name}={side}" for name, side in sides if side % 2 or not MIN_SIDE <= side <= MAX_SIDE]
    if bad:
        raise ValueError(f"width and height must be even numbers from {MIN_SIDE} to {MAX_SIDE} (got {', '.join(bad)})")
    if allowed is not None and (width, height) not in allowed:
        near = ", ".join(f"{w}x{h}" for w, h in nearest(allowed, width, height))
        raise ValueError(
            f"width and height: the {family} family renders only its own sizes, and {width}x{height} is not one; "
            f"the nearest in shape: {near} (or leave width and height out and pick a resolution)"
        )


def nearest(sizes: Collection[tuple[int, int]], width: int, height: int, count: int = 3) -> list[tuple[int, int]]:
    """The `count` sizes of `sizes` nearest width x height: closest aspect ratio first, then closest area."""
    ratio, area = width / height, width * height
    return sorted(sizes, key=lambda size: (abs(size[0] / size[1] - ratio), abs(size[0] * size[1] - area), size))[:count]
