"""`monologue bench cluster --scenario contention` (issue 27): two tenants contend for an oversubscribed loopback
cluster (cli/cluster.py) while nodes are SIGKILLed and restarted. Tenant "big" submits 20 renders, then tenant
"small" 2 renders; 4 live sessions of "small" arrive one by one while every slot is busy (4 nodes × 2 slots: 8 slots
for 26 sessions). It checks what the cluster bench checks (cli/benches/cluster.py: every session completes, every
render's frames equal a clean render's, each segment once per playlist, no node over its slots) and prints:

- live TTFF, two ways: the service's own (`sessions.ttff_ms`: first audio stored → first segment published), and
  the client's (its first create request → first segment published: admission, 503s and retries included);
- live admission: first create request → accepted (a node holds the session), and the creates refused with 503;
- recovery per node kill, p50/p95, as the cluster bench measures it (kill → a chunk of each of its sessions done
  elsewhere);
- queue wait per tenant and class, fairness (Jain's index over slot-seconds / weight while both tenants waited)
  and one chunk's duration: cli/benches/contention_figures.py defines each;
- preemptions (`sessions.preemptions`), and how many of the preempted renders' frames equal their clean render's;
- leases given up with their node alive and followed by another (yields, and moves off a node found unresponsive);
with each of issue 27's goals marked met or missed: figures, never a failure (only an invariant fails the run)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, select

from cli.benches.cluster import (
    Report,
    Scenario,
    chaos,
    clean_renders,
    conclude,
    database,
    hashes,
    lease_intervals,
    percentile,
    speech,
    submit,
)
from cli.benches.cluster_live import LiveRun, start_live_session, stream_live_session
from cli.benches.cluster_run import bench_stack
from cli.benches.contention_figures import (
    Fairness,
    Lease,
    SessionLeases,
    chunk_seconds,
    fairness,
    first_node_kept,
    given_up,
    queue_waits,
)
from cli.cluster import Cluster, Shape
from monologue import SAMPLES, apikeys
from monologue.contracts import QueueClass, SessionKind, SessionStatus, render_options
from monologue.db import ChunkRow, SessionRow
from monologue.settings import SchedSettings

LIVE_TTFF_GOAL_S = 3.0  # issue 27: a live session's first frames within 3 s, however busy the cluster
SUBMITTERS = 8  # renders uploaded at once


@dataclass(frozen=True)
class Tenant:
    """One tenant's part of the scenario: its renders (submitted in the order of `Contention.tenants`), its live
    sessions and its fairness weight (MONOLOGUE_SCHED__TENANT_WEIGHTS)."""

    name: str
    renders: int
    live: int = 0
    weight: float = 1.0


@dataclass(frozen=True)
class Contention:
    scenario: Scenario  # the cluster, the kills, the audio lengths; its renders and live are the tenants' totals
    tenants: tuple[Tenant, ...]
    live_first_s: float = 5.0  # the first live session arrives this long after the last render is submitted...
    live_every_s: float = 8.0  # ... and each next one this much later, so they arrive under the kills
    live_retry_s: float = 60.0  # a create refused with 503 (no node in time) is asked again for this long

    def __post_init__(self) -> None:
        renders, live = sum(t.renders for t in self.tenants), sum(t.live for t in self.tenants)
        if (renders, live) != (self.scenario.renders, self.scenario.live):
            raise ValueError(
                f"the tenants have {renders} renders and {live} live sessions, the scenario"
                f" {self.scenario.renders} and {self.scenario.live}"
            )

    @property
    def weights(self) -> dict[str, float]:
        return {tenant.name: tenant.weight for tenant in self.tenants}


# The cluster bench's FULL shape (its figures are the "before"), 26 sessions on 8 slots. Renders of 6.8-17 s (the
# full scenario's are 2-6.8 s): on two loaded cores shorter ones end before the queue builds up and the kills land.
# No API kill: a killed API cuts a live stream, whose session then ends by its idle timeout, which would blur the
# live figures (the full scenario kills one). Equal weights: while both tenants wait, each should get half the slots.
CONTENTION = Contention(
    Scenario(
        Shape(nodes=4, capacity=2, chunk_delay_s=0.3),
        renders=22,
        live=4,
        node_kills=4,
        api_kills=0,
        seconds=(6.8, 10.0, 13.6, 17.0),
        live_seconds=6.8,
        kill_every_s=8.0,
    ),
    tenants=(Tenant("big", renders=20), Tenant("small", renders=2, live=4)),
)


@dataclass
class ContentionReport:
    cluster: Report  # the invariants and the cluster bench's figures
    lease_timeout_s: float
    weights: dict[str, float]
    small: str  # the tenant with the fewest sessions: its renders' wait is a goal
    live_ttff_s: list[float] = field(default_factory=list)  # sessions.ttff_ms: first audio → first segment
    live_ttff_kept_s: list[float] = field(default_factory=list)  # ... of those no kill moved before it
    live_first_segment_s: list[float] = field(default_factory=list)  # client: first create → first segment
    live_admission_s: list[float] = field(default_factory=list)  # client: first create → accepted
    live_refusals: list[str] = field(default_factory=list)  # each refused create's reason (503)
    waits: dict[tuple[str, QueueClass], list[float]] = field(default_factory=dict)
    fairness: Fairness = field(default_factory=Fairness)
    chunk_s: list[float] = field(default_factory=list)
    given_up: int = 0  # leases followed by another with their node alive (`given_up`)
    preemptions: int = 0
    preempted: list[str] = field(default_factory=list)  # renders that gave their slot up at least once
    preempted_equal: int = 0  # ... whose frames equal the clean render's

    @property
    def problems(self) -> list[str]:
        return self.cluster.problems

    def table(self) -> str:
        chunk = percentile(self.chunk_s, 50) if self.chunk_s else None
        lines = [self.cluster.table(), "", f"contention (weights {self.weights})"]
        lines += [
            f"live TTFF (s)       service {_figure(self.live_ttff_s)}"
            "  (sessions.ttff_ms: first audio stored → first segment)",
            f"                    service {_figure(self.live_ttff_kept_s)}  (the same, no kill moved them first)",
            f"                    client  {_figure(self.live_first_segment_s)}  (first create request → first segment)",
            f"live admission (s)  {_figure(self.live_admission_s)}  ({len(self.live_refusals)} creates refused: 503)",
            *(f"  503 x{count}: {reason}" for reason, count in Counter(self.live_refusals).items()),
            f"recovery/kill (s)   p50 {_pct(self.cluster.recovery_s, 50)}  p95 {_pct(self.cluster.recovery_s, 95)}",
            f"one chunk (s)       p50 {_shown(chunk)}  (N chunk done → next N chunk done, one render on one node)",
        ]
        for (tenant, queue_class), waits in sorted(self.waits.items(), key=lambda i: (i[0][0], i[0][1].priority_key)):
            lines.append(f"queue wait {tenant + '/' + queue_class.value:<13} {_figure(waits)}")
        share = ", ".join(f"{tenant} {seconds:.1f}" for tenant, seconds in self.fairness.slot_s.items())
        lines.append(
            f"fairness (Jain)     {_shown(self.fairness.index)}  over {self.fairness.window_s:.1f} s with both"
            f" waiting; slot-seconds then: {share}"
        )
        lines.append(f"preemptions         {self.preemptions} (by {len(self.preempted)} renders)")
        lines.append(
            f"moves, node alive   {self.given_up} (a lease given up and another taken with no kill: the"
            f" {self.preemptions} yields, the rest a live node found unresponsive)"
        )
        return "\n".join(lines + self._goals(chunk))

    def _goals(self, chunk: float | None) -> list[str]:
        small = self.waits.get((self.small, QueueClass.NORMAL), [])
        recovery_goal = None if chunk is None else self.lease_timeout_s + 2 * chunk
        return [
            _goal("live TTFF p95 (service)", _p95(self.live_ttff_s), LIVE_TTFF_GOAL_S),
            _goal("live TTFF p95 (service, no kill before it)", _p95(self.live_ttff_kept_s), LIVE_TTFF_GOAL_S),
            _goal("recovery/kill p95", _p95(self.cluster.recovery_s), recovery_goal, "lease timeout + 2 chunks"),
            _goal(f"{self.small}'s render wait p95", _p95(small), chunk, "one chunk"),
            f"goal  preempted renders' frames = clean render's: {self.preempted_equal}/{len(self.preempted)}"
            f"  {'met' if self.preempted_equal == len(self.preempted) else 'MISSED'}",
        ]


def _figure(values: list[float]) -> str:
    return f"n={len(values):<3} p50 {_pct(values, 50)}  p95 {_pct(values, 95)}  max {_pct(values, 100)}"


def _pct(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "-"


def _p95(values: list[float]) -> float | None:
    return percentile(values, 95) if values else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _goal(name: str, value: float | None, limit: float | None, meaning: str = "") -> str:
    verdict = "-" if value is None or limit is None else ("met" if value <= limit else "MISSED")
    bound = f"{_shown(limit)} s" + (f" ({meaning})" if meaning else "")
    return f"goal  {name} {_shown(value)} s ≤ {bound}  {verdict}"


def bench_contention(
    contention: Contention, postgres_admin_url: str, keep_logs: Path | None = None
) -> ContentionReport:
    """The scenario on a fresh cluster whose tenants weigh `contention.weights`, with the Prometheus figures (and the
    processes' logs copied to `keep_logs`)."""
    sched = SchedSettings(tenant_weights=contention.weights)
    with bench_stack(contention.scenario.shape, postgres_admin_url, sched, keep_logs) as bench:
        report = run_contention(bench.cluster, contention, bench.folder)
        report.cluster.prometheus = bench.figures()
    return report


def run_contention(cluster: Cluster, contention: Contention, folder: Path) -> ContentionReport:
    """Clean renders first; then the tenants' renders, the live sessions arriving one by one, and the kills."""
    scenario = contention.scenario
    keys = tenant_keys(cluster, contention.tenants)
    baseline = clean_renders(cluster, scenario, folder)
    started = time.time()
    renders = _submit_renders(cluster, contention, keys, folder)
    live, clients = _start_live(cluster, contention, keys, folder)
    # Kills and restarts from this thread, which outlives every process it starts (see Cluster.restart).
    chaos(cluster, scenario, list(renders), deadline=time.monotonic() + scenario.timeout_s)
    for client in clients:
        client.join(scenario.timeout_s)
    report = ContentionReport(
        cluster=conclude(cluster, scenario, renders, live, baseline, started),
        lease_timeout_s=scenario.shape.lease_timeout_s,
        weights=contention.weights,
        small=min(contention.tenants, key=lambda t: t.renders + t.live).name,
    )
    _live_figures(cluster, report, live)
    _schedule_figures(cluster, report, renders, [run.session_id for run in live if run.session_id])
    _preemption_figures(cluster, report, renders, baseline)
    return report


def tenant_keys(cluster: Cluster, tenants: tuple[Tenant, ...]) -> dict[str, str]:
    """A new API key (no scopes) per tenant, by name."""
    with database(cluster)() as db:
        return {tenant.name: apikeys.create_key(db, tenant=tenant.name)[1] for tenant in tenants}


def _submit_renders(cluster: Cluster, contention: Contention, keys: dict[str, str], folder: Path) -> dict[str, float]:
    """Every tenant's renders, tenant after tenant, each tenant's all at once (a burst: one by one, the first
    would be done before the last arrived, and nothing would wait); id → its audio's length."""
    lengths, portrait = contention.scenario.seconds, SAMPLES / "portrait.jpg"
    audio = {seconds: speech(folder, seconds) for seconds in lengths}  # each file written once, before the threads
    renders: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=SUBMITTERS) as pool:
        for tenant in contention.tenants:
            key, first = keys[tenant.name], len(renders)
            seconds = [lengths[i % len(lengths)] for i in range(first, first + tenant.renders)]
            futures = [
                pool.submit(submit, cluster, first + n, portrait, audio[length], api_key=key)
                for n, length in enumerate(seconds)
            ]
            renders |= {future.result(): length for future, length in zip(futures, seconds, strict=True)}
    return renders


def _start_live(
    cluster: Cluster, contention: Contention, keys: dict[str, str], folder: Path
) -> tuple[list[LiveRun], list[threading.Thread]]:
    """A client thread per live session: it waits for its turn, creates the session (again after a 503) and
    streams speech in real time."""
    urls = cluster.api_urls
    owners = [tenant.name for tenant in contention.tenants for _ in range(tenant.live)]
    runs = [LiveRun(urls[i % len(urls)], api_key=keys[owner]) for i, owner in enumerate(owners)]
    audio = speech(folder, contention.scenario.live_seconds)
    clients = [
        threading.Thread(
            target=_live_client,
            args=(cluster, run, audio, contention.live_first_s + i * contention.live_every_s, contention.live_retry_s),
        )
        for i, run in enumerate(runs)
    ]
    for client in clients:
        client.start()
    return runs, clients


def _live_client(cluster: Cluster, run: LiveRun, audio: Path, delay_s: float, retry_s: float) -> None:
    time.sleep(delay_s)
    start_live_session(cluster, run, SAMPLES / "portrait.jpg", retry_for_s=retry_s)
    stream_live_session(cluster, run, audio)


def _live_figures(cluster: Cluster, report: ContentionReport, live: list[LiveRun]) -> None:
    admitted = {run.session_id: run for run in live if run.session_id}
    report.live_refusals = [reason for run in live for reason in run.refusals]
    report.live_admission_s = [
        run.admitted_at - run.requested_at for run in live if run.admitted_at and run.requested_at
    ]
    with database(cluster)() as db:
        rows = db.execute(select(SessionRow.id, SessionRow.ttff_ms).where(SessionRow.id.in_(admitted))).all()
        first = db.execute(
            select(ChunkRow.session_id, func.min(ChunkRow.published_at))
            .where(ChunkRow.session_id.in_(admitted))
            .group_by(ChunkRow.session_id)
        ).all()
    ttff = {session_id: ms / 1000 for session_id, ms in rows if ms is not None}
    first_at = {session_id: at.timestamp() for session_id, at in first if at is not None}
    report.live_ttff_s = list(ttff.values())
    report.live_first_segment_s = [at - (admitted[sid].requested_at or 0.0) for sid, at in first_at.items()]
    starts: dict[str, list[float]] = {}
    for _, session_id, start, _ in lease_intervals(cluster, time.time()):
        starts.setdefault(session_id, []).append(start)
    kept = first_node_kept(first_at, starts)
    report.live_ttff_kept_s = [seconds for session_id, seconds in ttff.items() if session_id in kept]


def _schedule_figures(cluster: Cluster, report: ContentionReport, renders: dict[str, float], live: list[str]) -> None:
    """Queue waits, fairness and one chunk's duration, from the lease logs and the sessions' rows."""
    until = time.time()
    killed = {(kill.name.removeprefix("node-"), kill.at) for kill in cluster.kills}
    leases: dict[str, list[Lease]] = {}
    for node, session_id, start, end in lease_intervals(cluster, until):
        leases.setdefault(session_id, []).append(Lease(start, end, (node, end) in killed))
    with database(cluster)() as db:
        rows = db.scalars(select(SessionRow).where(SessionRow.id.in_([*renders, *live]))).all()
        sessions = [
            SessionLeases(
                tenant=row.tenant,
                first_class=QueueClass.of(row.kind, render_options(row.options or {}).priority, moving=False),
                created=row.created_at.timestamp(),
                ended=row.finished_at.timestamp() if row.finished_at else until,
                leases=tuple(sorted(leases.get(row.id, []), key=lambda lease: lease.start)),
            )
            for row in rows
        ]
    report.waits = queue_waits(sessions)
    report.given_up = given_up(sessions)
    report.fairness = fairness(sessions, report.weights)
    report.chunk_s = chunk_seconds(cluster.node_events("chunk done"), set(renders))


def _preemption_figures(
    cluster: Cluster, report: ContentionReport, renders: dict[str, float], baseline: dict[float, list[str]]
) -> None:
    with database(cluster)() as db:
        rows = db.execute(
            select(SessionRow.id, SessionRow.preemptions, SessionRow.status).where(
                SessionRow.id.in_(renders), SessionRow.kind == SessionKind.RENDER
            )
        ).all()
    report.preemptions = sum(count for _, count, _ in rows)
    report.preempted = [session_id for session_id, count, _ in rows if count]
    report.preempted_equal = sum(
        1
        for session_id, count, status in rows
        if count and status == SessionStatus.COMPLETED and hashes(cluster, session_id) == baseline[renders[session_id]]
    )
