"""Faults in the infrastructure beneath Monologue (issue 28), injected into a loopback cluster while sessions run:
`monologue bench faults` runs each and prints figures; tests/test_infra_faults.py asserts that what must hold holds.

The rig (`fault_rig`): the cluster of cli/cluster.py (one API, two nodes of two slots, chunks stretched so that a
fault lands inside sessions) on a PostgreSQL server of its own (cli/pgserver.py: it may be stopped and crashed),
SeaweedFS as S3, and Temporal's dev server on its database file. Before any fault, a clean render and a clean live
session of the same inputs: the reference frames.

Each run (`run_fault`): two renders and one live session (the client library streams its speech in real time and
reconnects after a drop), the fault injected once every session is under way, the API asked what clients ask all
the while (cli/fault_watch.py), then, once every session has ended, the checks: every session completed; its
frames equal the reference's; its playlist lists each stored segment exactly once and ends; every answer the API
gave during the fault was normal or a 503 with Retry-After. Figures: the longest stall of the live stream, the
answers by status, and the time from the fault's end to a chunk done by every session still running."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from cli.benches.cluster import Scenario, clean_renders, database, hashes, playlist_problems, speech, submit, wait_all
from cli.benches.cluster_live import OPTIONS
from cli.cluster import Cluster, Shape, cluster, fresh_database
from cli.fault_watch import Fault, PlaylistWatch, Prober
from cli.pgserver import PgServer, private_postgres
from cli.s3_faults import Exchange, FaultKind, S3FaultProxy
from cli.seaweed import SeaweedProcess, seaweed_process
from cli.stack import temporal_ready
from cli.tcp_cut import TcpCut
from monologue import SAMPLES, keys
from monologue.client import Client
from monologue.contracts import TERMINAL, SessionStatus
from monologue.db import CheckpointRow, ChunkRow, SessionRow
from monologue.settings import Settings

# A live session outlives a storage outage only while it is shorter than the idle timeout: 90 s here, 30 s by default.
SHAPE = Shape(apis=1, nodes=2, capacity=2, lease_timeout_s=10.0, chunk_delay_s=0.3, live_idle_timeout_s=90.0)
AUDIO_S = 6.8  # each session's speech (the bundled sample): long enough to outlast the fault
OUTAGE_S = 6.0  # each outage: several chunks long, shorter than the lease timeout (10 s, the default)
S3_OUTAGE_S = 30.0  # storage: longer than many chunks' writes, shorter than the nodes' retries (45 s)
THROTTLED = 0.3  # the fraction of the nodes' storage requests faulted while throttling
TIMEOUT_S = 300.0
FENCE_WAIT_S = 20.0  # the partition's node, back on storage, may try a late write this long (a figure, not a check)
FENCED_EVENT = "write fenced: a newer lease holds the session"  # activities/errors.py


@dataclass
class NodeWays:
    """A node's own ways to Temporal and to storage, which the partition cuts; storage's logs every request."""

    temporal: TcpCut
    storage: S3FaultProxy

    def cut(self) -> None:
        self.temporal.cut()
        self.storage.throttle(1.0, (FaultKind.RESET,))


@dataclass
class Rig:
    cluster: Cluster
    postgres: PgServer
    folder: Path
    ways: dict[str, NodeWays]  # node id → its ways out
    storage: SeaweedProcess
    reference: dict[str, list[str]] = field(default_factory=dict)  # "render" / "live" → the clean frames' hashes


@dataclass
class FaultReport:
    fault: Fault
    sessions: int = 0
    completed: int = 0
    identical: int = 0
    outage_s: float = 0.0
    recover_s: float | None = None  # the fault's end → a chunk done by every session running then
    live_stall_s: float = 0.0
    answers: Counter[int] = field(default_factory=Counter)
    fenced: int = 0  # writes of a stale lease refused (the partition's node, back)
    duplicates: int = 0  # segments S3 stored twice
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        codes = " ".join(f"{code}×{n}" for code, n in sorted(self.answers.items()))
        recover = "-" if self.recover_s is None else f"{self.recover_s:.1f}"
        return (
            f"{self.fault.value:<15} {self.completed}/{self.sessions} completed, {self.identical} identical,"
            f" outage {self.outage_s:.1f} s, recovered {recover} s, live stall {self.live_stall_s:.1f} s,"
            f" answers {codes}, duplicate segments {self.duplicates}, fenced writes {self.fenced}"
        )


@contextmanager
def fault_rig(postgres_admin_url: str | None = None) -> Iterator[Rig]:
    """The cluster on its own PostgreSQL server (`postgres_admin_url` is not used: the rig's server is its own so a
    fault may stop it), SeaweedFS and Temporal; the reference frames made before any fault."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="monologue-faults-") as scratch:
        root = Path(scratch)
        with (
            private_postgres() as postgres,
            fresh_database(postgres.url) as database_url,
            seaweed_process(root / "s3") as storage,
            contextlib.ExitStack() as proxies,
        ):
            s3 = storage.server
            ways: dict[str, NodeWays] = {}

            def node_env(settings: Settings, node: str) -> dict[str, str]:
                """Each node reaches Temporal and storage through proxies of its own, which the partition cuts."""
                way = ways[node] = NodeWays(
                    proxies.enter_context(TcpCut(settings.temporal.address)),
                    proxies.enter_context(S3FaultProxy(s3.endpoint_url)),
                )
                return {
                    "MONOLOGUE_TEMPORAL__ADDRESS": way.temporal.address,
                    "MONOLOGUE_STORAGE__ENDPOINT_URL": way.storage.url,
                }

            running = proxies.enter_context(cluster(root / "cluster", database_url, s3, SHAPE, node_env=node_env))
            rig = Rig(running, postgres, root, ways, storage)
            scenario = Scenario(SHAPE, renders=0, live=0, node_kills=0, seconds=(AUDIO_S,))
            rig.reference["render"] = clean_renders(running, scenario, root)[AUDIO_S]
            rig.reference["live"] = hashes(running, _live(rig, watch=False)[0])
            yield rig


def _live(rig: Rig, *, watch: bool) -> tuple[str, threading.Thread, PlaylistWatch | None]:
    """A live session streaming AUDIO_S of speech in real time through the client library (which reconnects after a
    drop); returns its id, the streaming thread and, with `watch`, its playlist's watch. Without `watch` it waits
    until the session has ended."""
    url, key = rig.cluster.api_urls[0], rig.cluster.api_key
    client = Client(url, api_key=key)
    session = client.create_live(portrait=SAMPLES / "portrait.jpg", options=OPTIONS)
    pcm = speech(rig.folder, AUDIO_S).read_bytes()[44:]
    streamer = threading.Thread(target=client.stream_audio, args=(session, pcm), daemon=True)
    streamer.start()
    playlist = PlaylistWatch(session.links.stream, key) if watch else None
    if playlist is not None:
        playlist.start()
    else:
        streamer.join(TIMEOUT_S)
        wait_all(rig.cluster, [session.id], TIMEOUT_S)
    return session.id, streamer, playlist


INJECT: dict[Fault, Callable[[Rig], None]] = {}


def injects(fault: Fault) -> Callable[[Callable[[Rig], None]], Callable[[Rig], None]]:
    def register(inject: Callable[[Rig], None]) -> Callable[[Rig], None]:
        INJECT[fault] = inject
        return inject

    return register


@injects(Fault.TEMPORAL)
def _temporal_down(rig: Rig) -> None:
    stack = rig.cluster.stack
    old = stack.kill("temporal")
    time.sleep(OUTAGE_S)
    stack.respawn(old)
    _until(lambda: temporal_ready(stack.settings), "Temporal to serve again")


@injects(Fault.POSTGRES)
def _postgres_down(rig: Rig) -> None:
    rig.postgres.stop()
    time.sleep(OUTAGE_S)
    rig.postgres.start()


@injects(Fault.POSTGRES_CRASH)
def _postgres_crash(rig: Rig) -> None:
    rig.postgres.stop(crash=True)
    time.sleep(OUTAGE_S)
    rig.postgres.start()


@injects(Fault.S3_DOWN)
def _storage_down(rig: Rig) -> None:
    rig.storage.stop()
    time.sleep(S3_OUTAGE_S)
    rig.storage.start()


@injects(Fault.S3_THROTTLE)
def _storage_throttled(rig: Rig) -> None:
    for way in rig.ways.values():
        way.storage.throttle(THROTTLED)
    time.sleep(OUTAGE_S)
    for way in rig.ways.values():
        way.storage.clear()


@injects(Fault.PARTITION)
def _partition(rig: Rig) -> None:
    """Cut the node holding most sessions off from Temporal and storage until each of them has gone on elsewhere
    (a chunk done by another node, or ended), then let it back in: storage first, so that what it was writing
    lands late while it cannot yet hear from Temporal that its lease is gone (partitions heal unevenly), and the
    fence must refuse it; Temporal once it has tried (or FENCE_WAIT_S has passed: it may have been between chunks)."""
    with database(rig.cluster)() as db:
        going = select(SessionRow.id, SessionRow.node_id).where(SessionRow.status.not_in(TERMINAL))
        holders = {session: node for session, node in db.execute(going) if node is not None}
    node = Counter(holders.values()).most_common(1)[0][0]
    stranded = [session for session, holder in holders.items() if holder == node]
    cut_at, ways = time.time(), rig.ways[node]
    ways.cut()
    _until(lambda: all(_gone_on(rig, session, node, cut_at) for session in stranded), f"{node}'s sessions to move")
    ways.storage.clear()
    fenced = lambda: any(event.get("node_id") == node for event in rig.cluster.node_events(FENCED_EVENT))  # noqa: E731
    with contextlib.suppress(TimeoutError):
        _until(fenced, f"{node} to try a late write", FENCE_WAIT_S)
    ways.temporal.heal()


def _gone_on(rig: Rig, session_id: str, node: str, since: float) -> bool:
    with database(rig.cluster)() as db:
        row = db.get(SessionRow, session_id)
        if row is None or row.status in TERMINAL:
            return True
        done_elsewhere = select(ChunkRow.updated_at).where(ChunkRow.session_id == session_id, ChunkRow.node_id != node)
        return any(moment.timestamp() > since for moment in db.scalars(done_elsewhere))


def double_publishes(exchanges: list[Exchange]) -> list[str]:
    """Each segment S3 stored more than once (PUTs it carried out), from the proxies' logs: a published segment
    written again (a stale node's late copy landing over the new node's) is what fencing forbids."""
    stored = Counter(
        exchange.path
        for exchange in exchanges
        if exchange.method == "PUT"
        and "/seg-" in exchange.path
        and exchange.s3_status is not None
        and exchange.s3_status < 300  # S3 stored it (also when its answer was then reset; a 412 stored nothing)
    )
    return [f"{path} stored {count} times" for path, count in sorted(stored.items()) if count > 1]


def run_fault(rig: Rig, fault: Fault) -> FaultReport:
    """Sessions under `fault` (from this thread: it starts processes, which die with the thread that started them)."""
    audio = speech(rig.folder, AUDIO_S)
    renders = [submit(rig.cluster, 0, SAMPLES / "portrait.jpg", audio) for _ in range(2)]
    live_id, streamer, playlist = _live(rig, watch=True)
    assert playlist is not None
    _until(lambda: _under_way(rig, [*renders, live_id]), "every session to be under way")
    _until(lambda: bool(playlist.grew_at), "the live stream's first segment")  # its stalls are counted from there
    prober = Prober(
        rig.cluster.api_urls[0],
        rig.cluster.api_key,
        renders[0],
        SAMPLES / "portrait.jpg",
        audio,
        validate_timeout_s=rig.cluster.stack.settings.api.validate_timeout_s,
    )
    prober.start()
    started, fault_started = time.monotonic(), time.time()
    INJECT[fault](rig)
    ended_at, report = time.time(), FaultReport(fault, outage_s=time.monotonic() - started)
    running = _running(rig, [*renders, live_id])
    _until(lambda: _under_way(rig, [*renders, live_id]), "the API to answer again", TIMEOUT_S)
    answers = prober.stop()
    streamer.join(TIMEOUT_S)
    sessions = [*renders, *answers.created, live_id]
    wait_all(rig.cluster, sessions, TIMEOUT_S)
    playlist.stop()
    report.answers, report.live_stall_s = answers.codes, playlist.longest_stall_s()
    report.problems += answers.broken
    report.recover_s = _recovered_after(rig, running, ended_at)
    doubles = double_publishes([exchange for way in rig.ways.values() for exchange in way.storage.exchanges])
    report.duplicates, report.problems = len(doubles), report.problems + doubles
    report.fenced = sum(event["at"] >= fault_started for event in rig.cluster.node_events(FENCED_EVENT))
    _check(rig, report, {**dict.fromkeys([*renders, *answers.created], "render"), live_id: "live"})
    return report


def _check(rig: Rig, report: FaultReport, kinds: dict[str, str]) -> None:
    with database(rig.cluster)() as db:
        rows = {row.id: row for row in db.scalars(select(SessionRow).where(SessionRow.id.in_(list(kinds))))}
    report.sessions = len(kinds)
    for session_id, kind in kinds.items():
        row = rows.get(session_id)
        if row is None or row.status != SessionStatus.COMPLETED:
            status = row.status if row is not None else "unrecorded"
            report.problems.append(f"{kind} {session_id} ended {status}: {row.error if row else ''}")
            continue
        report.completed += 1
        if hashes(rig.cluster, session_id) == rig.reference[kind]:
            report.identical += 1
        else:
            report.problems.append(f"{kind} {session_id}: frames differ from the clean {kind}'s")
        report.problems += playlist_problems(rig.cluster, session_id) + _stored_problems(rig, session_id)


def _stored_problems(rig: Rig, session_id: str) -> list[str]:
    """No partial object: every checkpoint matches its SHA-256, the final video is the init segment and the listed
    segments, whole."""
    problems = []
    with database(rig.cluster)() as db:
        checkpoints = list(db.scalars(select(CheckpointRow).where(CheckpointRow.session_id == session_id)))
    for checkpoint in checkpoints:
        if hashlib.sha256(rig.cluster.object(checkpoint.key)).hexdigest() != checkpoint.sha256:
            problems.append(f"session {session_id}: checkpoint {checkpoint.key} is corrupt")
    playlist = rig.cluster.object(keys.playlist(session_id)).decode().splitlines()
    listed = [line for line in playlist if line.startswith("seg-")]
    whole = rig.cluster.object(keys.init_segment(session_id)) + b"".join(
        rig.cluster.object(keys.output(session_id, name)) for name in listed
    )
    if rig.cluster.object(keys.final_video(session_id)) != whole:
        problems.append(f"session {session_id}: the final video is not its init segment and segments")
    return problems


def _under_way(rig: Rig, sessions: list[str]) -> bool:
    """Every session has a chunk done or has ended (the database answers: a fault's end is over for it)."""
    try:
        with database(rig.cluster)() as db:
            done = set(db.scalars(select(ChunkRow.session_id).where(ChunkRow.session_id.in_(sessions))))
            ended = set(
                db.scalars(select(SessionRow.id).where(SessionRow.id.in_(sessions), SessionRow.status.in_(TERMINAL)))
            )
    except Exception:  # the database is down: not yet
        return False
    return all(session in done or session in ended for session in sessions)


def _running(rig: Rig, sessions: list[str]) -> list[str]:
    with database(rig.cluster)() as db:
        return list(
            db.scalars(select(SessionRow.id).where(SessionRow.id.in_(sessions), SessionRow.status.not_in(TERMINAL)))
        )


def _recovered_after(rig: Rig, sessions: list[str], ended_at: float) -> float | None:
    """The fault's end → the first chunk done after it, for the last of `sessions` to do one."""
    firsts = []
    with database(rig.cluster)() as db:
        for session_id in sessions:
            done = db.scalars(select(ChunkRow.updated_at).where(ChunkRow.session_id == session_id)).all()
            later = [moment.timestamp() - ended_at for moment in done if moment.timestamp() > ended_at]
            if later:
                firsts.append(min(later))
    return max(firsts) if firsts else None


def _until(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.2)
