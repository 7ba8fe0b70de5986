"""Who may measure what. A worker that answers one workload only (a replay worker answers
from its dataset): the workload's hash, so that it leases that workload's jobs and never
fails other tasks' trials. A task measured by one runner only (`cupy` for GPU measurements
only; an in-process `pipetune.tune` measures with its own runner): the runner on the task
and on each of its jobs, which a lease matches as it matches the arch and the GPU.

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
    # NULL: any workload, any runner, as every worker, task and job before this revision.
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("workload_hash", sa.String(32), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("only_runner", sa.String(16), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("only_runner", sa.String(16), nullable=True))


def downgrade() -> None:
    # In place: a batch copy of any of them would drop a table other rows refer to.
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.drop_column("only_runner")
    with op.batch_alter_table("tasks", recreate="never") as batch:
        batch.drop_column("only_runner")
    with op.batch_alter_table("workers", recreate="never") as batch:
        batch.drop_column("workload_hash")
