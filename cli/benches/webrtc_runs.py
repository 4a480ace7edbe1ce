"""`monologue bench live --webrtc`: which stack it measures and its runs (the measurement itself is
cli/benches/webrtc.py).

The stack: a running API (`--api`, or the embedded stack when it answers), else the embedded stack started for the
bench; `--turn`, `--sfu` and `--kill` start one of their own: `--turn` with coturn on loopback and the node
relay-only; `--sfu` with Janus on loopback, the page watching through it (the node publishes the session once);
`--kill` with two nodes of one slot each, so the node holding a run's session is SIGKILLed halfway through its speech
and the session moves to the other (the stall is printed). The killed node is started again after the run, and the
next run begins once it is ready."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click

from cli.benches.webrtc import WebrtcFigures, local_store, measure
from cli.renders import api_or_stack, api_target
from cli.stack import Stack, free_port, http_ok
from monologue import SAMPLES, repo
from monologue.db import make_engine, make_sessionmaker
from monologue.settings import Settings, get_settings

READY_TIMEOUT_S = 120.0  # a restarted node warms up (one throwaway session) before /readyz answers


@dataclass(frozen=True)
class LiveBench:
    """What `monologue bench live --webrtc` was asked for."""

    runs: int = 3
    bursts: int = 5
    lip_sync: str | None = None
    whip: bool = False
    turn: bool = False
    sfu: bool = False
    kill: bool = False
    api_url: str | None = None
    dump: str | None = None


def run_live_bench(bench: LiveBench, echo: Callable[[str], None]) -> WebrtcFigures:
    """Run `bench.runs` live sessions one after another, echo each run's figures and then all of them together."""
    if bench.kill and bench.api_url is not None:
        raise click.UsageError("--kill starts a stack of its own (two nodes to kill one of): leave out --api")
    total, dumps = WebrtcFigures(), []
    with contextlib.ExitStack() as running:
        changes = _servers(bench, running)
        killer: NodeKiller | None = None
        key: str | None
        if bench.kill:
            url, key, killer = running.enter_context(_two_nodes(changes, echo))
        else:
            url, key = running.enter_context(api_or_stack(bench.api_url, changes=changes))
        for run in range(bench.runs):
            figures = measure(
                url,
                key,
                SAMPLES / "portrait.jpg",
                SAMPLES / "speech.wav",
                bursts=bench.bursts,
                options={} if bench.lip_sync is None else {"lip_sync": bench.lip_sync},
                chromium=shutil.which("chromium") or "chromium",
                store=local_store(get_settings()),
                whip=bench.whip,
                kill=None if killer is None else killer.kill,
            )
            echo(f"run {run + 1}: " + "; ".join(figures.lines()))
            total.merge(figures)
            dumps.append({"series": figures.series, "onsets_ms": figures.onsets_ms})
            if killer is not None:
                killer.restart()
    for line in total.lines():
        echo(line)
    if bench.dump is not None:
        with open(bench.dump, "w") as out:
            json.dump(dumps, out)
    return total


def _servers(bench: LiveBench, running: contextlib.ExitStack) -> dict[str, Any]:
    """The servers the bench starts on loopback (coturn, Janus), as the settings that point the stack at them."""
    changes: dict[str, Any] = {}
    if bench.turn:
        from cli.turn import turn_server
        from monologue.settings_services import IceTransportPolicy

        changes["ice"] = running.enter_context(turn_server()).ice(IceTransportPolicy.RELAY)
    if bench.sfu:
        from cli.janus import janus_server

        changes["sfu"] = running.enter_context(janus_server()).sfu()
    return changes


class NodeKiller:
    """Kills the node holding a session (SIGKILL: none of its shutdown code runs) and starts it again later."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self._killed: str | None = None
        self._ports: dict[str, int] = {}

    def start(self, node_id: str) -> None:
        port = self._ports.setdefault(node_id, free_port())
        self._stack.start_node(node_id, env={"MONOLOGUE_NODE__HTTP_PORT": str(port)})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not http_ok(f"http://{self._stack.settings.node.http_host}:{port}/readyz"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node_id} was not ready within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    def kill(self, session_id: str) -> None:
        engine = make_engine(self._stack.settings.db_url)
        try:
            with make_sessionmaker(engine)() as db:
                row = repo.get_session(db, session_id=session_id)
        finally:
            engine.dispose()
        if row is None or row.node_id is None:
            raise RuntimeError(f"session {session_id} holds no node to kill")
        self._stack.kill(f"node-{row.node_id}")
        self._killed = row.node_id

    def restart(self) -> None:
        """The node killed last, started again and ready (so the next run's session has a node to move to)."""
        if self._killed is not None:
            self.start(self._killed)
            self._killed = None


@contextlib.contextmanager
def _two_nodes(changes: dict[str, Any], echo: Callable[[str], None]) -> Iterator[tuple[str, str, NodeKiller]]:
    """A stack of its own (the settings' home and ports: the embedded stack must be down) with two one-slot nodes."""
    url, _ = api_target(None)
    if http_ok(f"{url}/healthz"):
        raise click.UsageError("--kill starts a stack of its own: stop the running one (`monologue down`)")
    base: Settings = get_settings()
    settings = base.model_copy(update={"node": base.node.model_copy(update={"capacity": 1}), **changes})
    echo(
        f"starting Temporal, the API and two nodes (live lease timeout "
        f"{min(settings.node.live_lease_timeout_s, settings.node.lease_timeout_s):g} s)…"
    )
    stack = Stack(settings)
    stack.start(with_node=False)
    try:
        killer = NodeKiller(stack)
        for node_id in (f"{settings.node.id}-a", f"{settings.node.id}-b"):
            killer.start(node_id)
        yield url, stack.api_key, killer
    finally:
        stack.stop()
