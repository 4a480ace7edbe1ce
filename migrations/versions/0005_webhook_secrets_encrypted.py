"""webhook secrets encrypted at rest: room for a Fernet token, and none kept once an endpoint is deleted

A `whsec_` secret encrypted under MONOLOGUE_WEBHOOKS__SECRET_KEYS is a Fernet token of 164 characters (the
column held 128), and a deleted endpoint's row keeps no secret (NULL). Rows are not rewritten here: encrypting
needs the operator's key, which migrations do not read, so the secrets of rows from before stay as they are
(still read, and signed with) until `monologue webhooks rotate-key` encrypts them (monologue/webhooks/encryption.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.alter_column("secret", existing_type=sa.String(128), type_=sa.Text(), nullable=True)


def downgrade() -> None:
    # 0004's code signs with the column as it is: an encrypted secret would sign nothing a receiver verifies.
    endpoints = sa.table("webhook_endpoints", sa.column("secret", sa.Text()))
    encrypted = op.get_bind().scalar(
        sa.select(sa.func.count()).where(endpoints.c.secret.is_not(None), ~endpoints.c.secret.startswith("whsec_"))
    )
    if encrypted:
        raise RuntimeError(
            f"{encrypted} webhook secrets are encrypted (MONOLOGUE_WEBHOOKS__SECRET_KEYS), which revision 0004's code"
            " cannot read; delete those endpoints (or stay at 0005) before going below 0005"
        )
    op.execute(endpoints.update().where(endpoints.c.secret.is_(None)).values(secret=""))  # deleted: none to keep
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.alter_column("secret", existing_type=sa.Text(), type_=sa.String(128), nullable=False)
