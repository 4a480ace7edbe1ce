"""ModelSwitcher in one CPU process: the same code paths as on a GPU (storages really freed and refilled,
block by block) without the streams, so outputs can be checked exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpu_worker.distributed import ModelSwitcher, measure_switches, peak_memory, reset_peak_memory
from gpu_worker.distributed.storages import HostCopy
from tests.gpu_worker.distributed.toy import Block, ToyTransformer, toy_input, toy_model


class CountCopies(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the bytes written by copy_ (the only op offload and restore move weights with)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.copy_.default:
            self.bytes += args[0].nbytes
        return func(*args, **(kwargs or {}))


def block_bytes(model: ToyTransformer) -> list[int]:
    return [sum(t.untyped_storage().nbytes() for t in [*b.parameters(), *b.buffers()]) for b in model.blocks]


@pytest.fixture
def models() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    first, second, x = toy_model(1), toy_model(2, dim=17, layers=4), toy_input(1)
    with torch.no_grad():
        return first, second, x, first(x), second(x)


def test_each_model_gives_its_own_output_however_often_the_device_switches(models: tuple) -> None:  # type: ignore[type-arg]
    _switch_back_and_forth(models, rounds=3)


def _switch_back_and_forth(models: tuple, rounds: int) -> None:  # type: ignore[type-arg]
    """Both models registered with one switcher, activated in turn: each gives its own output every time."""
    first, second, x, first_out, second_out = models
    switcher = ModelSwitcher("cpu", lookahead=1)
    switcher.register(first, name="first")
    switcher.register(second, name="second")
    with torch.no_grad():
        for _ in range(rounds):
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
def test_an_offload_copies_nothing_back_to_the_host_unless_asked(
    models: tuple,  # type: ignore[type-arg]
    write_back: bool,
) -> None:
    first, _, x, first_out, _ = models
    switcher = ModelSwitcher("cpu", write_back=True) if write_back else ModelSwitcher("cpu")  # the default: none
    switcher.register(first)
    switcher.activate(first)
    with torch.no_grad():
        first(x)  # every block is on the device now
    resident = switcher.resident_bytes(first)
    with CountCopies() as copies:
        switcher.deactivate()
    assert switcher.resident_bytes(first) == 0
    assert copies.bytes == (resident if write_back else 0)
    switcher.activate(first)
    with torch.no_grad():
        assert torch.equal(first(x), first_out)


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


def test_a_model_without_blocks_moves_whole_and_registration_happens_once(models: tuple) -> None:  # type: ignore[type-arg]
    first, _, x, _, _ = models
    whole = nn.Linear(x.shape[1], 4)
    with torch.no_grad():
        expected = whole(x)
    switcher = ModelSwitcher("cpu")
    switcher.register(whole)
    assert switcher.resident_bytes(whole) == 0
    switcher.activate(whole)
    assert switcher.resident_bytes(whole) == 4 * (x.shape[1] * 4 + 4)
    with torch.no_grad():
        assert torch.equal(whole(x), expected)
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


def test_a_stage_activates_several_models_and_the_next_switch_frees_them_all(models: tuple) -> None:  # type: ignore[type-arg]
    first, second, x, first_out, second_out = models
    third = toy_model(3)
    switcher = ModelSwitcher("cpu", lookahead=1)
    for model in (first, second, third):
        switcher.register(model)
    report = switcher.activate([first, second])
    with torch.no_grad():
        assert torch.equal(first(x), first_out)
        assert report.open, "the report stays open until every model of the stage has run"
        assert torch.equal(second(x), second_out)
    assert not report.open and report.visible_ms > 0
    switcher.prefetch([third])  # a no-op on CPU: an idle model holds no memory
    assert switcher.resident_bytes(third) == 0
    switcher.activate(third)
    assert switcher.resident_bytes(first) == switcher.resident_bytes(second) == 0
    with pytest.raises(RuntimeError, match="is not active"):
        first(x)


def test_host_copy_is_taken_once_and_refills_the_same_tensors_without_copying_back() -> None:
    model, x = toy_model(4), toy_input(4)
    with torch.no_grad():
        expected = model(x)
    parameters = list(model.parameters())
    copy = HostCopy([model])
    hosts = [entry.host.data_ptr() for entry in copy.storages]
    total = copy.device_bytes
    for _ in range(2):
        with CountCopies() as copies:
            copy.free()
        assert copies.bytes == 0 and copy.device_bytes == 0
        assert all(parameter.untyped_storage().nbytes() == 0 for parameter in parameters)
        copy.fill()
        assert copy.device_bytes == total
    assert [entry.host.data_ptr() for entry in copy.storages] == hosts
    assert list(model.parameters()) == parameters
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def _from_a_checkpoint(model: nn.Module, folder: Path) -> nn.Module:
    """`model` with its weights assigned from a safetensors file, as a checkpoint loads them: on the CPU they view
    the memory-mapped file, whose storages cannot be resized."""
    safetensors.torch.save_file({key: value.contiguous() for key, value in model.state_dict().items()}, folder / "m")
    model.load_state_dict(safetensors.torch.load_file(folder / "m"), assign=True)
    assert not next(model.parameters()).untyped_storage().resizable()
    return model


def test_weights_loaded_from_a_checkpoint_switch_and_park_on_the_cpu(
    models: tuple,  # type: ignore[type-arg]
    tmp_path: Path,
) -> None:
    """Switch residency and parked models free and refill storages in place: checkpoint weights get storages of
    their own first (the GPU check's dry run loads every model from one checkpoint)."""
    first, second, x = models[:3]
    for model in (first, second):
        _from_a_checkpoint(model, tmp_path)
    parameters = list(first.parameters())
    _switch_back_and_forth(models, rounds=2)
    assert list(first.parameters()) == parameters  # the same parameters, over storages of their own

    parked = _from_a_checkpoint(toy_model(4), tmp_path)
    with torch.no_grad():
        expected = parked(x)
    copy = HostCopy([parked])
    copy.free()
    assert copy.device_bytes == 0
    copy.fill()
    with torch.no_grad():
        assert torch.equal(parked(x), expected)
