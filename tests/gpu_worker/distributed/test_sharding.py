"""The toy transformer gives the same output plain, sharded with FSDP2 over two CPU ranks, and offloaded
by the ModelSwitcher (sharded or not), on both ranks, after switching back and forth.

Tolerance: fp32, rtol 1e-5 (atol 1e-6 for outputs near zero); that is all these tests check. On CPU the
outputs are expected to be bit-identical (an all-gather only copies, and the matmuls see the same shapes),
but nothing here asserts it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def outputs(results: dict[str, Any]) -> list[dict[str, Any]]:
    value: list[dict[str, Any]] = results["outputs"]["value"]
    return value


def test_sharded_and_offloaded_runs_match_the_plain_run_on_every_rank(outputs: list[dict[str, Any]]) -> None:
    plain = outputs[0]["plain"]
    for rank, seen in enumerate(outputs):
        np.testing.assert_allclose(seen["plain"], plain, rtol=RTOL, atol=ATOL, err_msg=f"rank {rank} plain")
        np.testing.assert_allclose(seen["sharded"], plain, rtol=RTOL, atol=ATOL, err_msg=f"rank {rank} sharded")
        for name in ("offloaded", "sharded_offloaded"):
            for round_, output in enumerate(seen[name]):
                np.testing.assert_allclose(output, plain, rtol=RTOL, atol=ATOL, err_msg=f"rank {rank} {name} {round_}")


def test_offload_on_or_off_changes_nothing(outputs: list[dict[str, Any]]) -> None:
    for seen in outputs:
        for output in seen["offloaded"]:
            np.testing.assert_allclose(output, seen["plain"], rtol=RTOL, atol=ATOL)
        for output in seen["sharded_offloaded"]:
            np.testing.assert_allclose(output, seen["sharded"], rtol=RTOL, atol=ATOL)


def test_an_inactive_model_holds_no_device_memory(outputs: list[dict[str, Any]]) -> None:
    for seen in outputs:
        assert seen["offloaded_resident_bytes_idle"] == 0
        assert seen["offloaded_resident_bytes_active"] > 0
        assert seen["offloaded_resident_bytes_after"] == 0
        # Sharded models keep their shards on the host even while they run.
        assert seen["sharded_offloaded_resident_bytes_active"] == 0


def test_every_switch_reports_its_visible_cost(outputs: list[dict[str, Any]]) -> None:
    for seen in outputs:
        for name in ("offloaded", "sharded_offloaded"):
            costs = seen[f"{name}_visible_ms"]
            assert len(costs) == 3 and all(0 < cost < 5_000 for cost in costs), costs


def test_the_tiny_dit_audio_to_video_model_matches_sharded_and_offloaded(results: dict[str, Any]) -> None:
    """The same check on the dit family's real architecture (blocks with several inputs, attention)."""
    attempted = results["dit_outputs"]
    assert "error" not in attempted, attempted.get("traceback")
    per_rank: list[dict[str, Any]] = attempted["value"]
    plain = per_rank[0]["plain"]
    assert np.abs(plain).max() > 1e-3, "a model whose output is all zeros would prove nothing"
    for rank, seen in enumerate(per_rank):
        np.testing.assert_allclose(seen["sharded"], plain, rtol=RTOL, atol=ATOL, err_msg=f"rank {rank} sharded")
        for name in ("offloaded", "sharded_offloaded"):
            for output in seen[name]:
                np.testing.assert_allclose(output, plain, rtol=RTOL, atol=ATOL, err_msg=f"rank {rank} {name}")
