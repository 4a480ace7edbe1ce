"""A node's warm-up (node/warm.py): it builds each family it warms and runs a throwaway session through it, then
marks the node warm; a warm-up that fails or overruns its timeout stops the node, saying why."""

from __future__ import annotations

import threading

import pytest

from activities.pipelines import Pipelines, node_pipeline
from gpu_worker.pipeline import Pipeline
from monologue.contracts import Family
from monologue.settings import NodeSettings
from node.http_port import NodeHealth
from node.warm import warm


async def test_warming_builds_the_family_once_runs_a_session_and_marks_the_node_warm() -> None:
    built: list[Family] = []

    def factory(family: Family) -> Pipeline:
        built.append(family)
        return node_pipeline(family)

    pipelines, health = Pipelines(factory), NodeHealth(capacity=1)
    await warm(NodeSettings(id="n"), pipelines, health)
    assert health.warm and built == [Family.WARP]
    pipelines.get(Family.WARP)
    assert built == [Family.WARP]  # the session that follows finds it built


async def test_a_warm_up_that_fails_stops_the_node_with_its_reason() -> None:
    def broken(family: Family) -> Pipeline:
        raise RuntimeError("no accelerator answers")

    health = NodeHealth(capacity=1)
    with pytest.raises(SystemExit, match="no accelerator answers"):
        await warm(NodeSettings(id="n"), Pipelines(broken), health)
    assert not health.warm


async def test_a_warm_up_that_overruns_its_timeout_stops_the_node() -> None:
    release = threading.Event()

    def stuck(family: Family) -> Pipeline:
        release.wait(timeout=60)  # never let go before the timeout: the warm-up cannot finish in time
        raise RuntimeError("let go")

    health = NodeHealth(capacity=1)
    try:
        with pytest.raises(SystemExit, match=r"warm-up took over 0\.2 s"):
            await warm(NodeSettings(id="n", warm_up_timeout_s=0.2), Pipelines(stuck), health)
    finally:
        release.set()
    assert not health.warm
