"""Faces at any size the cascades can find: a small face in a wide picture is found at full resolution, and a
picture without one is refused with the smallest face it would accept, in pixels and per cent."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
from skimage import data

from gpu_worker.models.warp import build_family
from gpu_worker.models.warp.layout import DETECTION, Layout, _cascade, _detect_at, detect_layout
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from monologue.contracts import Chunk, LipSync
from monologue.errors import NoFaceFound
from monologue.media import decode_png, decode_wav, normalise_portrait
from tests.gpu_worker.models.test_warp import SPEECH_WAV, _ListSink

SAMPLE_PORTRAIT = SPEECH_WAV.parent / "portrait.jpg"
# The astronaut's face box is 99 px tall in her 512 px portrait.
ASTRONAUT_FACE = 99.2


def presenter_shot(face_share: float) -> np.ndarray:
    """A 1280x720 picture: the astronaut scaled so her face is `face_share` of the height, standing right of
    centre in front of a plain wall (a presenter in a wide frame)."""
    astronaut: np.ndarray = data.astronaut()  # type: ignore[no-untyped-call]
    scale = face_share * 720 / ASTRONAUT_FACE
    person = cv2.resize(astronaut, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    picture = np.empty((720, 1280, 3), dtype=np.uint8)
    picture[:] = (196, 200, 206)
    height, width = person.shape[:2]
    picture[720 - height :, 700 : 700 + width] = person
    return picture


def test_a_face_of_a_tenth_of_a_wide_picture_is_found_and_renders() -> None:
    picture = presenter_shot(0.10)
    downscaled, _ = _detect_at(picture, DETECTION.work_long_side / 1280, DETECTION, confirm=False)
    assert downscaled is None  # the 640 px pass alone misses it (the face is 36 px there)

    layout = detect_layout(picture)
    assert 0.09 * 720 <= layout.face_height <= 0.12 * 720
    assert 700 < layout.face_x < 700 + 0.72 * 512 and layout.mouth_y > layout.left_eye_y
    pipeline = Pipeline(build_family())
    speech = decode_wav(SPEECH_WAV.read_bytes())
    session = pipeline.start_session(picture, OutputSpec(resolution="720p", preview=True), ArrayAudio(speech))
    sink = _ListSink()
    pipeline.run_chunk(
        session, ChunkRequest(Chunk("N", 0, 15, 8), lip_sync=LipSync.VISEMES), sink
    )  # frames 15-22: speech
    frames = np.concatenate(sink.frames)
    assert frames.shape == (8, 360, 640, 3)
    assert len({frame.tobytes() for frame in frames}) > 1  # it talks
    reference = session.reference
    x0, y0, x1, y1 = (int(value) for value in reference["head_box"])
    still = np.ones(frames.shape[1:3], dtype=bool)
    still[y0:y1, x0:x1] = reference["head_mask"] == 0.0
    assert still.mean() > 0.9 and np.array_equal(
        frames[:, still], np.broadcast_to(reference["portrait"][still], frames[:, still].shape)
    )


def _texture(name: str) -> np.ndarray:
    image: np.ndarray = getattr(data, name)()
    return cv2.resize(np.repeat(image[:, :, None], 3, axis=2) if image.ndim == 2 else image[:, :, :3], (1280, 720))


@pytest.mark.parametrize(
    "picture",
    [
        pytest.param(np.full((720, 1280, 3), 128, dtype=np.uint8), id="flat"),
        pytest.param(_texture("brick"), id="brick-wall"),  # full-size cascades see faces in it; no eyes confirm them
    ],
)
def test_a_picture_without_a_face_is_refused_naming_the_smallest_face_it_accepts(picture: np.ndarray) -> None:
    with pytest.raises(NoFaceFound, match=r"at least 58 px tall \(8% of this 1280x720 picture's shorter side\)"):
        build_family().reference.check(picture)


def test_sessions_that_start_together_find_the_same_face_as_one_alone() -> None:
    """A node starts sessions on several threads at once: each finds the face it finds alone (one OpenCV
    classifier shared by threads found other faces now and then, hence other frames)."""
    portrait = decode_png(normalise_portrait(SAMPLE_PORTRAIT.read_bytes()).png)  # as a node gets it
    alone = detect_layout(portrait)
    start = threading.Barrier(4)

    def detect_many() -> list[Layout]:
        start.wait()
        return [detect_layout(portrait) for _ in range(12)]

    with ThreadPoolExecutor(4) as pool:  # with one classifier shared, 0-5 % of these differed
        together = [layout for layouts in pool.map(lambda _: detect_many(), range(4)) for layout in layouts]
    assert len(together) == 48 and all(layout == alone for layout in together)


def test_each_thread_detects_with_its_own_classifiers() -> None:
    """What makes the test above hold whatever the timing: no classifier is used by two threads."""
    name = DETECTION.face_cascades[0]
    mine = id(_cascade(name))  # loaded here first, as a node's earlier sessions did
    with ThreadPoolExecutor(2) as pool:
        start = threading.Barrier(2)

        def owned() -> tuple[int, int]:
            start.wait()  # both threads alive at once, so they are two threads
            return id(_cascade(name)), id(_cascade(name))

        (first, again), (other, _) = pool.map(lambda _: owned(), range(2))
    assert first == again and len({mine, first, other}) == 3
