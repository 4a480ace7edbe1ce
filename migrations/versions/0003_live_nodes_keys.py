"""live sessions, sinks, nodes and API keys

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("audio_samples", sa.Integer(), nullable=True))  # live: received so far
        batch.add_column(sa.Column("latency", sa.JSON(), nullable=True))  # live: audio in → segment out
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("audio_ready_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("published_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "sinks",
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),  # starting | streaming | done | retrying | failed
        sa.Column("acknowledged", sa.Integer(), nullable=False),  # leading segments the far side holds
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),  # up | draining | stopped
        sa.Column("sessions", sa.JSON(), nullable=False),  # ids of the sessions it holds now
        sa.Column("chunks_done", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Float(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),  # the public prefix of the key
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),  # SHA-256 of the whole key
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_table("nodes")
    op.drop_table("sinks")
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("published_at")
        batch.drop_column("audio_ready_at")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("latency")
        batch.drop_column("audio_samples")
