"""When a worker said its process ended (`POST /v1/workers/{id}/exit`): until it is heard from
again, it is not live, and its name is free to another token's worker at once. Before, a
cleanly stopped worker counted as live for a lease TTL after its last heartbeat: a restart on
a rotated token was refused (409) for that long, and the fleet's gauges and a task's
`no_worker` counted a worker that was gone.

Rows from before this revision keep NULL: none of those workers said it exited.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 04:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("exited_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers", recreate="never") as batch:
        batch.drop_column("exited_at")
