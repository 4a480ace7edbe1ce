"""Everything the 2-rank world does, in order, driven from rank 0. One world for all the distributed tests
(starting one costs seconds on two cores); each test file asserts on its own entries.

The last scenario breaks the group on purpose, so it must stay last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu_worker.distributed import DistributedPipeline, RankContext, RankGroup
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from monologue.contracts import Chunk, Family, LipSync
from tests.gpu_worker.distributed.sp_work import sp_scenarios
from tests.gpu_worker.distributed.toy import (
    DiTOutputs,
    Outputs,
    PlainForward,
    RaiseOn,
    ShardedForward,
    WhoAmI,
    build_plain_toy,
    build_sharded_toy,
)
from tests.gpu_worker.distributed.worlds import attempt

# Generation order of a short timeline: N0 N1 I0 N2 I1.
CHUNKS = [
    ChunkRequest(Chunk("N", 0, 0, 8), seed=3, lip_sync=LipSync.VISEMES),
    ChunkRequest(Chunk("N", 1, 10, 8), seed=3, lip_sync=LipSync.VISEMES),
    ChunkRequest(Chunk("I", 0, 8, 2), seed=3, lip_sync=LipSync.VISEMES),
    ChunkRequest(Chunk("N", 2, 20, 8), seed=3, lip_sync=LipSync.VISEMES),
    ChunkRequest(Chunk("I", 1, 18, 2), seed=3, lip_sync=LipSync.VISEMES),
]


@dataclass(frozen=True)
class Unpicklable:
    callback: Any = field(default=lambda: None)

    def run(self, context: RankContext) -> None:
        return None


class ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.extend(frames.copy())


def render(
    pipeline: Pipeline, portrait: np.ndarray, output: OutputSpec, *, fail_before_i0: RankGroup | None = None
) -> dict[str, list[str]]:
    """Frame hashes per chunk. With `fail_before_i0`, a step fails on rank 1 just before I0: every rank
    drops its session mirrors, so I0 must bring the session back (its reference and anchors)."""
    audio = ArrayAudio(np.random.default_rng(2).normal(scale=0.1, size=16_000 * 2).astype(np.float32))
    session = pipeline.start_session(portrait, output, audio)
    hashes: dict[str, list[str]] = {}
    for chunk in CHUNKS:
        if fail_before_i0 is not None and chunk.name == "I0":
            failed = attempt(lambda: fail_before_i0.run_on_all(RaiseOn((1,))))
            if failed.get("error") != "StepFailed":
                raise AssertionError(f"the injected failure did not fail the step: {failed}")
        sink = ListSink()
        result = pipeline.run_chunk(session, chunk, sink)
        if len(sink.frames) != chunk.n_frames:
            raise AssertionError(f"{chunk.name}: {len(sink.frames)} frames reached rank 0's sink")
        hashes[chunk.name] = result.frame_hashes
    return hashes


def toy_portrait() -> np.ndarray:
    return np.random.default_rng(4).integers(0, 256, size=(24, 32, 3), dtype=np.uint8)


def warp_portrait() -> np.ndarray:
    from PIL import Image

    with Image.open(Path(__file__).resolve().parents[3] / "monologue" / "samples" / "portrait.jpg") as image:
        return np.asarray(image.convert("RGB"))


WARP_OUTPUT = OutputSpec(fps=25, resolution="512", preview=True)


def node_activities_pipeline(group: RankGroup) -> str:
    from temporalio.testing import ActivityEnvironment

    from node.distributed_activities import DistributedNodeActivities

    activities = DistributedNodeActivities(group=group, store=None, sessions=None, node_id="test")  # type: ignore[arg-type]
    # Building a pipeline heartbeats (loading weights takes long): it runs inside an activity on a node.
    return type(ActivityEnvironment().run(activities._pipelines.get, "warp")).__name__


def drive(group: RankGroup) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["run_on_all"] = attempt(lambda: group.run_on_all(WhoAmI()))
    out["gather"] = attempt(lambda: group.gather_from_all(WhoAmI()))
    out["outputs"] = attempt(lambda: group.gather_from_all(Outputs(seed=5)))

    out["peer_error"] = attempt(lambda: group.run_on_all(RaiseOn((1,))))
    out["after_peer_error"] = attempt(lambda: group.gather_from_all(WhoAmI()))
    out["leader_error"] = attempt(lambda: group.run_on_all(RaiseOn((0,), kind="InputError")))
    out["all_error"] = attempt(lambda: group.run_on_all(RaiseOn((0, 1))))
    out["unpicklable"] = attempt(lambda: group.run_on_all(Unpicklable()))
    out["after_unpicklable"] = attempt(lambda: group.gather_from_all(WhoAmI()))
    # Rank 1 fails in the last block, after every all-gather: rank 0 finishes, nothing is out of step, and
    # FSDP's per-forward state on rank 1 is reset for the next step.
    out["late_error"] = attempt(lambda: group.run_on_all(ShardedForward(layers=2, fail_rank=1, fail_block=1)))
    out["after_late_error"] = attempt(lambda: group.gather_from_all(ShardedForward(layers=2)))
    out["plain_two_layers"] = attempt(lambda: group.run_on_all(PlainForward(layers=2)))

    out["toy_distributed"] = attempt(
        lambda: render(
            DistributedPipeline(group, "toy", builder=build_sharded_toy, check_replicas=True),
            toy_portrait(),
            OutputSpec(fps=25),
            fail_before_i0=group,
        )
    )
    out["toy_plain"] = attempt(lambda: render(Pipeline(build_plain_toy("toy")), toy_portrait(), OutputSpec(fps=25)))
    out["warp_distributed"] = attempt(
        lambda: render(DistributedPipeline(group, Family.WARP, check_replicas=True), warp_portrait(), WARP_OUTPUT)
    )
    from gpu_worker.models import build_family

    out["warp_plain"] = attempt(lambda: render(Pipeline(build_family(Family.WARP)), warp_portrait(), WARP_OUTPUT))
    out["node_activities"] = attempt(lambda: node_activities_pipeline(group))
    out["dit_outputs"] = attempt(lambda: group.gather_from_all(DiTOutputs()))
    out.update(sp_scenarios(group))  # sequence parallelism (sp_work.py, test_sp_pipeline.py)

    # Last: rank 1 fails in the first block; rank 0 goes on to gather a block rank 1 never will.
    out["broken"] = attempt(lambda: group.run_on_all(ShardedForward(layers=4, fail_rank=1, fail_block=0)))
    out["after_broken"] = attempt(lambda: group.run_on_all(WhoAmI()))
    return out
