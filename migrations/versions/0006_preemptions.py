"""preemptions: how often a render gave its slot up to a waiting session, when it was last asked to, and for whom

`ask_to_yield` (activities/sched.py) picks a render to give way to a session waiting for a node: it marks the render
`yield_asked_at` and `yield_for` (so two askers do not ask the same one, and one asks one at a time) and the render,
once it has yielded, counts it in `preemptions` and clears the mark (`record_yield`). Existing rows: never asked,
never preempted.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("preemptions", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("yield_asked_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("yield_for", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("yield_for")
        batch.drop_column("yield_asked_at")
        batch.drop_column("preemptions")
