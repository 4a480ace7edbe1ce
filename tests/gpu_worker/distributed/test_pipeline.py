"""DistributedPipeline on two CPU ranks renders the frames a single-process Pipeline renders, every rank
decoding the same frames (check_replicas), even after a failed step made the ranks drop their sessions."""

from __future__ import annotations

from typing import Any


def test_a_family_with_a_sharded_model_renders_the_single_process_frames(results: dict[str, Any]) -> None:
    """The toy family's audio-to-video model is sharded over both ranks; a step fails on rank 1 before I0,
    so I0 also proves that a session comes back (reference and anchors) to ranks that dropped it."""
    distributed, plain = results["toy_distributed"], results["toy_plain"]
    assert "error" not in distributed, distributed.get("traceback")
    assert distributed["value"] == plain["value"]
    assert list(distributed["value"]) == ["N0", "N1", "I0", "N2", "I1"]


def test_the_warp_family_renders_the_single_process_frames(results: dict[str, Any]) -> None:
    distributed, plain = results["warp_distributed"], results["warp_plain"]
    assert "error" not in distributed, distributed.get("traceback")
    assert distributed["value"] == plain["value"]


def test_the_node_activities_of_a_multi_gpu_node_build_distributed_pipelines(results: dict[str, Any]) -> None:
    assert results["node_activities"]["value"] == "DistributedPipeline"
