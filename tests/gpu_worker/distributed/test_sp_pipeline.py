"""Sequence parallelism on a node: the dit decoder splits its temporal and spatial stages across the ranks and gathers
frames bit-identical to a one-rank decode (2 and 4 ranks), a DistributedPipeline under SP renders the
frames of a one-process Pipeline, a rank failing mid-chunk fails the chunk on rank 0 without hanging, and
the SP settings are read and checked before any rank connects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_worker.distributed import GroupConfig
from gpu_worker.distributed.sequence import split_frames
from gpu_worker.models.dit.config import TINY
from monologue.gate import Band, frame_hash, psnr, ssim
from tests.gpu_worker.distributed.sp_work import DECODE_CASES, FRAMES_PER_BATCH, drive_four
from tests.gpu_worker.distributed.worlds import spawn_world


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[str]]:
    """A 4-rank world at SP degree 2 (MONOLOGUE_SP_DEGREE=2): rank 0's results and how ranks 1-3 left."""
    folder = tmp_path_factory.mktemp("four")
    return spawn_world(drive_four, folder, ranks=4, collective_timeout_s=4.0, deadline_s=120, sp_degree=2)


def _value(result: dict[str, Any]) -> Any:
    assert "error" not in result, result.get("traceback")
    return result["value"]


def _expected_temporal(shares: list[list[int]], context: int) -> list[list[int]]:
    """Per rank: the latents of its `prime` call (the up to `context_frames` latents before its range, the
    chunk's context included; none when there are none) and of its `temporal` call (its own range only)."""
    expected, start = [], 0
    for frames in shares:
        end = start + sum(frames)
        stride = TINY.vae.temporal_stride
        first, last = start // stride, -(-end // stride)
        priming = min(TINY.vae.context_frames, context + first)
        expected.append([] if not frames else [priming, last - first] if priming else [last - first])
        start = end
    return expected


def _check_decodes(per_rank: list[dict[str, Any]]) -> None:
    """Every rank returns the one-rank frames, and the ranks ran the one-rank batches between them, each
    its contiguous share (none twice, none skipped), the latent-rate stage only on the latents of its share
    after at most `context_frames` priming latents, and depth to time only for its own frames."""
    degree = len(per_rank)
    for name, latents, context, video_frames in DECODE_CASES:
        for step in FRAMES_PER_BATCH:
            key = f"{name}/{step}"
            plain = per_rank[0][key]["plain"]
            assert plain.shape[0] == video_frames
            for rank, cases in enumerate(per_rank):
                assert np.array_equal(cases[key]["plain"], plain), f"{key}: rank {rank} decodes differently alone"
                assert np.array_equal(cases[key]["sp"], plain), f"{key}: rank {rank}'s SP frames differ"
            one_rank = [min(step, video_frames - start) for start in range(0, video_frames, step)]
            shares = [one_rank[start:end] for start, end in split_frames(len(one_rank), degree)]
            assert [cases[key]["spatial_frames"] for cases in per_rank] == shares, key
            assert [cases[key]["temporal_latents"] for cases in per_rank] == _expected_temporal(shares, context), key
            assert [cases[key]["feature_frames"] for cases in per_rank] == shares, key
            assert latents * 4 - 4 < video_frames


def test_two_ranks_decode_their_share_of_frames_and_gather_the_one_rank_frames(results: dict[str, Any]) -> None:
    assert results["sp_degree"] == 2  # the default: every rank of the node
    _check_decodes(_value(results["sp_decode"]))


def test_four_ranks_decode_their_share_of_frames_and_gather_the_one_rank_frames(
    four: tuple[dict[str, Any], list[str]],
) -> None:
    _check_decodes(_value(four[0]["sp_decode_whole"]))


def test_a_degree_below_the_world_size_splits_the_node_into_groups_of_consecutive_ranks(
    four: tuple[dict[str, Any], list[str]],
) -> None:
    """Degree 2 on 4 ranks: ranks {0, 1} and {2, 3} each split the decode between them."""
    results, _ = four
    assert results["sp_degree"] == 2
    per_rank = _value(results["sp_decode"])
    _check_decodes(per_rank[:2])
    _check_decodes(per_rank[2:])


def test_a_distributed_pipeline_under_sp_renders_the_one_process_frames(results: dict[str, Any]) -> None:
    """The dit tiny preset, N and I chunks, a one-latent first chunk and a ragged last chunk; check_replicas
    makes both ranks' frames equal. The DiTs under SP do the one-process arithmetic on other matrix shapes
    (each rank's tokens), so fp32 sums may round differently (the SP tests bound it at 1e-5) and flip an
    occasional uint8 pixel: each frame is bit-identical or within the quality gate's band.

    Then rank 1's decoder fails once after the chunk's last collective: the chunk fails on rank 0
    (StepFailed), the group stays usable, and the chunk run again (the session brought back to rank 1, which
    dropped its mirrors) gives the same frames."""
    distributed, plain = _value(results["dit_sp"]), _value(results["dit_plain"])
    assert list(distributed["hashes"]) == ["N0", "N1", "I0", "N2", "I1"]
    assert [len(hashes) for hashes in distributed["hashes"].values()] == [4, 8, 4, 6, 4]
    band = Band()
    for name, frames in distributed["frames"].items():
        assert frames.shape == plain["frames"][name].shape
        for index, (candidate, baseline) in enumerate(zip(frames, plain["frames"][name], strict=True)):
            if frame_hash(candidate) != frame_hash(baseline):
                quality, similarity = psnr(baseline, candidate), ssim(baseline, candidate)
                assert quality >= band.min_psnr and similarity >= band.min_ssim, (name, index, quality, similarity)
        assert distributed["hashes"][name] == [frame_hash(frame) for frame in frames]
    failed = distributed["failed"]
    assert failed.get("error") == "StepFailed", failed
    assert "rank 1's decoder failed after the gather on purpose" in failed["message"]
    assert distributed["again"] == distributed["hashes"]["N0"]


def test_a_rank_failing_before_the_gather_fails_the_step_on_rank_0_without_hanging(
    four: tuple[dict[str, Any], list[str]],
) -> None:
    """Rank 3 waits in the frame gather for its SP peer rank 2, which raised: it gives up after the
    collective timeout, the ranks' collective counts on the SP group differ, and the group breaks (the node
    drains and restarts) instead of hanging."""
    results, others = four
    failed = results["mid_gather_failure"]
    assert failed.get("error") == "GroupBroken", failed
    assert "rank 2 failed before the gather on purpose" in failed["message"]
    assert all(outcome.startswith("GroupBroken") for outcome in others), others


def test_the_sp_settings_default_to_every_rank_and_must_divide_the_world() -> None:
    assert GroupConfig.from_environ({}).sequence_degree(8) == 8
    config = GroupConfig.from_environ({"MONOLOGUE_SP_DEGREE": "2", "MONOLOGUE_SP_HEAD_GROUPS": "3"})
    assert (config.sequence_degree(8), config.sp_head_groups) == (2, 3)
    assert GroupConfig.from_environ({"MONOLOGUE_SP_DEGREE": "1"}).sequence_degree(4) == 1
    with pytest.raises(ValueError, match="MONOLOGUE_SP_DEGREE=3 does not divide the node's 4 ranks"):
        GroupConfig.from_environ({"MONOLOGUE_SP_DEGREE": "3"}).sequence_degree(4)
    with pytest.raises(ValueError, match="MONOLOGUE_SP_HEAD_GROUPS must be a positive integer, got '0'"):
        GroupConfig.from_environ({"MONOLOGUE_SP_HEAD_GROUPS": "0"})


def test_a_node_refuses_an_sp_degree_that_does_not_divide_it_before_connecting(tmp_path: Path) -> None:
    from gpu_worker.distributed import RankGroup

    with pytest.raises(ValueError, match="does not divide the node's 2 ranks"):
        RankGroup.initialize(
            rank=0, world_size=2, local_rank=0, init_method=f"file://{tmp_path}/x", config=GroupConfig(sp_degree=4)
        )
