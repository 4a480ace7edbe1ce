"""The rank group's step protocol on two CPU ranks: results come back to rank 0, and a failure on any rank
fails the step on rank 0, promptly, without hanging either rank."""

from __future__ import annotations

from typing import Any

import numpy as np


def test_run_on_all_returns_rank_0s_result_and_gather_returns_every_ranks(results: dict[str, Any]) -> None:
    assert results["run_on_all"]["value"] == 0
    assert results["gather"]["value"] == [0, 1]


def test_an_error_on_rank_1_fails_the_step_on_rank_0_and_the_next_step_runs(results: dict[str, Any]) -> None:
    failed = results["peer_error"]
    assert failed["error"] == "StepFailed"
    assert "rank 1: ValueError: boom on 1" in failed["message"]
    assert "Timed out" not in failed["message"]  # told by the status exchange, not by a collective's timeout
    assert results["after_peer_error"]["value"] == [0, 1]


def test_rank_0s_own_error_keeps_its_type_with_the_other_ranks_errors_as_notes(results: dict[str, Any]) -> None:
    """An InputError stays an InputError, so the activity edge still makes it non-retryable."""
    assert (results["leader_error"]["error"], results["leader_error"]["message"]) == ("InputError", "boom on 0")
    assert results["all_error"]["error"] == "ValueError"
    assert results["all_error"]["notes"] == ["also failed on rank 1: ValueError: boom on 1"]


def test_work_that_cannot_be_pickled_fails_on_rank_0_before_anything_is_sent(results: dict[str, Any]) -> None:
    assert results["unpicklable"]["error"] == "PicklingError"
    assert results["after_unpicklable"]["value"] == [0, 1]


def test_a_sharded_forward_aborted_on_rank_1_after_its_gathers_leaves_the_group_usable(
    results: dict[str, Any],
) -> None:
    """Rank 0 completes (rank 1 issued every all-gather first); rank 1's FSDP state is reset, and the next
    sharded forward on both ranks gives the plain model's output."""
    assert results["late_error"]["error"] == "StepFailed"
    assert "block failed on purpose" in results["late_error"]["message"]
    expected = results["plain_two_layers"]["value"]
    for output, _ in results["after_late_error"]["value"]:
        np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-6)


def test_a_rank_failing_mid_collective_breaks_the_group_within_the_collective_timeout(
    world: tuple[dict[str, Any], list[str]],
) -> None:
    """Rank 1 raises in the first block; rank 0 waits for a gather that never comes, gives up after the
    data plane's timeout, and both ranks learn from the status exchange that their collectives no longer
    line up: rank 0 raises GroupBroken with both errors, rank 1's serve loop ends with GroupBroken."""
    results, others = world
    broken = results["broken"]
    assert broken["error"] == "GroupBroken"
    assert "rank 1: ValueError: block failed on purpose" in broken["message"]
    assert "Timed out" in broken["message"]  # the data plane's collective timeout, not a hang
    after = results["after_broken"]
    assert (after["error"], after["message"]) == (
        "GroupBroken",
        "this node's rank group is broken (a previous step failed mid-collective)",
    )  # refused at once: nothing was sent to the ranks
    assert others == [others[0]] and others[0].startswith("GroupBroken: ")
