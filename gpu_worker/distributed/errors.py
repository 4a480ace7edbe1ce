"""What can go wrong when the ranks of a node run a step together.

    MonologueError
    └── TransientError              retrying may help (here: on a restarted node, or on another node)
        └── DistributedError
            ├── StepFailed          a step raised on ranks other than 0; the group is still usable
            └── GroupBroken         the ranks' collectives no longer line up; nothing more can run

An exception raised on rank 0 itself is never wrapped: it propagates with its own type (an `InputError`
stays non-retryable at the activity edge), with the other ranks' errors attached as notes. Only
failures that rank 0 could not have seen by itself become these types.
"""

from __future__ import annotations

from dataclasses import dataclass

from monologue.errors import TransientError


@dataclass(frozen=True)
class RankError:
    """One rank's exception, reduced to text so it can cross the control plane."""

    rank: int
    type: str
    message: str
    traceback: str

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.type}: {self.message}"


class DistributedError(TransientError):
    """Base of the errors the multi-GPU runtime raises on rank 0."""

    def __init__(self, message: str, errors: tuple[RankError, ...] = ()) -> None:
        super().__init__(message)
        self.errors = errors


class StepFailed(DistributedError):
    """The step raised on other ranks (not on rank 0). Every rank has reset its per-step state, and the
    next step can run."""


class GroupBroken(DistributedError):
    """The ranks did not issue the same collectives in a step (one failed half-way, or a peer died), so
    their next collectives would pair the wrong messages. The node must restart its process group."""
