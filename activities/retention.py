"""The retention activity on the shared queue: remove one part (inputs or outputs) of a bounded batch of sessions
that ended long enough ago (`monologue.lifecycle.clear_due`), heartbeating after each session. Any node may run it;
RetentionWorkflow (started by its Temporal Schedule) calls it until no session is due."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import sessionmaker
from temporalio import activity

from activities.errors import activity_context
from monologue import lifecycle
from monologue.contracts import retention as r
from monologue.storage import ObjectStore


class RetentionActivities:
    def __init__(self, *, store: ObjectStore, sessions: sessionmaker[Any]) -> None:
        self._store = store
        self._sessions = sessions

    @activity.defn(name=r.APPLY_RETENTION)
    def apply_retention(self, request: r.ApplyRetentionInput) -> r.ApplyRetentionResult:
        """Up to `request.batch` sessions' `request.part` removed and marked; a retry after a lost worker finds the
        ones already marked gone from the list and goes on with the rest."""
        with activity_context(part=str(request.part)):
            sessions, objects = lifecycle.clear_due(
                self._sessions,
                self._store,
                part=request.part,
                ended_before=datetime.fromtimestamp(request.ended_before_s, UTC),
                batch=request.batch,
                progress=activity.heartbeat,
            )
            return r.ApplyRetentionResult(sessions=sessions, objects=objects)

    @activity.defn(name=r.EXPIRE_ASSETS)
    def expire_assets(self, request: r.ExpireAssetsInput) -> r.ExpireAssetsResult:
        """Up to `request.batch` uploaded assets past the inputs' days removed (a retry finds the removed ones gone)."""
        with activity_context(part="assets"):
            assets, objects = lifecycle.expire_assets(
                self._store, uploaded_before=request.uploaded_before_s, batch=request.batch, progress=activity.heartbeat
            )
            return r.ExpireAssetsResult(assets=assets, objects=objects)
