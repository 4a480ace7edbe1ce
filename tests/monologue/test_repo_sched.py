"""Which render yields its slot to a session waiting for a node (monologue/repo/sched.py): only renders that a node
holds now (the registry's lists), never live sessions; lowest class first, then the most recently started; a render
that has yielded `max_preemptions` times last; one render per asker at a time; a fair share asked only of tenants
above theirs, of the asker's class or lower; the record counts once, and a render that could not yield frees its
asker to ask another."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import sessionmaker

from monologue.contracts import AskReason, QueueClass, RenderPriority, SessionKind, SessionStatus
from monologue.db import NodeStatus, SessionRow
from monologue.repo import nodes as repo_nodes, sched as repo_sched

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
LIVE = repo_sched.Asker("live", "t", QueueClass.LIVE, AskReason.LIVE)


def _add(db: Any, session_id: str, *, tenant: str = "t", started_s_ago: float = 60.0, **fields: Any) -> None:
    values: dict[str, Any] = {
        "kind": SessionKind.RENDER,
        "status": SessionStatus.RUNNING,
        "node_id": "node-a",
        "options": {},
        "started_at": NOW - timedelta(seconds=started_s_ago),
    } | fields
    db.add(SessionRow(id=session_id, tenant=tenant, **values))
    db.commit()


def _node(
    db: Any, *held: str, node_id: str = "node-a", capacity: int | None = None, reported_s_ago: float = 1.0
) -> None:
    """The node's own report: the sessions it holds now, every slot taken unless `capacity` says more."""
    repo_nodes.report_node(
        db,
        node_id=node_id,
        capacity=len(held) if capacity is None else capacity,
        status=NodeStatus.UP,
        sessions=list(held),
        chunks_done=0,
        memory_mb=None,
        started_at=NOW - timedelta(hours=1),
    )
    db.query(repo_nodes.NodeRow).filter_by(id=node_id).update({"heartbeat_at": NOW - timedelta(seconds=reported_s_ago)})
    db.commit()


def _ask(db: Any, asker: repo_sched.Asker = LIVE, *, weights: dict[str, float] | None = None, **kw: Any) -> str | None:
    weight = (weights or {}).get
    asked = repo_sched.ask_to_yield(
        db,
        asker,
        weight=lambda tenant: weight(tenant, 1.0),
        max_preemptions=2,
        grace_s=30.0,
        now=kw.get("now", NOW),
        lost_after_s=kw.get("lost_after_s", 10.0),
    )
    return None if asked is None else asked.session_id


def test_a_session_whose_node_was_lost_is_yielded_to_as_a_live_one_is(sessions: sessionmaker[Any]) -> None:
    """Any render yields to it, by the same order; never a live session, nor the asker itself."""
    lost = repo_sched.Asker("lost", "t", QueueClass.MOVING, AskReason.NODE_LOST)
    with sessions() as db:
        _add(db, "live-running", kind=SessionKind.LIVE)
        _add(db, "lost", started_s_ago=1)  # its row still names its old node, which lists it no more
        _add(db, "high-new", options={"priority": RenderPriority.HIGH}, started_s_ago=1)
        _add(db, "normal-old", started_s_ago=100)
        _node(db, "live-running", "high-new", "normal-old")
        assert _ask(db, lost) == "normal-old"
        other = repo_sched.Asker("lost-2", "t", QueueClass.MOVING, AskReason.NODE_LOST)
        assert _ask(db, other) == "high-new"
        assert _ask(db, repo_sched.Asker("lost-3", "t", QueueClass.MOVING, AskReason.NODE_LOST)) is None


def test_the_lowest_class_then_the_most_recently_started_render_yields(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "live-running", kind=SessionKind.LIVE)  # never asked: live sessions do not yield
        _add(db, "high-new", options={"priority": RenderPriority.HIGH}, started_s_ago=1)
        _add(db, "normal-old", started_s_ago=100)
        _add(db, "normal-new", started_s_ago=5)
        _add(db, "low-old", options={"priority": RenderPriority.LOW}, started_s_ago=500)
        _add(db, "moving", started_s_ago=2)  # lost its node: its row still names it, no node lists it
        _node(db, "live-running", "high-new", "normal-old", "normal-new", "low-old")
        assert _ask(db) == "low-old"
        assert _ask(db) is None  # its render is on its way: it asks nobody else meanwhile
        assert repo_sched.record_yield(db, session_id="low-old", yielded=True)
        assert not repo_sched.record_yield(db, session_id="low-old", yielded=True)  # a retry counts once
        _node(db, "live-running", "high-new", "normal-old", "normal-new")  # low-old holds no node now
        assert _ask(db) == "normal-new"
        _yield_and_take_a_node_again(db, "normal-new")
        assert _ask(db) == "normal-new"  # yielded once: still first of its class (max 2)
        _yield_and_take_a_node_again(db, "normal-new")
        assert _ask(db) == "normal-old"  # normal-new has yielded twice: its turn comes next
        rows = {row.id: row for row in db.query(SessionRow)}
        assert (rows["low-old"].preemptions, rows["normal-new"].preemptions) == (1, 2)
        assert rows["low-old"].node_id is None and rows["normal-old"].yield_for == "live"


def test_a_live_session_takes_the_slot_of_the_tenant_holding_the_most_per_weight(sessions: sessionmaker[Any]) -> None:
    """Within the lowest class, the render of the tenant furthest above its share yields, though another tenant's
    render started later: a live session must not take a small tenant's only render while a big one holds the rest."""
    with sessions() as db:
        for i in range(3):
            _add(db, f"big{i}", tenant="big", started_s_ago=100 - i)
        _add(db, "small-render", tenant="small", started_s_ago=1)  # the most recently started
        _add(db, "small-low", tenant="small", options={"priority": RenderPriority.LOW}, started_s_ago=200)
        _node(db, "big0", "big1", "big2", "small-render", "small-low")
        assert _ask(db) == "small-low"  # the lowest class still goes first
        _node(db, "big0", "big1", "big2", "small-render")  # small-low yielded: big 3 slots, small 1
        live_2 = repo_sched.Asker("live-2", "t", QueueClass.LIVE, AskReason.LIVE)
        assert _ask(db, live_2) == "big2"
        # At weight 0.25 small's one render is 4 slots per weight against big's 3: small's render yields now.
        assert _ask(db, repo_sched.Asker("live-3", "t", QueueClass.LIVE, AskReason.LIVE), weights={"small": 0.25}) == (
            "small-render"
        )


def _yield_and_take_a_node_again(db: Any, session_id: str) -> None:
    assert repo_sched.record_yield(db, session_id=session_id, yielded=True)
    db.query(SessionRow).filter(SessionRow.id == session_id).update({"node_id": "node-a"})  # its next lease
    db.commit()


def test_each_asker_gets_its_own_render_and_stale_asks_expire(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "r1", started_s_ago=10)
        _add(db, "r2", started_s_ago=20)
        _node(db, "r1", "r2")
        other = repo_sched.Asker("live-2", "t", QueueClass.LIVE, AskReason.LIVE)
        assert [_ask(db), _ask(db, other), _ask(db)] == ["r1", "r2", None]
        # An ask older than the grace (its render ended, or never got the signal) no longer counts as under way.
        later = NOW + timedelta(seconds=31)
        _node(db, "r1", "r2", reported_s_ago=-31)
        assert _ask(db, now=later) == "r1"


def test_a_render_that_could_not_yield_frees_its_asker(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "r1", started_s_ago=10)
        _add(db, "r2", started_s_ago=20)
        _node(db, "r1", "r2")
        assert _ask(db) == "r1"
        # r1 had just lost its node when the signal came (the registry lags): it says so, uncounted.
        assert not repo_sched.record_yield(db, session_id="r1", yielded=False)
        _node(db, "r2")
        assert _ask(db) == "r2"
        assert db.get(SessionRow, "r1").preemptions == 0


def test_only_renders_a_fresh_node_report_lists_are_asked(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "only", preemptions=5)  # over the limit, but the only one: still asked
        _add(db, "silent", node_id="node-b")
        _node(db, "silent", node_id="node-b", reported_s_ago=60)  # a node silent for a minute holds nothing
        assert _ask(db) is None
        _node(db, "only")
        assert _ask(db) == "only"


def test_a_tenant_below_its_share_takes_a_slot_from_the_one_furthest_above(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        for i in range(6):
            _add(db, f"big{i}", tenant="big", started_s_ago=100 - i)
        _add(db, "mid0", tenant="mid")
        _add(db, "mid1", tenant="mid", started_s_ago=5)
        _node(db, *(f"big{i}" for i in range(6)), "mid0", "mid1")  # 8 slots: big 6, mid 2, small 0
        small = repo_sched.Asker("small-r", "small", QueueClass.NORMAL, AskReason.FAIR_SHARE)
        assert _ask(db, small) == "big5"  # shares 8/3 each: big is furthest above; its most recent yields
        # Once big has given its share away, nobody else is asked: mid is at 2 (below 2.67), small would then
        # hold 2 with big at 4.
        _node(db, *(f"big{i}" for i in range(4)), "mid0", "mid1", "small-0", "small-1")
        _add(db, "small-0", tenant="small")
        _add(db, "small-1", tenant="small")
        assert _ask(db, repo_sched.Asker("small-2", "small", QueueClass.NORMAL, AskReason.FAIR_SHARE)) is None
        # A tenant at its share never asks: big holds 4 of its 2.67.
        assert _ask(db, repo_sched.Asker("big-9", "big", QueueClass.NORMAL, AskReason.FAIR_SHARE)) is None
        # Weights: small weighs 3 (share 4.8 of 8), so it may take another from big (4, share 1.6).
        weights = {"small": 3.0}
        asker = repo_sched.Asker("small-3", "small", QueueClass.NORMAL, AskReason.FAIR_SHARE)
        assert _ask(db, asker, weights=weights) == "big3"


def test_a_tenants_live_sessions_do_not_count_against_its_renders_share(sessions: sessionmaker[Any]) -> None:
    """8 slots: small's 4 live sessions and big's 4 renders. The renders' 4 slots are shared: small, holding none of
    them, takes one of big's (counting its live sessions, small would hold 4 of its 4 and ask nobody)."""
    with sessions() as db:
        for i in range(4):
            _add(db, f"big{i}", tenant="big", started_s_ago=100 - i)
            _add(db, f"live{i}", tenant="small", kind=SessionKind.LIVE)
        _node(db, *(f"big{i}" for i in range(4)), *(f"live{i}" for i in range(4)))
        small = repo_sched.Asker("small-r", "small", QueueClass.NORMAL, AskReason.FAIR_SHARE)
        assert _ask(db, small) == "big3"
        _add(db, "small-r", tenant="small")
        _node(db, "big0", "big1", "big2", "small-r", *(f"live{i}" for i in range(4)))
        # Small holds 1 of the renders' 4 slots and big 3: small takes one more (2 and 2), then nobody yields.
        assert _ask(db, repo_sched.Asker("small-2", "small", QueueClass.NORMAL, AskReason.FAIR_SHARE)) == "big2"
        _add(db, "small-2", tenant="small")
        _node(db, "big0", "big1", "small-2", "small-r", *(f"live{i}" for i in range(4)))
        assert _ask(db, repo_sched.Asker("small-3", "small", QueueClass.NORMAL, AskReason.FAIR_SHARE)) is None


def test_a_fair_share_is_taken_only_from_the_askers_class_or_a_lower_one(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "big-normal", tenant="big", started_s_ago=50)
        _add(db, "big-low", tenant="big", options={"priority": RenderPriority.LOW}, started_s_ago=60)
        _node(db, "big-normal", "big-low", capacity=2)
        low = repo_sched.Asker("small-low", "small", QueueClass.LOW, AskReason.FAIR_SHARE)
        assert _ask(db, low) == "big-low"
        _add(db, "big-normal-2", tenant="big", started_s_ago=1)
        _node(db, "big-normal", "big-normal-2", capacity=2)
        assert _ask(db, repo_sched.Asker("small-low-2", "small", QueueClass.LOW, AskReason.FAIR_SHARE)) is None
        high = repo_sched.Asker("small-high", "small", QueueClass.HIGH, AskReason.FAIR_SHARE)
        assert _ask(db, high) == "big-normal-2"


def test_nobody_is_asked_while_a_node_reports_a_free_slot(sessions: sessionmaker[Any]) -> None:
    """A session asks with its lease, before the matcher has had a chance: a render yields only when no slot is free.
    A silent node's free slot does not count (it is being declared lost: nothing takes its slots)."""
    with sessions() as db:
        _add(db, "r1", started_s_ago=10)
        _add(db, "r2", node_id="node-b", started_s_ago=20)
        _node(db, "r1", capacity=2)
        _node(db, "r2", node_id="node-b")
        assert _ask(db, lost_after_s=3.0) is None
        assert db.get(SessionRow, "r1").yield_asked_at is None
        _node(db, "r1", capacity=2, reported_s_ago=4.0)  # node-a has gone silent: its free slot takes no lease
        assert _ask(db, lost_after_s=3.0) == "r2"
        _node(db, "r1", "r3", capacity=2)  # node-a reports again, full
        assert _ask(db, repo_sched.Asker("live-2", "t", QueueClass.LIVE, AskReason.LIVE), lost_after_s=3.0) == "r1"


def test_renders_of_a_node_silent_for_the_lease_timeout_are_not_asked(sessions: sessionmaker[Any]) -> None:
    """A killed node's last report still lists its renders; once it has been silent for the lease timeout it is
    being declared lost, and its renders (moving themselves) would only answer that they could not yield."""
    with sessions() as db:
        _add(db, "on-silent-node", node_id="node-b", started_s_ago=1)  # the most recently started: asked first
        _add(db, "on-live-node", started_s_ago=100)
        _node(db, "on-silent-node", node_id="node-b", reported_s_ago=4.0)
        _node(db, "on-live-node", reported_s_ago=1.0)
        assert _ask(db, lost_after_s=3.0) == "on-live-node"
        other = repo_sched.Asker("live-2", "t", QueueClass.LIVE, AskReason.LIVE)
        assert _ask(db, other, lost_after_s=10.0) == "on-silent-node"  # within a longer lease timeout: still held


def test_an_asker_whose_render_lost_its_node_asks_another(sessions: sessionmaker[Any]) -> None:
    """The render asked had its node killed before its next chunk boundary: it will not yield (it moves itself), so
    the asker does not wait out the grace for it; a fresh report of its node keeps the asker waiting."""
    with sessions() as db:
        _add(db, "r1", node_id="node-b", started_s_ago=10)
        _add(db, "r2", started_s_ago=20)
        _node(db, "r1", node_id="node-b")
        _node(db, "r2")
        assert _ask(db, lost_after_s=3.0) == "r1"
        assert _ask(db, lost_after_s=3.0) is None  # r1's node still reports: r1 is on its way
        later = NOW + timedelta(seconds=4)  # node-b silent for the lease timeout since (killed); node-a reports
        _node(db, "r2", reported_s_ago=-4)
        assert _ask(db, now=later, lost_after_s=3.0) == "r2"
        assert db.get(SessionRow, "r1").yield_for is None and db.get(SessionRow, "r2").yield_for == "live"


def test_a_session_that_has_ended_is_not_asked_nor_waited_for(sessions: sessionmaker[Any]) -> None:
    """A node's report lags the session's end by up to its report interval: the row says it ended. An asker whose
    render ended before yielding asks another at once (in the contention bench it waited 12 s so)."""
    with sessions() as db:
        _add(db, "ended", status=SessionStatus.COMPLETED, started_s_ago=1)  # the most recently started
        _add(db, "r1", started_s_ago=10)
        _add(db, "r2", started_s_ago=20)
        _node(db, "ended", "r1", "r2")
        assert _ask(db) == "r1"
        db.query(SessionRow).filter_by(id="r1").update({"status": SessionStatus.COMPLETED})
        db.commit()
        assert _ask(db) == "r2"
        assert db.get(SessionRow, "r1").yield_for is None


def test_a_render_that_has_just_yielded_is_not_asked_again(sessions: sessionmaker[Any]) -> None:
    """Its node's report still lists it for up to 2 s, but its row names no node (or its next one): asked, it could
    not yield, and its asker, which asks every second, lost a second each time (twice in the contention bench)."""
    with sessions() as db:
        _add(db, "r1", started_s_ago=10)
        _add(db, "r2", started_s_ago=20)
        _node(db, "r1", "r2")
        assert _ask(db) == "r1"
        assert repo_sched.record_yield(db, session_id="r1", yielded=True)  # its row names no node now
        other = repo_sched.Asker("live-2", "t", QueueClass.LIVE, AskReason.LIVE)
        assert _ask(db, other) == "r2"
        # r3 has moved to node-b (its row says so): node-a's stale report lists it, node-b's does not yet.
        _add(db, "r3", node_id="node-b", started_s_ago=1)
        _node(db, "r1", "r2", "r3")
        _node(db, "x", node_id="node-b")
        live_3 = repo_sched.Asker("live-3", "t", QueueClass.LIVE, AskReason.LIVE)
        assert _ask(db, live_3) is None  # r1 has no node, r2 is asked, r3 is not where the report says
        _node(db, "x", "r3", node_id="node-b")
        assert _ask(db, live_3) == "r3"


def test_the_asker_learns_the_node_whose_slot_it_is_handed(sessions: sessionmaker[Any]) -> None:
    """The mark names the node the render holds: the asker's next lease waits for that node's slot (handed)."""
    with sessions() as db:
        _add(db, "on-a", started_s_ago=100)
        _add(db, "on-b", node_id="node-b", started_s_ago=1)
        _node(db, "on-a")
        _node(db, "on-b", node_id="node-b")
        asked = repo_sched.ask_to_yield(
            db, LIVE, weight=lambda tenant: 1.0, max_preemptions=2, grace_s=30.0, now=NOW, lost_after_s=10.0
        )
        assert asked == repo_sched.Asked("on-b", "node-b")
