from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data

from gpu_worker.face import FaceRegion, detect_face
from monologue.errors import InputError, NoFaceFound

# Where the astronaut's face is in the 512x512 image, measured by eye: eyes near y=100, mouth near
# (224, 144), chin near y=180. The detector's box must cover the eyes-to-mouth core.
FACE_CORE = (195, 95, 255, 150)  # (x0, y0, x1, y1)


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return data.astronaut()  # (512, 512, 3)


def _covers(face: FaceRegion, core: tuple[float, float, float, float]) -> bool:
    x0, y0, x1, y1 = core
    return face.x <= x0 and face.y <= y0 and face.x + face.width >= x1 and face.y + face.height >= y1


def test_finds_the_astronauts_face_and_mouth(astronaut: np.ndarray) -> None:
    face = detect_face(astronaut)

    assert _covers(face, FACE_CORE)
    assert face.x >= 150 and face.x + face.width <= 300
    assert face.y >= 40 and face.y + face.height <= 200
    assert 80 <= face.height <= 130
    assert abs(face.mouth_x - 224) <= 6
    assert abs(face.mouth_y - 144) <= 6
    assert 25 <= face.mouth_width <= 60


def test_box_scales_with_the_portrait(astronaut: np.ndarray) -> None:
    small = detect_face(astronaut)
    large = detect_face(cv2.resize(astronaut, (1280, 1280), interpolation=cv2.INTER_LINEAR))

    scale = 2.5
    assert _covers(large, tuple(value * scale for value in FACE_CORE))
    assert large.height == pytest.approx(small.height * scale, rel=0.15)
    assert large.x == pytest.approx(small.x * scale, abs=0.1 * large.width)
    assert large.mouth_x == pytest.approx(small.mouth_x * scale, abs=8)
    assert large.mouth_y == pytest.approx(small.mouth_y * scale, abs=8)


def test_finds_the_face_in_a_greyscale_portrait(astronaut: np.ndarray) -> None:
    grey = cv2.cvtColor(cv2.cvtColor(astronaut, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)

    assert _covers(detect_face(grey), FACE_CORE)


@pytest.mark.parametrize(
    "image",
    [
        np.full((512, 512, 3), 128, dtype=np.uint8),
        np.random.default_rng(7).integers(0, 256, size=(512, 512, 3), dtype=np.uint8),
    ],
    ids=["flat-grey", "noise"],
)
def test_no_face_is_an_input_error_that_says_what_to_send(image: np.ndarray) -> None:
    with pytest.raises(NoFaceFound, match="no face found") as raised:
        detect_face(image)

    assert isinstance(raised.value, InputError)
    assert "80 px" in str(raised.value)


def test_detection_is_deterministic(astronaut: np.ndarray) -> None:
    assert detect_face(astronaut) == detect_face(astronaut.copy())


def test_region_round_trips_through_a_dict(astronaut: np.ndarray) -> None:
    face = detect_face(astronaut)

    as_dict = face.to_dict()

    assert all(type(value) is int for value in as_dict.values())
    assert FaceRegion.from_dict(as_dict) == face


def test_animated_box_holds_the_mouth_and_stays_inside_the_image(astronaut: np.ndarray) -> None:
    face = detect_face(astronaut)

    x0, y0, x1, y1 = face.animated_box(512, 512)

    assert 0 <= x0 < face.mouth_x - face.mouth_width < face.mouth_x + face.mouth_width < x1 <= 512
    assert 0 <= y0 < face.mouth_y < y1 <= 512
    # A face at the image corner gets a box clamped to the image.
    corner = FaceRegion(x=0, y=0, width=100, height=100, mouth_x=50, mouth_y=80, mouth_width=40, mouth_height=13)
    assert corner.animated_box(100, 100) == (0, 50, 100, 100)
