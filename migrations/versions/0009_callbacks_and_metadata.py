"""sessions.client_metadata, webhook_endpoints.session_id: a create's `metadata` and `callback_url`

A session's `metadata` (the caller's small JSON object) is stored on its row and returned as given. Its
`callback_url` becomes an endpoint of that session alone (`session_id` set), with its own secret, so its messages
take the tenant endpoints' path: the same signing, delivery workflow, retries and delivery log. The endpoint goes
with its session (ON DELETE CASCADE). Existing rows: NULL (no metadata; tenant endpoints).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SESSION_FK = "fk_webhook_endpoints_session_id"


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("client_metadata", sa.JSON(), nullable=True))
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.add_column(sa.Column("session_id", sa.String(64), nullable=True))
        batch.create_foreign_key(SESSION_FK, "sessions", ["session_id"], ["id"], ondelete="CASCADE")
        batch.create_index("ix_webhook_endpoints_session_id", ["session_id"])


def downgrade() -> None:
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.drop_index("ix_webhook_endpoints_session_id")
        batch.drop_constraint(SESSION_FK, type_="foreignkey")
        batch.drop_column("session_id")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("client_metadata")
