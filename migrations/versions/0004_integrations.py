"""for integrators: audio sockets that reconnect, audio tickets, idempotency keys, webhooks

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("audio_socket", sa.String(32), nullable=True))  # live: the open socket's holder
        batch.add_column(sa.Column("audio_socket_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "audio_tickets",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False, index=True
        ),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("ticket_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),  # the primary key is the uniqueness the races rely on
        sa.Column("request_sha256", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(64), primary_key=True),  # the webhook-id header
        sa.Column(
            "endpoint_id",
            sa.String(32),
            sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False, index=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),  # pending | delivered | failed
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_table(
        "webhook_attempts",
        sa.Column(
            "delivery_id",
            sa.String(64),
            sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
    op.drop_table("idempotency_keys")
    op.drop_table("audio_tickets")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("audio_socket_at")
        batch.drop_column("audio_socket")
