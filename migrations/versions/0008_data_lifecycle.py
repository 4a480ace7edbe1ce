"""inputs_removed_at, outputs_removed_at, deleted_at: a session's data lifecycle

Retention (the scheduled RetentionWorkflow) removes a session's inputs and its outputs some days after it ended and
records when; `DELETE /v1/renders/{id}` removes both and keeps the row as a tombstone (`deleted_at`), so the API can
answer 410 Gone and a second DELETE is a no-op. Existing rows: NULL (nothing removed, not deleted).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("inputs_removed_at", "outputs_removed_at", "deleted_at")


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
