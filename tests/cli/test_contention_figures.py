"""The contention bench's figures (cli/benches/contention_figures.py) on hand-made leases: what each one counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.benches.contention_figures import (
    Lease,
    SessionLeases,
    chunk_seconds,
    fairness,
    first_node_kept,
    given_up,
    jain,
    queue_waits,
)
from monologue.contracts import QueueClass


def session(tenant: str, created: float, *leases: Lease, ended: float = 100.0) -> SessionLeases:
    return SessionLeases(tenant, QueueClass.NORMAL, created, ended, leases)


def test_jain_is_one_when_equal_and_one_over_n_when_one_has_all() -> None:
    assert jain([3.0, 3.0]) == pytest.approx(1.0)
    assert jain([6.0, 0.0]) == pytest.approx(0.5)
    assert jain([0.0, 0.0]) is None


def test_queue_waits_count_the_first_lease_and_moves_after_a_yield_not_after_a_kill() -> None:
    moved = session("a", 0.0, Lease(2.0, 5.0, killed=False), Lease(6.5, 8.0, killed=True), Lease(12.0, 15.0, False))

    waits = queue_waits([moved, session("b", 1.0, Lease(4.0, 9.0, False))])

    assert waits == {("a", QueueClass.NORMAL): [2.0], ("a", QueueClass.MOVING): [1.5], ("b", QueueClass.NORMAL): [3.0]}
    assert given_up([moved]) == 1  # the first lease, released; the second ended with its node's kill


def test_fairness_counts_slot_seconds_only_while_every_tenant_waits() -> None:
    # a holds a slot 0-10 and waits with a second session 0-4; b waits 0-6, then holds a slot 6-10.
    sessions = [
        session("a", 0.0, Lease(0.0, 10.0, False)),
        session("a", 0.0, Lease(4.0, 10.0, False)),
        session("b", 0.0, Lease(6.0, 10.0, False)),
    ]

    result = fairness(sessions, {"a": 1.0, "b": 1.0})

    assert result.window_s == pytest.approx(4.0)  # both waited 0-4
    assert result.slot_s == {"a": pytest.approx(4.0), "b": 0.0}
    assert result.index == pytest.approx(0.5)  # b got nothing while it wanted a slot


def test_fairness_divides_slot_seconds_by_weight() -> None:
    sessions = [
        session("a", 0.0, Lease(0.0, 10.0, False), Lease(0.0, 10.0, False)),  # two slots (as if two sessions)
        session("a", 0.0),  # ... and one waiting all along
        session("b", 0.0, Lease(0.0, 10.0, False)),
        session("b", 0.0),
    ]

    assert fairness(sessions, {"a": 2.0, "b": 1.0}).index == pytest.approx(1.0)


def test_chunk_seconds_are_between_consecutive_n_chunks_of_a_render_on_one_node() -> None:
    events: list[dict[str, object]] = [
        {"session_id": "r", "node_id": "n1", "chunk": "N0", "at": 10.0},
        {"session_id": "r", "node_id": "n1", "chunk": "N1", "at": 11.5},
        {"session_id": "r", "node_id": "n1", "chunk": "I0", "at": 12.0},
        {"session_id": "r", "node_id": "n1", "chunk": "N2", "at": 13.5},
        {"session_id": "r", "node_id": "n2", "chunk": "N3", "at": 30.0},  # moved: no gap across nodes
        {"session_id": "live", "node_id": "n1", "chunk": "N1", "at": 12.2},  # not a render
    ]

    assert chunk_seconds(events, {"r"}) == [1.5, 2.0]


def test_the_benchs_kept_logs_are_the_log_files_alone(tmp_path: Path) -> None:
    """`monologue bench cluster --keep-logs DIR` copies every process's *.log, in its subfolder, and nothing else."""
    from cli.benches.cluster_run import copy_logs

    source = tmp_path / "cluster"
    (source / "logs").mkdir(parents=True)
    (source / "logs" / "node-n1.log").write_text('{"event": "node acquired"}\n')
    (source / "api.log").write_text("up\n")
    (source / "state.db").write_bytes(b"sqlite")
    (source / "media").mkdir()
    (source / "media" / "segment.ts").write_bytes(b"ts")
    copy_logs(source, tmp_path / "kept")
    kept = sorted(str(path.relative_to(tmp_path / "kept")) for path in (tmp_path / "kept").rglob("*") if path.is_file())
    assert kept == ["api.log", "logs/node-n1.log"]


def test_a_kill_moves_the_sessions_its_node_held_by_its_own_lease_lines() -> None:
    """Not its last registry report (up to 2 s old): a session that yielded just before the kill is not one it moved,
    one taken just before is; a session the node held before an earlier kill (no release logged) is not held now."""
    from cli.benches.cluster import held_at_kill
    from cli.cluster import Kill

    def line(at: float, event: str, node: str, session: str = "") -> dict[str, object]:
        return {"at": at, "event": event, "session_id": session, "node_id": node}

    events = [
        line(0.0, "node ready", "n1"),
        line(0.5, "node acquired", "n1", "killed-before"),  # the node's earlier life, ended by a kill
        line(1.0, "node ready", "n1"),  # restarted
        line(1.5, "node acquired", "n1", "stays"),
        line(2.0, "node acquired", "n1", "yielded"),
        line(4.6, "node released", "n1", "yielded"),  # gave its slot up 0.7 s before the kill
        line(4.65, "node acquired", "n1", "just-taken"),  # after the last report
        line(4.7, "node acquired", "n2", "elsewhere"),
        line(6.0, "node released", "n1", "stays"),  # after the kill: its lease's end, not the session leaving
    ]
    kill = Kill("node-n1", 5.3)  # its registry report at about 4 s listed "stays" and "yielded"
    assert held_at_kill(events, kill) == ["stays", "just-taken"]


def test_live_ttff_is_kept_apart_for_sessions_moved_before_their_first_segment() -> None:
    """A session with a second lease before its first segment was moved (its node killed) before any frame."""
    first_segment = {"kept": 10.0, "moved": 12.0, "moved-later": 11.0}
    starts = {"kept": [8.0], "moved": [8.0, 11.0], "moved-later": [8.0, 20.0]}
    assert first_node_kept(first_segment, starts) == {"kept", "moved-later"}
