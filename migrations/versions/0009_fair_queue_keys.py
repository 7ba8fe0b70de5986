"""Fair shares between tasks: each task's priority (its share), each job's key in its GPU's
fair queue and each task's key after its last job (service/fair_share.py), and the queue
index ordered by that key.

Rows from before this revision keep key 0 and priority 1: the jobs queued then are leased
first, oldest first, as they would have been, and the tasks start level with the new ones.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 15:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key() -> sa.Column:
    return sa.Column("fair_key", sa.BigInteger(), server_default="0", nullable=False)


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="1", nullable=False))
        batch.add_column(_key())
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(_key())
        batch.drop_index("ix_jobs_queue")
        batch.create_index("ix_jobs_queue", ["state", "arch", "gpu", "fair_key", "id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_queue")
        batch.create_index("ix_jobs_queue", ["state", "arch", "gpu", "id"])
        batch.drop_column("fair_key")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("fair_key")
        batch.drop_column("priority")
