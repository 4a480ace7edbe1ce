"""A WebRTC live chunk's frames reach the node's viewers before its segment is encoded: the tee keeps copies of what
the pipeline writes (valid only during the call) and hands them to the segment's sink only on `release`, in order."""

from __future__ import annotations

import numpy as np

from activities.frame_tap import TeeSink


class Recording:
    def __init__(self) -> None:
        self.written: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.written.append(frames)


def test_the_tee_holds_copies_until_released_then_writes_them_in_order() -> None:
    sink, reused = Recording(), np.zeros((2, 4, 4, 3), dtype=np.uint8)
    tee = TeeSink(sink)
    for value in (1, 2):
        reused[:] = value  # the pipeline's buffer, overwritten after each write
        tee.write(reused)
    assert sink.written == []  # nothing encoded while the viewers wait for the chunk
    assert [int(frames.max()) for frames in tee.frames] == [1, 2]
    tee.release()
    assert [int(frames.max()) for frames in sink.written] == [1, 2]
