"""A task's prior (the finished task of the same workload on another GPU it warm-starts
from), and where an imported task's trials came from (a recorded dataset file).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 23:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: every task created before this revision had no prior.
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("prior_task", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("imported_from", sa.String(length=512), nullable=True))
        batch.create_foreign_key(op.f("fk_tasks_prior_task_tasks"), "tasks", ["prior_task"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_constraint(op.f("fk_tasks_prior_task_tasks"), type_="foreignkey")
        batch.drop_column("imported_from")
        batch.drop_column("prior_task")
