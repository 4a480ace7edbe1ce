"""The queue estimate (`monologue.queueing`): positions by class, then weighted fair tags within a class, and ETAs by
list scheduling over the slots, checked against numbers worked out by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from monologue.contracts import QueueClass
from monologue.queueing import QueueState, Running, Waiting, dispatch_order, estimate

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NORMAL = QueueClass.NORMAL


def _waiting(
    session_id: str, tenant: str, second: float, chunks: int | None = 4, queue_class: QueueClass = NORMAL
) -> Waiting:
    return Waiting(session_id, tenant, queue_class, T0 + timedelta(seconds=second), chunks)


def _weights(**weights: float) -> Callable[[str], float]:
    return lambda tenant: weights.get(tenant, 1.0)


def _state(
    waiting: Sequence[Waiting],
    running: Sequence[Running] = (),
    *,
    slots: int = 1,
    seconds_per_chunk: float | None = 2.0,
    weight: Callable[[str], float] | None = None,
) -> QueueState:
    return QueueState(waiting, running, slots, seconds_per_chunk, weight or _weights())


def _backlog(tenant: str, count: int, *, first_second: float = 0) -> list[Waiting]:
    return [_waiting(f"{tenant}-{n}", tenant, first_second + n) for n in range(count)]


def test_a_live_session_is_ahead_of_every_render_whenever_it_came() -> None:
    waiting = [
        _waiting("high", "acme", 0, queue_class=QueueClass.HIGH),
        _waiting("moving", "acme", 1, queue_class=QueueClass.MOVING),
        _waiting("normal", "acme", 2),
        _waiting("low", "beta", 3, queue_class=QueueClass.LOW),
        _waiting("live", "beta", 50, chunks=None, queue_class=QueueClass.LIVE),
    ]
    order = [session.session_id for session in dispatch_order(waiting, _weights())]
    assert order == ["live", "moving", "high", "normal", "low"]
    places = estimate(_state(waiting)).places
    assert places["live"].position == 0 and places["live"].queue_class is QueueClass.LIVE
    assert places["low"].position == 4


def test_a_small_tenants_first_render_goes_second_behind_a_big_backlog_with_equal_weights() -> None:
    """Both tenants' first sessions tag 1; the big tenant's came first, so it goes first, then the small one's."""
    waiting = [*_backlog("big", 20), _waiting("small-0", "small", 100)]
    places = estimate(_state(waiting)).places
    assert places["small-0"].position == 1
    assert places["big-1"].position == 2  # the big tenant's second waits behind the small one's first
    assert places["big-19"].position == 20


@pytest.mark.parametrize(
    ("weights", "position"),
    [
        ({"small": 3.0}, 0),  # tag 1/3 beats big's 1
        ({"small": 1.0}, 1),  # tag 1 ties big's first, which came earlier
        ({"small": 0.5}, 2),  # tag 2: after big's 1 and big's 2 (a tie, big's came earlier)
        ({"big": 3.0}, 3),  # big's tags 1/3, 2/3 and 1 (a tie, earlier) go first
    ],
)
def test_weights_change_the_position(weights: dict[str, float], position: int) -> None:
    waiting = [*_backlog("big", 20), _waiting("small-0", "small", 100)]
    assert estimate(_state(waiting, weight=_weights(**weights))).places["small-0"].position == position


def test_while_two_tenants_wait_dispatches_alternate_in_proportion_to_their_weights() -> None:
    """a (weight 2) tags 0.5 1 1.5 2; b (weight 1, all created first) tags 1 2 3 4: ties go to b."""
    waiting = [*_backlog("b", 4), *_backlog("a", 4, first_second=10)]
    order = [session.tenant for session in dispatch_order(waiting, _weights(a=2.0))]
    assert order == ["a", "b", "a", "a", "b", "a", "b", "b"]


def test_a_tenants_own_sessions_go_first_in_first_out_within_a_class() -> None:
    waiting = [
        _waiting("late", "acme", 5),
        _waiting("early", "acme", 1),
        _waiting("high", "acme", 9, 1, QueueClass.HIGH),
    ]
    assert [session.session_id for session in dispatch_order(waiting, _weights())] == ["high", "early", "late"]


def test_eta_takes_the_earliest_free_slot_for_each_session_ahead() -> None:
    """2 slots, 2 s a chunk. Slots free at 6 s (3 chunks left) and 10 s (5 left). w1 (4 chunks) starts at 6, ends at
    14; w2 (1 chunk) starts at 10, ends at 12; w3 starts at 12, the earliest free then."""
    running = [Running("r1", "acme", NORMAL, 3), Running("r2", "beta", NORMAL, 5)]
    waiting = [_waiting("w1", "acme", 0, 4), _waiting("w2", "beta", 1, 1), _waiting("w3", "gamma", 2, 2)]
    result = estimate(_state(waiting, running, slots=2))
    assert {sid: place.eta_s for sid, place in result.places.items()} == {"w1": 6.0, "w2": 10.0, "w3": 12.0}
    assert result.ends_s == {"r1": 6.0, "r2": 10.0, "w1": 14.0, "w2": 12.0, "w3": 16.0}


def test_position_and_eta_fall_as_sessions_ahead_leave_the_queue() -> None:
    running = [Running("r1", "acme", NORMAL, 1)]
    waiting = [_waiting("w1", "acme", 0, 3), _waiting("w2", "beta", 1, 3), _waiting("w3", "gamma", 2, 3)]
    before = estimate(_state(waiting, running)).places["w3"]
    assert (before.position, before.eta_s) == (2, 2.0 + 6.0 + 6.0)
    # r1 ended and w1 took its slot with all 3 chunks to make: w3 is one place and one session nearer.
    after = estimate(_state(waiting[1:], [Running("w1", "acme", NORMAL, 3)])).places["w3"]
    assert (after.position, after.eta_s) == (1, 6.0 + 6.0)
    # w1 made a chunk: only the ETA moves.
    nearer = estimate(_state(waiting[1:], [Running("w1", "acme", NORMAL, 2)])).places["w3"]
    assert (nearer.position, nearer.eta_s) == (1, 4.0 + 6.0)


def test_free_slots_mean_no_wait_and_more_slots_mean_less() -> None:
    waiting = _backlog("acme", 3)
    assert [p.eta_s for p in estimate(_state(waiting, slots=3)).places.values()] == [0.0, 0.0, 0.0]
    assert [p.eta_s for p in estimate(_state(waiting, slots=2)).places.values()] == [0.0, 0.0, 8.0]


def test_without_a_chunk_time_an_eta_is_known_only_for_a_free_slot() -> None:
    running = [Running("r1", "acme", NORMAL, 5)]
    places = estimate(_state(_backlog("acme", 3), running, slots=2, seconds_per_chunk=None)).places
    assert [place.eta_s for place in places.values()] == [0.0, None, None]
    assert [place.position for place in places.values()] == [0, 1, 2]  # positions need no time


def test_a_slot_held_by_a_live_session_frees_at_no_known_time() -> None:
    live = Running("talk", "acme", QueueClass.LIVE, None)
    assert estimate(_state(_backlog("acme", 1), [live])).places["acme-0"].eta_s is None
    assert estimate(_state(_backlog("acme", 2), [live], slots=2)).places["acme-1"].eta_s == 8.0


def test_a_queue_has_at_least_one_slot() -> None:
    with pytest.raises(ValueError, match="slots must be at least 1"):
        _state([], slots=0)
