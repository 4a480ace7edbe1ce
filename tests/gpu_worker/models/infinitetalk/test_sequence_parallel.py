"""Sequence parallelism for the infinitetalk family: the DiT split over 2 and 4 gloo ranks (tokens, a latent frame
cut between ranks, uneven splits, a rank with no token, every head-group count) returns what one process returns on
every rank, and the Wan VAE decode split over 2 and 4 ranks gathers the one-process frames bit for bit.

One 4-rank world runs every scenario: degree 4 over all ranks, and degree 2 over ranks {0, 1} and {2, 3} at once;
the node's own SP (MONOLOGUE_SP_DEGREE=2) renders a short timeline through a DistributedPipeline.
The DiT's tolerance is the dit family's (fp32, max abs diff 1e-5): under SP each rank multiplies other matrix shapes
(its tokens), so sums may round differently."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")

from gpu_worker.distributed.sequence import split_frames
from gpu_worker.models.infinitetalk.dit import frame_runs
from monologue.gate import Band, frame_hash, psnr, ssim
from tests.gpu_worker.distributed.worlds import spawn_world
from tests.gpu_worker.models.infinitetalk.sp_work import (
    DECODE_CASES,
    DIT_CASES,
    HEAD_GROUPS,
    RANKS,
    RENDER_CHUNKS,
    drive,
)

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results(tiny_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("infinitetalk_sp")
    drive_world = partial(drive, str(tiny_weights))
    values, others = spawn_world(drive_world, folder, ranks=RANKS, deadline_s=420, sp_degree=2)
    assert others == ["shutdown"] * (RANKS - 1)
    return values


def _value(result: dict[str, Any]) -> Any:
    assert "error" not in result, result.get("traceback")
    return result["value"]


def _close(name: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, name
    assert np.abs(got - want).max() <= TOLERANCE, (name, float(np.abs(got - want).max()))


@pytest.mark.parametrize("degree", [2, 4])
def test_the_dit_under_sp_returns_the_one_process_velocity_on_every_rank(results: dict[str, Any], degree: int) -> None:
    per_rank = _value(results[f"dit{degree}"])
    baseline = per_rank[0]["single"]
    for rank, seen in enumerate(per_rank):
        for name, *_ in DIT_CASES:
            assert np.array_equal(seen["single"][name], baseline[name]), f"rank {rank} differs alone"
            for head_groups in HEAD_GROUPS[degree]:
                _close(f"{name}, rank {rank}, G={head_groups}", seen[f"sp_g{head_groups}"][name], baseline[name])


def test_the_tiny_checkpoints_dit_under_sp_returns_its_one_process_velocity(results: dict[str, Any]) -> None:
    for rank, seen in enumerate(_value(results["checkpoint_dit2"])):
        for name, got in seen["sp"].items():
            _close(f"{name}, rank {rank}", got, seen["single"][name])


def test_the_cases_cut_latent_frames_and_split_unevenly() -> None:
    """What the cases above exercise: splits inside a frame (the audio attention's partial frames), uneven runs
    and, at degree 4, ranks without a token."""
    cuts, uneven, empty = set(), set(), set()
    for name, _, frames, height, width in DIT_CASES:
        per_frame = (height // 2) * (width // 2)
        for degree in (2, 4):
            ranges = split_frames(frames * per_frame, degree)
            sizes = {end - start for start, end in ranges}
            if any(start % per_frame for start, end in ranges if end > start):
                cuts.add((name, degree))
            if len(sizes) > 1:
                uneven.add((name, degree))
            if 0 in sizes:
                empty.add((name, degree))
    assert {("cut_frames", 2), ("cut_frames", 4), ("halves", 4), ("uneven", 2)} <= cuts
    assert {("uneven", 2), ("uneven", 4), ("cut_frames", 4)} <= uneven
    assert empty == {("short", 4)}


def test_a_rank_s_tokens_go_to_their_frames_audio_in_runs_of_cut_and_whole_frames() -> None:
    """Tokens [9, 27) of frames of 6: the tail of frame 1, frames 2 and 3 whole, the head of frame 4."""
    runs = frame_runs(9, 18, 6)
    assert runs == [(slice(0, 3), slice(1, 2)), (slice(3, 15), slice(2, 4)), (slice(15, 18), slice(4, 5))]
    assert frame_runs(0, 12, 6) == [(slice(0, 12), slice(0, 2))]
    assert frame_runs(7, 3, 6) == [(slice(0, 3), slice(1, 2))]  # inside one frame
    assert frame_runs(4, 0, 6) == []


@pytest.mark.parametrize("degree", [2, 4])
def test_the_split_decode_gathers_the_one_process_frames_bit_for_bit(results: dict[str, Any], degree: int) -> None:
    per_rank = _value(results[f"decode{degree}"])
    for name, latents, context, video_frames in DECODE_CASES:
        plain = per_rank[0][name]["plain"]
        assert plain.shape[0] == video_frames
        for rank, seen in enumerate(per_rank):
            assert np.array_equal(seen[name]["plain"], plain), f"{name}: rank {rank} decodes differently alone"
            assert np.array_equal(seen[name]["sp"], plain), f"{name}: rank {rank}'s split SP frames differ"
            assert np.array_equal(seen[name]["sp_whole"], plain), f"{name}: rank {rank}'s whole SP frames differ"
            assert seen[name]["whole_motion_equal"], f"{name}: rank {rank}'s motion latents differ (whole)"
            # The whole path started its stream through the kept states (a chunk with context); the split path never.
            assert seen[name]["stream_starts"] == {"whole": int(context > 0), "split": 0}, name
            assert seen[name]["float_equal"], f"{name}: rank {rank}'s gathered float frames differ"
            assert seen[name]["motion_equal"], f"{name}: rank {rank}'s motion latents differ"
        if name == "first" and degree == 4:
            assert split_frames(latents, degree)[-1] == (latents, latents)  # a rank decodes nothing


def test_a_multi_gpu_node_renders_infinitetalk_under_sp_with_the_one_process_frames(results: dict[str, Any]) -> None:
    """The node's default: a DistributedPipeline runs every rank under its SP group, so the DiT and the decoder split
    (the group carried their collectives); the ranks' frames agree (check_replicas), and each frame is the
    one-process frame bit for bit or within the quality gate's band (the DiT rounds differently under SP)."""
    rendered = _value(results["render"])
    assert rendered["collectives"] > 0
    band = Band()
    for chunk in RENDER_CHUNKS:
        node, plain = rendered["node"][chunk.name], rendered["plain"][chunk.name]
        assert node.shape == plain.shape == (chunk.n_frames, 64, 64, 3)
        for index, (candidate, baseline) in enumerate(zip(node, plain, strict=True)):
            if frame_hash(candidate) != frame_hash(baseline):
                quality, similarity = psnr(baseline, candidate), ssim(baseline, candidate)
                assert quality >= band.min_psnr and similarity >= band.min_ssim, (chunk.name, index, quality)
