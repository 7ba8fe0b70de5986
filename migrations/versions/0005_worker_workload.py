"""A worker that answers one workload only (a replay worker answers from its dataset): the
workload's hash, so that it leases that workload's jobs and never fails other tasks' trials.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: any workload, as every worker registered before this revision takes.
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("workload_hash", sa.String(32), nullable=True))


def downgrade() -> None:
    # In place: a batch copy of `workers` would drop the table its jobs and leases refer to.
    with op.batch_alter_table("workers", recreate="never") as batch:
        batch.drop_column("workload_hash")
