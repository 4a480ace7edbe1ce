"""nodes.media_url: where the API forwards a live session's WebRTC signalling (WHEP/WHIP)

A node records the address of its WebRTC signalling port in its row; the API forwards a viewer's offer to the node
holding the session. NULL for nodes that have not reported since (they serve no WebRTC).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("media_url", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("media_url")
