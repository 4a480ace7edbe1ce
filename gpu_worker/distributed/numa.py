"""Pin each rank's process to the CPUs of its GPU's NUMA node.

A rank's host work (pinned-memory copies, the H.264 encoder on rank 0, Python itself) reaches its GPU
through one PCIe root; threads scheduled on the other socket cross the inter-socket link for every
byte and every page of pinned memory they touch. So each rank reads where its GPU sits
(`/sys/bus/pci/devices/<bus id>/numa_node`), which CPUs that node has
(`/sys/devices/system/node/node<N>/cpulist`) and binds every thread of the process to them.

Pinning is an optimisation, never a precondition: where there is nothing to pin to (no GPU, no sysfs,
`numa_node` = -1 on single-node machines, a container that allows none of the node's CPUs) it logs
why and changes nothing. It must never raise for those reasons.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SYSFS = Path("/sys")


@dataclass(frozen=True)
class NumaPinning:
    """What `pin_to_gpu_numa_node` did: `cpus` is empty and `reason` says why when it skipped."""

    pinned: bool
    node: int | None = None
    cpus: frozenset[int] = frozenset()
    reason: str = ""


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's cpulist format: "0-3,8-11,16", also "0-15:2/4" (use 2 of every group of 4).

    An empty file (a memory-only node) is the empty set. Anything else raises ValueError naming the part.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        try:
            span, _, stride = part.partition(":")
            first, dash, last = span.partition("-")
            low, high = int(first), int(last if dash else first)
            used, group = (int(value) for value in stride.split("/")) if stride else (1, 1)
        except ValueError:
            raise ValueError(f"bad cpulist entry {part!r} in {text.strip()!r}") from None
        if low > high or used < 1 or group < used:
            raise ValueError(f"bad cpulist entry {part!r} in {text.strip()!r}")
        cpus.update(cpu for cpu in range(low, high + 1) if (cpu - low) % group < used)
    return frozenset(cpus)


def pci_address(domain: int, bus: int, device: int) -> str:
    """The sysfs name of a PCI device's first function, e.g. "0000:1b:00.0"."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def gpu_pci_address(gpu_index: int) -> str | None:
    """The sysfs PCI address of a visible CUDA device, or None without CUDA (or an old torch)."""
    if not torch.cuda.is_available() or gpu_index >= torch.cuda.device_count():
        return None
    properties = torch.cuda.get_device_properties(gpu_index)
    ids = [getattr(properties, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(isinstance(value, int) for value in ids):
        return None
    domain, bus, device = (int(value) for value in ids if value is not None)
    return pci_address(domain, bus, device)


def plan_pinning(pci: str | None, *, allowed: frozenset[int], sysfs: Path = SYSFS) -> NumaPinning:
    """Which CPUs a process driving the GPU at `pci` should run on, given the CPUs it may use.

    Pure apart from reading sysfs, so tests point it at a fake tree. Returns `pinned=False` with a reason
    wherever pinning would be meaningless or impossible."""
    if pci is None:
        return NumaPinning(pinned=False, reason="no CUDA device")
    node_file = sysfs / "bus" / "pci" / "devices" / pci / "numa_node"
    try:
        node = int(node_file.read_text().strip())
    except (OSError, ValueError) as err:
        return NumaPinning(pinned=False, reason=f"cannot read {node_file}: {err}")
    if node < 0:
        return NumaPinning(pinned=False, reason=f"{node_file} is {node}: the firmware reports no NUMA locality")
    cpulist = sysfs / "devices" / "system" / "node" / f"node{node}" / "cpulist"
    try:
        cpus = parse_cpulist(cpulist.read_text())
    except (OSError, ValueError) as err:
        return NumaPinning(pinned=False, node=node, reason=f"cannot read {cpulist}: {err}")
    usable = cpus & allowed
    if not usable:
        return NumaPinning(
            pinned=False, node=node, reason=f"none of node {node}'s CPUs {sorted(cpus)} are allowed to this process"
        )
    return NumaPinning(pinned=True, node=node, cpus=frozenset(usable))


def pin_to_gpu_numa_node(gpu_index: int, *, sysfs: Path = SYSFS) -> NumaPinning:
    """Bind every thread of this process to the CPUs of GPU `gpu_index`'s NUMA node, or log why not.

    Call it first thing in a rank, before threads start: threads created afterwards inherit the mask.
    Threads that already exist are moved too, unless something else already narrowed their mask."""
    if not hasattr(os, "sched_setaffinity"):
        pinning = NumaPinning(pinned=False, reason="this platform has no sched_setaffinity")
    else:
        allowed = frozenset(os.sched_getaffinity(0))
        pinning = plan_pinning(gpu_pci_address(gpu_index), allowed=allowed, sysfs=sysfs)
        if pinning.pinned:
            _bind_all_threads(pinning.cpus, previous=allowed)
    if pinning.pinned:
        log.info("rank pinned to NUMA node %s: cpus %s", pinning.node, _ranges(pinning.cpus))
    else:
        log.info("NUMA pinning skipped: %s", pinning.reason)
    return pinning


def _bind_all_threads(cpus: frozenset[int], *, previous: frozenset[int]) -> None:
    os.sched_setaffinity(0, cpus)
    try:
        threads = [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return
    for thread in threads:
        try:
            if frozenset(os.sched_getaffinity(thread)) == previous:
                os.sched_setaffinity(thread, cpus)
        except OSError:
            continue  # the thread has exited since the listing


def _ranges(cpus: frozenset[int]) -> str:
    """{0, 1, 2, 3, 7} → "0-3,7", for the log line."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{first}-{last}" if last > first else f"{first}" for first, last in spans)
