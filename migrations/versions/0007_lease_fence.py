"""lease: the number of the newest node lease that claimed the session (its fencing token)

A node's writes for a session carry the number of the lease they run under; the row keeps the newest one a node
claimed (`init_session`), and each write checks it in the same transaction (monologue/repo/fence.py), so a node that
was cut off and comes back after its session moved cannot write over the node that holds it now. Existing rows: 0,
which every lease number passes (sessions started before fencing carry 0 and are not fenced).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("lease", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("lease")
