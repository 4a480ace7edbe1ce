from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, strategies as st

from monologue.contracts import Family, LipSync, RenderOptions
from monologue.plan import (
    AUDIO_RATE,
    IncrementalPlanner,
    audio_range,
    frame_count,
    live_frames,
    live_samples_needed,
    plan_chunks,
    plan_timeline,
)

totals = st.integers(1, 5_000)
n_sizes = st.integers(1, 120)
i_sizes = st.integers(0, 12)


@given(total=totals, n=n_sizes, i=i_sizes)
def test_every_frame_belongs_to_exactly_one_chunk(total: int, n: int, i: int) -> None:
    timeline = plan_timeline(total, n_frames=n, i_frames=i)
    covered = [frame for spec in timeline for frame in range(spec.first_frame, spec.end_frame)]
    assert covered == list(range(total))
    assert all(spec.n_frames >= 1 for spec in timeline)


@given(total=totals, n=n_sizes, i=i_sizes)
def test_timeline_alternates_n_and_i_chunks_with_the_configured_sizes(total: int, n: int, i: int) -> None:
    timeline = plan_timeline(total, n_frames=n, i_frames=i)
    n_chunks = [spec for spec in timeline if spec.kind == "N"]
    assert [spec.index for spec in n_chunks] == list(range(len(n_chunks)))
    assert all(spec.n_frames == n for spec in n_chunks[:-1])
    for before, after in pairwise(timeline):
        assert (before.kind, after.kind) != ("I", "I")
        if after.kind == "I":
            assert before.kind == "N" and after.index == before.index and after.n_frames <= i
    assert timeline[0].kind == timeline[-1].kind == "N"


@given(total=totals, n=n_sizes, i=i_sizes)
def test_generation_order_runs_every_chunk_after_its_dependencies(total: int, n: int, i: int) -> None:
    order = plan_chunks(total, n_frames=n, i_frames=i)
    done: set[tuple[str, int]] = set()
    for spec in order:
        assert set(spec.depends_on) <= done, f"{spec.name} before {spec.depends_on}"
        done.add((spec.kind, spec.index))
    names = [spec.name for spec in order]
    if len(names) >= 5 and i > 0:
        assert names[:5] == ["N0", "N1", "I0", "N2", "I1"]


@given(
    samples=st.integers(0, 10**9),
    fps=st.sampled_from([24, 25, 30, 50, 60]),
    rate=st.sampled_from([16_000, 44_100, 48_000]),
)
def test_frame_count_is_duration_times_fps_rounded(samples: int, fps: int, rate: int) -> None:
    assert abs(frame_count(samples, rate=rate, fps=fps) - samples * fps / rate) <= 0.5


@given(total=totals, n=n_sizes, i=i_sizes, fps=st.sampled_from([24, 25, 30]))
def test_audio_ranges_are_contiguous_and_non_overlapping(total: int, n: int, i: int, fps: int) -> None:
    ranges = [
        audio_range(s.first_frame, s.n_frames, rate=16_000, fps=fps)
        for s in plan_timeline(total, n_frames=n, i_frames=i)
    ]
    assert ranges[0][0] == 0
    assert all(before[1] == after[0] for before, after in pairwise(ranges))
    assert ranges[-1][1] == total * 16_000 // fps


@given(
    total=totals,
    n=n_sizes,
    i=i_sizes,
    first=st.none() | st.integers(1, 120),
    steps=st.lists(st.integers(0, 400), max_size=30),
)
def test_incremental_plan_equals_the_finite_plan(
    total: int, n: int, i: int, first: int | None, steps: list[int]
) -> None:
    """Audio arriving in pieces of any size gives the same chunks, each as soon as its frames exist."""
    planner = IncrementalPlanner(n_frames=n, i_frames=i, first_frames=first)
    emitted, available = [], 0
    for step in steps:
        available = min(total, available + step)
        for spec in planner.advance(available, final=False):
            assert spec.end_frame <= available
            emitted.append(spec)
    emitted.extend(planner.advance(total, final=True))
    assert emitted == plan_chunks(total, n_frames=n, i_frames=i, first_frames=first)


@given(total=totals, n=n_sizes, i=i_sizes, first=st.integers(1, 120))
def test_a_shorter_first_chunk_still_covers_every_frame_once(total: int, n: int, i: int, first: int) -> None:
    timeline = plan_timeline(total, n_frames=n, i_frames=i, first_frames=first)
    assert [f for s in timeline for f in range(s.first_frame, s.end_frame)] == list(range(total))
    assert timeline[0].n_frames == min(first, total)
    assert all(s.n_frames == n for s in timeline[1:-1] if s.kind == "N")


def test_plan_rejects_bad_sizes_with_the_value() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        plan_chunks(0, n_frames=40)
    with pytest.raises(ValueError, match="n_frames=0"):
        plan_chunks(10, n_frames=0)
    with pytest.raises(ValueError, match="-1"):
        plan_chunks(10, n_frames=5, i_frames=-1)


@given(
    total=totals,
    n=st.integers(1, 30),
    i=st.integers(0, 3),
    first=st.none() | st.integers(1, 30),
    stride=st.sampled_from([2, 4]),
    steps=st.lists(st.integers(0, 400), max_size=20),
)
def test_a_strided_plan_puts_every_boundary_but_the_end_on_the_grid(
    total: int, n: int, i: int, first: int | None, stride: int, steps: list[int]
) -> None:
    """The dit family's latent grid: every chunk starts on a multiple of the stride, only the last ends off it,
    every frame is in one chunk, and audio arriving in pieces plans the same chunks."""
    sizes = {"n_frames": n * stride, "i_frames": i * stride, "first_frames": first and first * stride}
    timeline = plan_timeline(total, **sizes, stride=stride)
    assert [f for s in timeline for f in range(s.first_frame, s.end_frame)] == list(range(total))
    assert all(spec.first_frame % stride == 0 for spec in timeline)
    assert all(spec.n_frames % stride == 0 for spec in timeline[:-1])
    planner = IncrementalPlanner(**sizes, stride=stride)
    emitted, available = [], 0
    for step in steps:
        available = min(total, available + step)
        emitted.extend(planner.advance(available, final=False))
    emitted.extend(planner.advance(total, final=True))
    assert emitted == plan_chunks(total, **sizes, stride=stride)


def test_a_strided_plan_refuses_sizes_off_the_grid() -> None:
    with pytest.raises(ValueError, match="multiples of the stride 4"):
        plan_chunks(100, n_frames=40, i_frames=3, stride=4)
    with pytest.raises(ValueError, match="first_frames"):
        plan_chunks(100, n_frames=40, i_frames=4, first_frames=10, stride=4)


def test_loudness_live_sessions_wait_for_a_tenth_of_a_second_past_a_chunk_as_before() -> None:
    """Every session from before visemes (loudness in its options) and other families: 0.1 s, as always."""
    for options in (RenderOptions(), RenderOptions(lip_sync=LipSync.VISEMES, family=Family.DIT)):
        assert live_samples_needed(40, options) == 40 * 640 + 1600
        assert live_frames(40 * 640 + 1600, options, ended=False) == 40
        assert live_frames(40 * 640 + 1599, options, ended=False) == 39


@given(samples=st.integers(0, 400_000), fps=st.sampled_from([1, 24, 25, 30, 60]))
def test_a_visemes_live_session_plans_exactly_the_frames_whose_audio_is_stored(samples: int, fps: int) -> None:
    """`live_frames` is the largest frame count whose `live_samples_needed` is stored: the planner, the API's
    signals and the latency marks agree, and no frame waits longer than its phone windows need."""
    options = RenderOptions(lip_sync=LipSync.VISEMES, fps=fps)
    frames = live_frames(samples, options, ended=False)
    assert frames == 0 or live_samples_needed(frames, options) <= samples
    assert live_samples_needed(frames + 1, options) > samples
    assert live_samples_needed(frames + 1, options) - (frames + 1) * AUDIO_RATE // fps <= 1.3 * AUDIO_RATE + 1
