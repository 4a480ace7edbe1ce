from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from monologue.plan import audio_range, frame_count, plan_chunks


@given(total=st.integers(1, 20_000), chunk=st.integers(1, 300))
def test_every_frame_belongs_to_exactly_one_chunk(total: int, chunk: int) -> None:
    plan = plan_chunks(total, chunk_frames=chunk)
    covered = [frame for spec in plan for frame in range(spec.first_frame, spec.end_frame)]
    assert covered == list(range(total))
    assert all(spec.n_frames == chunk for spec in plan[:-1])
    assert [spec.index for spec in plan] == list(range(len(plan)))


@given(
    samples=st.integers(0, 10**9),
    fps=st.sampled_from([24, 25, 30, 50, 60]),
    rate=st.sampled_from([16_000, 44_100, 48_000]),
)
def test_frame_count_is_duration_times_fps_rounded(samples: int, fps: int, rate: int) -> None:
    exact = samples * fps / rate
    assert abs(frame_count(samples, rate=rate, fps=fps) - exact) <= 0.5


@given(total=st.integers(1, 5_000), chunk=st.integers(1, 300), fps=st.sampled_from([24, 25, 30]))
def test_audio_ranges_are_contiguous_and_non_overlapping(total: int, chunk: int, fps: int) -> None:
    ranges = [
        audio_range(s.first_frame, s.n_frames, rate=16_000, fps=fps) for s in plan_chunks(total, chunk_frames=chunk)
    ]
    assert ranges[0][0] == 0
    assert all(prev[1] == nxt[0] for prev, nxt in pairwise(ranges))
    assert ranges[-1][1] == total * 16_000 // fps


def test_plan_rejects_empty_timelines() -> None:
    import pytest

    with pytest.raises(ValueError, match="at least one frame"):
        plan_chunks(0, chunk_frames=40)
