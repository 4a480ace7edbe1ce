"""`monologue bench cluster`: sessions through a loopback cluster (cli/cluster.py) while nodes and an API
process are SIGKILLed and restarted; checks what must hold and prints figures.

What must hold (`Report.problems`, empty when all do; tests/test_cluster_chaos.py asserts it on the small
scenario): every session completes; every render's per-frame hashes equal a clean render of the same inputs made
before the chaos; every session's HLS playlist lists each stored segment exactly once and ends; no node ever
held more sessions than its slots (from the nodes' own lease logs, a killed process's leases ending at its kill).
Figures: sessions/hour, queue wait p50/p95, recovery time per node kill (kill to the first chunk of each session
it held done elsewhere, p50/max), slot utilisation, and, with Prometheus, the cluster's own metrics."""

from __future__ import annotations

import json
import random
import threading
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cli.benches.cluster_live import OPTIONS, LiveRun, start_live_session, stream_live_session
from cli.cluster import Cluster, Kill, Shape
from monologue import SAMPLES, keys
from monologue.client import Client
from monologue.contracts import TERMINAL, SessionKind, SessionStatus
from monologue.db import SessionRow, make_engine, make_sessionmaker


@dataclass(frozen=True)
class Scenario:
    shape: Shape
    renders: int
    live: int
    node_kills: int
    api_kills: int = 1
    seconds: tuple[float, ...] = (2.0, 3.5, 5.0, 6.8)  # the renders' audio lengths, cycled
    live_seconds: float = 5.0
    kill_every_s: float = 5.0
    restart_after_s: float = 4.0
    seed: int = 7
    timeout_s: float = 900.0


LIVE_RETRY_S = 60.0  # how long a live session's create is asked again after 503s

FULL = Scenario(Shape(nodes=4, capacity=2, chunk_delay_s=0.3), renders=20, live=4, node_kills=8)
# CI's: the chunks stretched and the renders long enough that six sessions outlast three kills on two nodes (a
# restarted node warms up before it is ready again: several seconds on a loaded machine).
SMALL = Scenario(
    Shape(nodes=2, capacity=2, chunk_delay_s=0.6),
    renders=4,
    live=2,
    node_kills=3,
    seconds=(8.0, 13.6),
    live_seconds=6.8,
    kill_every_s=4.0,
)


@dataclass
class Report:
    sessions: int = 0
    completed: int = 0
    wall_s: float = 0.0
    queue_wait_s: list[float] = field(default_factory=list)  # renders: created → first node (lease logs)
    recovery_s: list[float] = field(default_factory=list)  # per node kill that held sessions: to a chunk elsewhere
    taken_over_s: list[float] = field(default_factory=list)  # ... to another lease on each of its sessions
    utilisation: float = 0.0
    kills: list[str] = field(default_factory=list)
    kill_lines: list[str] = field(default_factory=list)  # per kill: when, the sessions held, each one's recovery
    problems: list[str] = field(default_factory=list)
    prometheus: dict[str, float | None] = field(default_factory=dict)

    def table(self) -> str:
        def pct(values: list[float], q: float) -> str:
            return f"{percentile(values, q):.2f}" if values else "-"

        lines = [
            f"sessions            {self.completed}/{self.sessions} completed in {self.wall_s:.1f} s",
            f"sessions/hour       {self.completed / self.wall_s * 3600:.0f}" if self.wall_s else "sessions/hour  -",
            f"queue wait (s)      p50 {pct(self.queue_wait_s, 50)}  p95 {pct(self.queue_wait_s, 95)}"
            "  (renders: created → first node)",
            f"taken over (s)      p50 {pct(self.taken_over_s, 50)}  max {pct(self.taken_over_s, 100)}"
            "  (a node kill to new leases on all its sessions)",
            f"recovery/kill (s)   p50 {pct(self.recovery_s, 50)}  max {pct(self.recovery_s, 100)}"
            f"  (to a chunk done elsewhere for each; {len(self.recovery_s)} kills held sessions)",
            f"slot utilisation    {self.utilisation:.0%}",
            f"kills               {', '.join(self.kills)}",
            *self.kill_lines,
        ]
        lines += [f"prometheus  {name:<32} {_shown(value)}" for name, value in self.prometheus.items()]
        lines += [f"PROBLEM: {problem}" for problem in self.problems] or ["checks              all hold"]
        return "\n".join(lines)


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def speech(folder: Path, seconds: float) -> Path:
    """The first `seconds` of the bundled speech as a WAV file in `folder`; past the sample's end (6.9 s) it starts
    again from the beginning, so a render can be longer than the sample."""
    path = folder / f"speech-{seconds:.2f}.wav"
    if not path.exists():
        with wave.open(str(SAMPLES / "speech.wav")) as source:
            params, sample = source.getparams(), source.readframes(source.getnframes())
        size = int(params.framerate * seconds) * params.sampwidth * params.nchannels
        frames = (sample * (size // len(sample) + 1))[:size]
        with wave.open(str(path), "wb") as target:
            target.setparams(params)
            target.writeframes(frames)
    return path


def run(cluster: Cluster, scenario: Scenario, folder: Path) -> Report:
    """The scenario on a running cluster: clean renders first, then every session under kills."""
    portrait = SAMPLES / "portrait.jpg"
    baseline = clean_renders(cluster, scenario, folder)
    started = time.time()
    renders = {
        submit(cluster, i, portrait, speech(folder, scenario.seconds[i % len(scenario.seconds)])): (
            scenario.seconds[i % len(scenario.seconds)]
        )
        for i in range(scenario.renders)
    }
    live = [LiveRun(cluster.api_urls[i % len(cluster.api_urls)]) for i in range(scenario.live)]
    audio = speech(folder, scenario.live_seconds)
    streams = []
    for run_ in live:
        # As a client does: a create refused with 503 (no node free in time while nodes die) is asked again; its
        # audio starts at once (the next create may take longer than the live idle timeout under load).
        start_live_session(cluster, run_, portrait, retry_for_s=LIVE_RETRY_S)
        streams.append(threading.Thread(target=stream_live_session, args=(cluster, run_, audio)))
        streams[-1].start()
    # Kills and restarts from this thread, which outlives every process it starts (see Cluster.restart).
    chaos(cluster, scenario, list(renders), deadline=time.monotonic() + scenario.timeout_s)
    for thread in streams:
        thread.join(scenario.timeout_s)
    return conclude(cluster, scenario, renders, live, baseline, started)


def clean_renders(cluster: Cluster, scenario: Scenario, folder: Path) -> dict[float, list[str]]:
    """Per audio length of the scenario, the frame hashes of a render made before any chaos (the reference)."""
    lengths = sorted(set(scenario.seconds))
    clean = [submit(cluster, 0, SAMPLES / "portrait.jpg", speech(folder, s)) for s in lengths]
    wait_all(cluster, clean, scenario.timeout_s)
    return {s: hashes(cluster, sid) for s, sid in zip(lengths, clean, strict=True)}


def conclude(
    cluster: Cluster,
    scenario: Scenario,
    renders: dict[str, float],
    live: list[LiveRun],
    baseline: dict[float, list[str]],
    started: float,
) -> Report:
    """Once the chaos is over: wait for every session to end, then check what must hold and take the figures."""
    sessions = [*renders, *(run_.session_id for run_ in live if run_.session_id)]
    wait_all(cluster, sessions, scenario.timeout_s)
    report = Report(sessions=len(renders) + len(live), wall_s=time.time() - started)
    report.problems += [
        f"live session through {run_.api_url}: {run_.error}" for run_ in live if run_.session_id is None
    ]
    _check(cluster, scenario, report, renders, baseline, sessions)
    _figures(cluster, report, sessions, started)
    return report


def submit(cluster: Cluster, index: int, portrait: Path, audio: Path, *, api_key: str | None = None) -> str:
    """A render through the `index`th API (round robin), with `api_key` (default: the cluster's local key)."""
    url = cluster.api_urls[index % len(cluster.api_urls)]
    with Client(url, api_key=api_key or cluster.api_key) as client:
        return client.create_render(portrait=portrait, audio=audio, options=OPTIONS).id


def database(cluster: Cluster) -> Any:
    return make_sessionmaker(make_engine(cluster.settings.db_url))


def wait_all(cluster: Cluster, session_ids: list[str], timeout_s: float) -> None:
    sessions = database(cluster)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with sessions() as db:
            statuses = db.scalars(select(SessionRow.status).where(SessionRow.id.in_(session_ids))).all()
        if len(statuses) == len(session_ids) and all(status in TERMINAL for status in statuses):
            return
        time.sleep(0.5)


def chaos(cluster: Cluster, scenario: Scenario, renders: list[str], deadline: float) -> None:
    """Every `kill_every_s` (or once another node is ready again): SIGKILL a random ready node (restarted
    `restart_after_s` later); the last API once, halfway through. Returns once the kills and restarts are done
    (or every render ended)."""
    rng = random.Random(scenario.seed)
    sessions = database(cluster)
    pending: list[tuple[float, Kill]] = []  # restarts due
    api_kill_at = scenario.node_kills // 2 if scenario.api_kills and len(cluster.api_urls) > 1 else -1
    kills, next_kill = 0, time.monotonic() + scenario.kill_every_s
    while time.monotonic() < deadline:
        now = time.monotonic()
        for due, kill in [entry for entry in pending if entry[0] <= now]:
            cluster.restart(kill)
            pending.remove((due, kill))
        with sessions() as db:
            rows = db.execute(select(SessionRow.node_id, SessionRow.status).where(SessionRow.id.in_(renders))).all()
        ended = all(status in TERMINAL for _, status in rows)
        if (kills == scenario.node_kills or ended) and not pending:
            return
        # A victim only while another node is ready to take its sessions over: a kill tests recovery, not waiting.
        ready = [node for node in sorted(cluster.node_ports) if cluster.ready(f"node-{node}")]
        if kills < scenario.node_kills and not ended and now >= next_kill and len(ready) >= 2:
            victim = rng.choice(ready)  # the sessions it holds come from its lease lines after (`held_at_kill`)
            pending.append((now + scenario.restart_after_s, cluster.kill(f"node-{victim}")))
            if kills == api_kill_at:
                pending.append((now + scenario.restart_after_s, cluster.kill(cluster.api_child(cluster.api_urls[-1]))))
            kills, next_kill = kills + 1, now + scenario.kill_every_s
        time.sleep(0.2)


def hashes(cluster: Cluster, session_id: str) -> list[str]:
    text = cluster.object(keys.frames_manifest(session_id)).decode()
    return [json.loads(line)["sha256"] for line in text.splitlines()]


def _check(
    cluster: Cluster,
    scenario: Scenario,
    report: Report,
    renders: dict[str, float],
    baseline: dict[float, list[str]],
    sessions: list[str],
) -> None:
    with database(cluster)() as db:
        rows = {row.id: row for row in db.scalars(select(SessionRow).where(SessionRow.id.in_(sessions)))}
    report.completed = sum(1 for row in rows.values() if row.status == SessionStatus.COMPLETED)
    for session_id in sessions:
        row = rows.get(session_id)
        if row is None or row.status != SessionStatus.COMPLETED:
            report.problems.append(
                f"session {session_id} ended {row.status if row else 'unrecorded'}: {row and row.error}"
            )
            continue
        if session_id in renders and hashes(cluster, session_id) != baseline[renders[session_id]]:
            report.problems.append(f"render {session_id}: frames differ from the clean render of the same inputs")
        report.problems += playlist_problems(cluster, session_id)
    node_kills = [kill for kill in cluster.kills if kill.name.startswith("node-")]
    api_kills = len(cluster.kills) - len(node_kills)
    report.kills = [kill.name for kill in cluster.kills]
    if len(node_kills) != scenario.node_kills or api_kills != scenario.api_kills:
        report.problems.append(
            f"{len(node_kills)} node and {api_kills} API kills, planned {scenario.node_kills}+{scenario.api_kills}"
        )
    report.problems += _slot_problems(cluster, scenario.shape.capacity)


def playlist_problems(cluster: Cluster, session_id: str) -> list[str]:
    playlist = cluster.object(keys.playlist(session_id)).decode().splitlines()
    listed = [line for line in playlist if line.startswith("seg-")]
    stored = sorted(key.rsplit("/", 1)[1] for key in cluster.keys(keys.output(session_id, "seg-")))
    problems = []
    if len(listed) != len(set(listed)):
        problems.append(f"session {session_id}: a segment appears twice in its playlist")
    if sorted(set(listed)) != stored:
        problems.append(
            f"session {session_id}: playlist lists {len(set(listed))} segments, storage holds {len(stored)}"
        )
    if not playlist or playlist[-1] != "#EXT-X-ENDLIST":
        problems.append(f"session {session_id}: its playlist never ended")
    return problems


def lease_intervals(cluster: Cluster, until: float) -> list[tuple[str, str, float, float]]:
    """(node, session, start, end) per lease the nodes logged; a killed process's leases end at its kill."""
    kills: dict[str, list[float]] = {}
    for kill in cluster.kills:
        kills.setdefault(kill.name.removeprefix("node-"), []).append(kill.at)
    open_: dict[tuple[str, str, int], float] = {}
    intervals = []
    for event in cluster.lease_events():
        if event["event"] == "node ready":
            continue
        key = (event["node_id"], event["session_id"], event.get("lease", 0))
        if event["event"] == "node acquired":
            open_[key] = event["at"]
        elif key in open_:
            intervals.append((key[0], key[1], open_.pop(key), event["at"]))
    for (node, session, _), start in open_.items():
        end = min((at for at in kills.get(node, []) if at >= start), default=until)
        intervals.append((node, session, start, end))
    return intervals


def _slot_problems(cluster: Cluster, capacity: int) -> list[str]:
    problems = []
    for node in cluster.node_ports:
        points = sorted(
            (t, step)
            for n, _, start, end in lease_intervals(cluster, time.time())
            if n == node
            for t, step in ((start, 1), (end, -1))
        )
        held = peak = 0
        for _, step in points:  # at equal times the -1 sorts first: a slot freed and taken at once is not two
            held += step
            peak = max(peak, held)
        if peak > capacity:
            problems.append(f"node {node} held {peak} sessions at once with {capacity} slots")
    return problems


def _figures(cluster: Cluster, report: Report, sessions: list[str], started: float) -> None:
    events = cluster.lease_events()
    with database(cluster)() as db:
        rows = db.scalars(select(SessionRow).where(SessionRow.id.in_(sessions))).all()
        # From the lease logs: a render's started_at is set by `prepare`, before it queues for a node.
        leased = {row.id: _leased_after(events, row.id, row.created_at.timestamp()) for row in rows}
        report.queue_wait_s = [
            at - row.created_at.timestamp()
            for row in rows
            if (at := leased[row.id]) is not None and row.kind is SessionKind.RENDER
        ]
    _kill_figures(cluster, report, events, started)
    ended = time.time()
    busy = sum(max(0.0, end - max(start, started)) for _, _, start, end in lease_intervals(cluster, ended))
    report.utilisation = busy / (len(cluster.node_ports) * cluster.settings.node.capacity * (ended - started))


def _kill_figures(cluster: Cluster, report: Report, events: list[dict[str, Any]], started: float) -> None:
    """Per kill: its sessions' recovery (to their first chunk done after it, from the nodes' "chunk done" lines: the
    chunk rows keep only each chunk's last making, which a later move overwrites) and when all were taken over."""
    chunks = cluster.node_events("chunk done")
    for kill in cluster.kills:
        held = held_at_kill(events, kill)
        if not held:
            continue
        done = [_first_after(chunks, "chunk done", session_id, kill.at) for session_id in held]
        firsts = [at - kill.at for at in done if at is not None]
        if firsts:
            report.recovery_s.append(max(firsts))
        recovered = ", ".join(f"{value:.1f}" for value in firsts) or "-"
        report.kill_lines.append(
            f"  {kill.name} at +{kill.at - started:.1f} s: held {len(held)}, each to a chunk elsewhere (s): {recovered}"
        )
        leases = [_leased_after(events, session_id, kill.at) for session_id in held]
        if all(at is not None for at in leases):
            report.taken_over_s.append(max(at for at in leases if at is not None) - kill.at)


def held_at_kill(events: list[dict[str, Any]], kill: Kill) -> list[str]:
    """The sessions the node held when it was killed, from its own lease lines: taken ("node acquired") since it last
    started ("node ready") and not given back ("node released") before the kill. Not its registry report, which is
    up to 2 s old: it can list a session that yielded just before, whose wait in the queue is no recovery from this
    kill, and miss one taken just before (both in contention run C8)."""
    node_id = kill.name.removeprefix("node-")
    held: list[str] = []
    for event in events:
        if event["at"] > kill.at or event.get("node_id") != node_id:
            continue
        if event["event"] == "node ready":
            held = []
        elif event["event"] == "node acquired" and event["session_id"] not in held:
            held.append(event["session_id"])
        elif event["event"] == "node released" and event["session_id"] in held:
            held.remove(event["session_id"])
    return held


def _leased_after(events: list[dict[str, Any]], session_id: str, moment: float) -> float | None:
    """When a node next took a lease on the session after `moment` (from the nodes' logs)."""
    return _first_after(events, "node acquired", session_id, moment)


def _first_after(events: list[dict[str, Any]], name: str, session_id: str, moment: float) -> float | None:
    """When a node next logged `name` for the session after `moment`."""
    return next(
        (e["at"] for e in events if e["event"] == name and e.get("session_id") == session_id and e["at"] > moment),
        None,
    )
