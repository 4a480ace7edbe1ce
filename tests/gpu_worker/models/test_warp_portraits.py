"""The warp family with any portrait: sizes, grey pictures and resolutions give talking frames of the right size
with the background untouched, a picture without a face is refused, and the frame is cut around the face (any
width and height asked for too, padded past the picture rather than cutting the face)."""
# ruff: noqa: F811 (the fixtures of test_warp, imported by name, are this module's arguments too)

from __future__ import annotations

import cv2
import numpy as np
import pytest

from gpu_worker.models.warp import build_family
from gpu_worker.models.warp.layout import detect_layout
from gpu_worker.models.warp.reference import FACE_ROOM, cover_crop, framing, reference_layout
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline, frame_size
from monologue.contracts import Chunk, LipSync
from monologue.errors import NoFaceFound
from tests.gpu_worker.models.test_warp import (  # noqa: F401 (module-scoped fixtures shared with it)
    _ListSink,
    portrait,
    speech,
)


def _padded(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """The portrait scaled to fit width x height, padded with its own edge pixels (no stretched face)."""
    scale = min(width / image.shape[1], height / image.shape[0])
    fitted = cv2.resize(
        image,
        (round(image.shape[1] * scale), round(image.shape[0] * scale)),
        interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC,
    )
    top, left = (height - fitted.shape[0]) // 2, (width - fitted.shape[1]) // 2
    return cv2.copyMakeBorder(
        fitted, top, height - fitted.shape[0] - top, left, width - fitted.shape[1] - left, cv2.BORDER_REPLICATE
    )


@pytest.mark.parametrize(
    ("width", "height", "grey", "resolution"),
    [
        (200, 260, False, "source"),
        (200, 260, True, "720p"),
        (3000, 2000, False, "512"),
        (3000, 2000, True, "1080p"),
        (640, 480, False, "720p"),
        (511, 767, False, "source"),
    ],
)
def test_any_portrait_size_colour_or_resolution_renders_talking_frames(
    portrait: np.ndarray, speech: np.ndarray, width: int, height: int, grey: bool, resolution: str
) -> None:
    image = _padded(portrait, width, height)
    if grey:
        image = cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)
    output = OutputSpec(resolution=resolution)  # type: ignore[arg-type]  # parametrised literal
    expected_width, expected_height = frame_size(width, height, output)
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(image, output, ArrayAudio(speech))
    sink = _ListSink()
    pipeline.run_chunk(
        session, ChunkRequest(Chunk("N", 0, 15, 8), lip_sync=LipSync.VISEMES), sink
    )  # frames 15-22: speech

    frames = np.concatenate(sink.frames)
    assert frames.shape == (8, expected_height, expected_width, 3)
    assert expected_width % 2 == 0 and expected_height % 2 == 0
    assert frames.dtype == np.uint8
    assert len({frame.tobytes() for frame in frames}) > 1  # it moves
    reference = session.reference
    x0, y0, x1, y1 = (int(value) for value in reference["head_box"])
    still = np.ones(frames.shape[1:3], dtype=bool)
    still[y0:y1, x0:x1] = reference["head_mask"] == 0.0
    assert np.array_equal(frames[:, still], np.broadcast_to(reference["portrait"][still], frames[:, still].shape))
    if grey:
        assert np.array_equal(frames[..., 0], frames[..., 1]) and np.array_equal(frames[..., 1], frames[..., 2])


def test_a_portrait_without_a_face_raises_no_face_found(speech: np.ndarray) -> None:
    flat = np.full((480, 640, 3), 128, dtype=np.uint8)
    with pytest.raises(NoFaceFound):
        Pipeline(build_family()).start_session(flat, OutputSpec(), ArrayAudio(speech))


def test_the_frame_covers_the_output_and_keeps_the_face_centred_where_it_can() -> None:
    # Wide portrait into a square: the full height, centred on the face.
    box = cover_crop(3000, 2000, 1.0, 1000.0, 900.0)
    assert (box.width, box.height, box.x, box.y) == (2000, 2000, 0, 0)
    box = cover_crop(3000, 2000, 1.0, 1600.0, 900.0)
    assert (box.x, box.width) == (600, 2000)
    # Tall portrait into 16:9 landscape: the full width, as high as the face needs.
    box = cover_crop(1000, 2000, 16 / 9, 500.0, 400.0)
    assert (box.width, box.height, box.y) == (1000, 562, 119)


def _face_inside(reference: dict[str, np.ndarray], width: int, height: int) -> bool:
    """Whether the reference's face box, with FACE_ROOM either side, lies inside a width x height frame."""
    face = reference_layout(reference)
    room_x, room_y = FACE_ROOM * face.face_width, FACE_ROOM * face.face_height
    x0, y0 = face.face_x - room_x, face.face_y - room_y
    x1, y1 = face.face_x + face.face_width + room_x, face.face_y + face.face_height + room_y
    return x0 >= -1 and y0 >= -1 and x1 <= width + 1 and y1 <= height + 1


def test_a_size_asked_for_renders_exactly_that_size_with_the_face_in_the_frame(
    portrait: np.ndarray, speech: np.ndarray
) -> None:
    """480x640 from a landscape picture: a portrait-shaped cut around the face, scaled to exactly the size."""
    landscape = _padded(portrait, 960, 540)
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(landscape, OutputSpec(width=480, height=640), ArrayAudio(speech))
    sink = _ListSink()
    pipeline.run_chunk(session, ChunkRequest(Chunk("N", 0, 15, 8), lip_sync=LipSync.VISEMES), sink)

    frames = np.concatenate(sink.frames)
    assert frames.shape == (8, 640, 480, 3)
    assert len({frame.tobytes() for frame in frames}) > 1  # it talks
    assert _face_inside(session.reference, 480, 640)
    seen = detect_layout(frames[0])  # the face is in the pixels where the reference says, not only in its numbers
    expected = reference_layout(session.reference)
    assert np.hypot(*np.subtract(seen.face_centre, expected.face_centre)) < 0.1 * expected.face_width


def test_a_shape_that_would_cut_the_face_gets_a_wider_cut_padded_past_the_picture(
    portrait: np.ndarray, speech: np.ndarray
) -> None:
    """128x1024 from a landscape picture: a cover crop would be 34 px wide, narrower than the face; the crop grows
    to hold the face and reaches above and below the picture, where its edge rows, blurred, fill the frame."""
    landscape = _padded(portrait, 960, 540)
    face = detect_layout(landscape)
    assert framing(960, 540, 16 / 9, face) == cover_crop(960, 540, 16 / 9, *face.face_centre)  # fits: unchanged
    crop = framing(960, 540, 128 / 1024, face)
    assert crop.width >= face.face_width * (1 + 2 * FACE_ROOM) and crop.y < 0 < crop.y + crop.height - 540
    assert abs(crop.width / crop.height - 128 / 1024) < 0.01

    pipeline = Pipeline(build_family())
    session = pipeline.start_session(landscape, OutputSpec(width=128, height=1024), ArrayAudio(speech))
    sink = _ListSink()
    pipeline.run_chunk(session, ChunkRequest(Chunk("N", 0, 15, 4), lip_sync=LipSync.VISEMES), sink)
    frames = np.concatenate(sink.frames)
    assert frames.shape == (4, 1024, 128, 3)
    assert _face_inside(session.reference, 128, 1024)
    top = landscape[0, crop.x : crop.x + crop.width].mean(axis=0)  # the picture's top row, above the face
    assert np.abs(frames[0, :8].mean(axis=(0, 1)) - top).max() < 40  # filled from it: no black or grey bar
