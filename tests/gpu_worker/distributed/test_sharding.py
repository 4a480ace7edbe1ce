"""The toy transformer gives the same output plain, sharded with FSDP2 over two CPU ranks, and offloaded
by the ModelSwitcher (sharded or not), on both ranks, after switching back and forth.

Tolerance: fp32, rtol 1e-5 (atol 1e-6 for outputs near zero); that is all these tests check. On CPU the
outputs are expected to be bit-identical (an all-gather only copies, and the matmuls see the same shapes),
but nothing here asserts it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpu_worker.distributed import RankContext, RankGroup, shard_model
from gpu_worker.distributed.sharding import mixed_precision, transformer_blocks
from gpu_worker.models.dit import SMOKE_SEED
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.runtime import Precision, TorchModule
from tests.gpu_worker.distributed.worlds import attempt, spawn_world

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


class AudioToVideoOnly(TorchModule):
    model_names = ("a2v",)


@dataclass(frozen=True)
class RunningForward:
    """The tiny A2V DiT under `TorchModule.running()` on this rank, plain and sharded over both ranks, with
    its parameters stored in `precision`; and what the sharded forward ran under."""

    precision: Precision

    def run(self, context: RankContext) -> dict[str, Any]:
        from tests.gpu_worker.models.dit.test_flow import _conditioning

        def load() -> AudioToVideoOnly:
            module = AudioToVideoOnly(Weights(TINY, seed=SMOKE_SEED), self.precision)
            module.load()
            return module

        plain, sharded = load(), load()
        model = shard_model(sharded.models["a2v"], context.group.mesh)
        seen: dict[str, Any] = {}

        def record(block: torch.nn.Module, args: Any) -> None:
            seen["gathered_dtype"] = str(next(block.parameters()).dtype)
            seen["grad"], seen["inference"] = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

        first_block: torch.nn.Module = transformer_blocks(model)[0]
        first_block.register_forward_pre_hook(record)
        generator = torch.Generator().manual_seed(6)
        cond = _conditioning(1, generator)
        noisy = torch.randn(1, TINY.latent_channels, 4, 4, 4, generator=generator)
        t = torch.full((1,), 0.5)
        with plain.running():
            seen["plain"] = plain.models["a2v"](noisy, t, cond).float().numpy()
        with sharded.running():
            seen["sharded"] = model(noisy, t, cond).float().numpy()
        return seen


def drive_running(group: RankGroup) -> dict[str, Any]:
    steps = {precision: RunningForward(precision) for precision in (Precision.FP32, Precision.BF16)}
    return {precision: attempt(partial(group.gather_from_all, step)) for precision, step in steps.items()}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results, _ = spawn_world(drive_running, Path(tmp_path_factory.mktemp("running")), deadline_s=90)
    return results


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.BF16])
def test_a_sharded_model_under_running_matches_the_plain_one(running: dict[str, Any], precision: Precision) -> None:
    """`running()` is no_grad, not inference_mode (under which FSDP2 cannot unshard on torch 2.11), and FSDP
    gathers the parameters in the dtype they are stored in."""
    attempted = running[precision]
    assert "error" not in attempted, attempted.get("traceback")
    for rank, seen in enumerate(attempted["value"]):
        assert not seen["grad"] and not seen["inference"], rank
        assert seen["gathered_dtype"] == str(precision.dtype("cpu")), rank
        assert np.abs(seen["plain"]).max() > 1e-3
        np.testing.assert_allclose(seen["sharded"], seen["plain"], rtol=RTOL, atol=ATOL, err_msg=f"rank {rank}")


def test_the_fsdp_policy_computes_in_the_given_dtype_and_reduces_in_fp32() -> None:
    policy = mixed_precision(torch.bfloat16)
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
