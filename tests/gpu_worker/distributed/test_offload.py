"""ModelSwitcher in one CPU process: the same code paths as on a GPU (storages really freed and refilled,
block by block) without the streams, so outputs can be checked exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gpu_worker.distributed import ModelSwitcher, measure_switches, peak_memory, reset_peak_memory
from tests.gpu_worker.distributed.toy import Block, ToyTransformer, toy_input, toy_model


def block_bytes(model: ToyTransformer) -> list[int]:
    return [sum(t.untyped_storage().nbytes() for t in [*b.parameters(), *b.buffers()]) for b in model.blocks]


@pytest.fixture
def models() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    first, second, x = toy_model(1), toy_model(2, dim=17, layers=4), toy_input(1)
    with torch.no_grad():
        return first, second, x, first(x), second(x)


def test_each_model_gives_its_own_output_however_often_the_device_switches(models: tuple) -> None:  # type: ignore[type-arg]
    first, second, x, first_out, second_out = models
    switcher = ModelSwitcher("cpu", lookahead=1)
    switcher.register(first, name="first")
    switcher.register(second, name="second")
    with torch.no_grad():
        for _ in range(3):
            switcher.activate(first)
            assert torch.equal(first(x), first_out)
            switcher.activate(second)
            assert torch.equal(second(x), second_out)


def test_blocks_come_back_one_by_one_just_before_their_forward(models: tuple) -> None:  # type: ignore[type-arg]
    first, _, x, _, _ = models
    sizes = block_bytes(first)
    switcher = ModelSwitcher("cpu", lookahead=1)
    switcher.register(first)
    assert switcher.resident_bytes(first) == 0
    switcher.activate(first)
    root = switcher.resident_bytes(first) - sizes[0]  # the root's own weights, and block 0 looked ahead
    seen = []
    for index, block in enumerate(first.blocks):
        block.register_forward_pre_hook(lambda *_, index=index: seen.append((index, switcher.resident_bytes(first))))
    with torch.no_grad():
        first(x)
    # When block n starts, blocks 0..n+1 are on the device (n+1: the look-ahead), the others not yet.
    assert seen == [(n, root + sum(sizes[: n + 2])) for n in range(len(sizes))]
    switcher.deactivate()
    assert switcher.resident_bytes(first) == 0


def test_running_a_model_that_is_not_active_fails_loudly(models: tuple) -> None:  # type: ignore[type-arg]
    first, second, x, _, _ = models
    switcher = ModelSwitcher("cpu")
    switcher.register(first, name="first")
    switcher.register(second, name="second")
    switcher.activate(second)
    with pytest.raises(RuntimeError, match="first is not active"):
        first(x)


@pytest.mark.parametrize("write_back", [True, False])
def test_write_back_decides_whether_changes_made_while_active_survive_a_switch(
    models: tuple,  # type: ignore[type-arg]
    write_back: bool,
) -> None:
    first, second, _, _, _ = models
    switcher = ModelSwitcher("cpu", write_back=write_back)
    switcher.register(first)
    switcher.register(second)
    switcher.activate(first)
    with torch.no_grad():
        first.head.bias.add_(1.0)
    changed = first.head.bias.detach().clone()
    switcher.activate(second)
    switcher.activate(first)
    assert torch.equal(first.head.bias, changed) == write_back


def test_tied_weights_are_moved_once_and_stay_tied() -> None:
    model, x = toy_model(3), toy_input(3)
    first, last = model.blocks[0], model.blocks[2]
    assert isinstance(first, Block) and isinstance(last, Block)
    last.norm.weight = first.norm.weight
    with torch.no_grad():
        first.norm.weight.mul_(1.5)
        expected = model(x)
    switcher = ModelSwitcher("cpu", lookahead=0)
    switcher.register(model)
    switcher.activate(model)
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    assert last.norm.weight is first.norm.weight


def test_registration_needs_blocks_and_happens_once(models: tuple) -> None:  # type: ignore[type-arg]
    first, _, _, _, _ = models
    switcher = ModelSwitcher("cpu")
    with pytest.raises(TypeError, match=r"has no `\.blocks: nn\.ModuleList`"):
        switcher.register(nn.Linear(2, 2))
    switcher.register(first)
    with pytest.raises(ValueError, match="already registered"):
        switcher.register(first)
    with pytest.raises(ValueError, match="not registered"):
        switcher.activate(nn.Linear(2, 2))


def test_switch_timings_and_peak_memory_for_the_benchmark(models: tuple) -> None:  # type: ignore[type-arg]
    first, second, x, _, _ = models
    switcher = ModelSwitcher("cpu")
    switcher.register(first, name="first")
    switcher.register(second, name="second")
    reset_peak_memory("cpu")
    timings = measure_switches(switcher, [(first, lambda: first(x)), (second, lambda: second(x))], rounds=2)
    assert [timing.model for timing in timings] == ["first", "second"]
    for timing in timings:
        assert len(timing.visible_ms) == 2 and 0 < timing.median_ms <= timing.worst_ms
        assert all(issue > 0 for issue in timing.issue_ms)
    assert switcher.active is None
    peak = peak_memory("cpu")
    assert peak.source == "rss" and peak.peak_mb > 10
    assert np.isfinite(peak.peak_mb)
