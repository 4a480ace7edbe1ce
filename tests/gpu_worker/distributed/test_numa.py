"""NUMA pinning: the kernel's cpulist format, where a GPU's node is read from, and the cases where there is
nothing to pin to (which must log and change nothing, never raise)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from gpu_worker.distributed.numa import parse_cpulist, pci_address, pin_to_gpu_numa_node, plan_pinning

PCI = "0000:1b:00.0"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8-11,16\n", {0, 1, 2, 3, 8, 9, 10, 11, 16}),
        ("5", {5}),
        ("", set()),
        ("\n", set()),
        ("0-7:2/4", {0, 1, 4, 5}),
        ("0-3,2-5", {0, 1, 2, 3, 4, 5}),
    ],
)
def test_cpulist_parses_ranges_singles_strides_and_empty_nodes(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("text", ["a-b", "3-1", "1-", "0-7:4/2", "0-7:0/4"])
def test_cpulist_rejects_malformed_entries_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match="bad cpulist entry"):
        parse_cpulist(text)


def test_pci_address_is_the_sysfs_name() -> None:
    assert pci_address(0, 0x1B, 0) == PCI
    assert pci_address(1, 0xDC, 3) == "0001:dc:03.0"


def fake_sysfs(root: Path, *, numa_node: str | None, cpulist: str | None, node: int = 1) -> Path:
    if numa_node is not None:
        device = root / "bus" / "pci" / "devices" / PCI
        device.mkdir(parents=True)
        (device / "numa_node").write_text(numa_node + "\n")
    if cpulist is not None:
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
    return root


def test_a_gpu_on_node_1_pins_to_node_1s_allowed_cpus(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, numa_node="1", cpulist="4-7,12-15")
    pinning = plan_pinning(PCI, allowed=frozenset(range(0, 14)), sysfs=sysfs)
    assert (pinning.pinned, pinning.node, pinning.cpus) == (True, 1, frozenset({4, 5, 6, 7, 12, 13}))


@pytest.mark.parametrize(
    ("numa_node", "cpulist", "allowed", "reason"),
    [
        ("-1", "0-7", range(8), "reports no NUMA locality"),
        (None, "0-7", range(8), "cannot read"),
        ("1", None, range(8), "cannot read"),
        ("1", "x", range(8), "cannot read"),
        ("1", "4-7", range(4), "none of node 1's CPUs"),
    ],
)
def test_nothing_to_pin_to_is_a_skip_with_a_reason(
    tmp_path: Path, numa_node: str | None, cpulist: str | None, allowed: range, reason: str
) -> None:
    sysfs = fake_sysfs(tmp_path, numa_node=numa_node, cpulist=cpulist)
    pinning = plan_pinning(PCI, allowed=frozenset(allowed), sysfs=sysfs)
    assert not pinning.pinned and not pinning.cpus
    assert reason in pinning.reason


def test_no_gpu_is_a_skip() -> None:
    assert plan_pinning(None, allowed=frozenset({0}), sysfs=Path("/nonexistent")).reason == "no CUDA device"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path taken without a GPU")
def test_pinning_without_a_gpu_logs_and_leaves_the_affinity_alone(caplog: pytest.LogCaptureFixture) -> None:
    before = os.sched_getaffinity(0)
    with caplog.at_level(logging.INFO, logger="gpu_worker.distributed.numa"):
        pinning = pin_to_gpu_numa_node(0)
    assert not pinning.pinned
    assert os.sched_getaffinity(0) == before
    assert "NUMA pinning skipped: no CUDA device" in caplog.text
