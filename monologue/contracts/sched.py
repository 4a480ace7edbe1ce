"""What preemption's activities take and give (docs/scheduling.md): why a waiting session asks a render to yield,
the signal the render hears, and the records of a yield."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time (see
# monologue/contracts/__init__.py, which re-exports every name here).
from dataclasses import dataclass
from enum import StrEnum

from monologue.contracts.session import QueueClass


class AskReason(StrEnum):
    """Why a session waiting for a node asks a render to yield (monologue/repo/sched.py says which renders may)."""

    LIVE = "live"  # a live session
    NODE_LOST = "node_lost"  # a session whose node was lost (it waits as moving)
    FAIR_SHARE = "fair_share"  # a render of a tenant below its share of the slots


@dataclass
class YieldSlot:
    """Give the node's slot up at the next chunk boundary, for `for_session`; then queue again as `yielded`, ahead of
    every render (`as_moving`, named before that class existed: it yields to a live session or one whose node was
    lost), or in its own class (it yields to a fairer share)."""

    for_session: str
    as_moving: bool = True


@dataclass
class AskToYieldInput:
    """A session has waited for a node: ask the render that should give way (policy: monologue/repo/sched.py)."""

    session_id: str  # the session waiting
    tenant: str = ""
    queue_class: QueueClass = QueueClass.LIVE
    why: AskReason = AskReason.LIVE


@dataclass
class AskToYieldResult:
    asked: str | None  # the session asked to yield; None: none asked (one is already yielding, or none can)
    node_id: str | None = None  # the node it gives up (a handed lease of the asker waits for that slot there)


@dataclass
class RecordYieldInput:
    session_id: str
    for_session: str
    node_id: str  # the node given up ("": none was held, so it could not yield)
    chunks_done: int
    yielded: bool = True
