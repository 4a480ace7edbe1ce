"""What crosses Temporal for the data lifecycle: a Temporal Schedule (`RETENTION_SCHEDULE`, written by `monologue
temporal setup` and the embedded stack from MONOLOGUE_RETENTION__*) starts RetentionWorkflow every so often; it asks
the shared queue (`apply_retention`) to remove the inputs, then the outputs, of sessions that ended long enough ago,
and (`expire_assets`) the uploaded assets older than the inputs' days, a bounded batch per call.

Standard library only, like the rest of `monologue.contracts`: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time.
from dataclasses import dataclass
from enum import StrEnum

RETENTION_WORKFLOW = "RetentionWorkflow"
RETENTION_SCHEDULE = "monologue-retention"  # the schedule's id; its runs' workflow ids start with it
APPLY_RETENTION = "apply_retention"
EXPIRE_ASSETS = "expire_assets"


class DataPart(StrEnum):
    """What retention removes on its own clock: a session's inputs (the portrait and the speech as uploaded and
    normalised, live audio included, and what is derived from them only to resume: the reference conditioning and
    the checkpoints) or its outputs (the HLS stream, the final and progressive videos, the frame hashes)."""

    INPUTS = "inputs"
    OUTPUTS = "outputs"


@dataclass
class RetentionInput:
    """The policy one scheduled run applies: days after a session ended (None: keep that part)."""

    inputs_days: float | None = None
    outputs_days: float | None = None
    batch: int = 100  # sessions per activity call


@dataclass
class RetentionResult:
    inputs: int = 0  # sessions whose inputs this run removed
    outputs: int = 0
    assets: int = 0  # uploaded assets (POST /v1/assets) removed, on the inputs' clock from their upload
    more: bool = False  # the run stopped at its call limit with sessions still due: the next run goes on


@dataclass
class ApplyRetentionInput:
    """Remove `part` of at most `batch` sessions that ended before `ended_before_s` (Unix seconds, from the
    workflow's clock), oldest first, and record it on their rows."""

    part: DataPart
    ended_before_s: float
    batch: int


@dataclass
class ApplyRetentionResult:
    sessions: int  # sessions whose part was removed (fewer than the batch: none are left)
    objects: int  # objects deleted


@dataclass
class ExpireAssetsInput:
    """Remove at most `batch` uploaded assets (POST /v1/assets) uploaded before `uploaded_before_s`, oldest first."""

    uploaded_before_s: float
    batch: int


@dataclass
class ExpireAssetsResult:
    assets: int  # assets removed (fewer than the batch: none are left)
    objects: int
