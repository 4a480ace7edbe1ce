"""avatars, sessions.avatar_id: reusable avatars

An avatar is a portrait checked once (`POST /v1/avatars`) that sessions name instead of an upload; its objects live
under `avatars/<tenant>/<id>/`. A session made from one records its id (NULL for every existing session), so an
avatar in use is a query; no foreign key: a session keeps its own copy of the portrait and outlives the avatar.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "avatars",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("portrait_sha256", sa.String(64), nullable=False),
    )
    op.create_index("ix_avatars_tenant", "avatars", ["tenant"])
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("avatar_id", sa.String(64), nullable=True))
        batch.create_index("ix_sessions_avatar_id", ["avatar_id"])


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_index("ix_sessions_avatar_id")
        batch.drop_column("avatar_id")
    op.drop_index("ix_avatars_tenant", table_name="avatars")
    op.drop_table("avatars")
