"""sessions and chunks

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("node_id", sa.String(128)),
        sa.Column("workflow_id", sa.String(128)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("ttff_ms", sa.Float()),
        sa.Column("audio_seconds", sa.Float()),
        sa.Column("frames", sa.Integer()),
        sa.Column("chunks_total", sa.Integer()),
        sa.Column("width", sa.Integer()),
        sa.Column("height", sa.Integer()),
        sa.Column("video_key", sa.String(512)),
        sa.Column("error", sa.Text()),
    )
    op.create_index("ix_sessions_tenant", "sessions", ["tenant"])
    op.create_index("ix_sessions_status", "sessions", ["status"])
    op.create_table(
        "chunks",
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("kind", sa.String(1), primary_key=True),
        sa.Column("index", sa.Integer(), primary_key=True),
        sa.Column("first_frame", sa.Integer(), nullable=False),
        sa.Column("frames", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(128)),
        sa.Column("stage_ms", sa.JSON(), nullable=False),
        sa.Column("segment_key", sa.String(512)),
        sa.Column("frames_sha256", sa.String(64)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("chunks")
    op.drop_index("ix_sessions_status", table_name="sessions")
    op.drop_index("ix_sessions_tenant", table_name="sessions")
    op.drop_table("sessions")
