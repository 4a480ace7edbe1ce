"""Start a small world of ranks on loopback (gloo, CPU), drive it from rank 0, and bring back what each rank
saw. A world that does not finish in time is killed and reported, never left hanging."""

from __future__ import annotations

import pickle
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from gpu_worker.distributed import GroupBroken, GroupConfig, RankGroup

Driver = Callable[[RankGroup], dict[str, Any]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_world(
    driver: Driver,
    folder: Path,
    *,
    ranks: int = 2,
    collective_timeout_s: float = 5.0,
    deadline_s: float = 90.0,
    sp_degree: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Run `driver(group)` on rank 0 while the other ranks serve; returns its results and how each other
    rank's `serve` ended ("shutdown", or the error). `sp_degree`: GroupConfig's (None: every rank)."""
    context = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
        _rank_main,
        args=(ranks, free_port(), str(folder), driver, collective_timeout_s, sp_degree),
        nprocs=ranks,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {ranks}-rank world did not finish within {deadline_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    results = pickle.loads((folder / "rank0.pkl").read_bytes())
    return results, [(folder / f"rank{rank}.txt").read_text() for rank in range(1, ranks)]


def _rank_main(
    rank: int, ranks: int, port: int, folder: str, driver: Driver, collective_timeout_s: float, sp_degree: int | None
) -> None:
    torch.set_num_threads(1)  # two ranks share the test machine's cores
    group = RankGroup.initialize(
        rank=rank,
        world_size=ranks,
        local_rank=rank,
        init_method=f"tcp://127.0.0.1:{port}",
        config=GroupConfig(collective_timeout=timedelta(seconds=collective_timeout_s), sp_degree=sp_degree),
    )
    try:
        if rank == 0:
            results = driver(group)
            group.shutdown()
            (Path(folder) / "rank0.pkl").write_bytes(pickle.dumps(results))
        else:
            try:
                group.serve()
                outcome = "shutdown"
            except GroupBroken as err:
                outcome = f"GroupBroken: {err}"
            (Path(folder) / f"rank{rank}.txt").write_text(outcome)
    finally:
        group.close()


def attempt(call: Callable[[], Any]) -> dict[str, Any]:
    """Run one scenario; record its value or its error (as text: everything must pickle back)."""
    started = time.perf_counter()
    try:
        value = call()
    except Exception as err:
        return {
            "error": type(err).__name__,
            "message": str(err),
            "notes": list(getattr(err, "__notes__", [])),
            "traceback": traceback.format_exc(),
            "seconds": time.perf_counter() - started,
        }
    return {"value": value, "seconds": time.perf_counter() - started}
