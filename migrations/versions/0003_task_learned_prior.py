"""A task's learned prior: the finished, measured tasks of its kernel family whose cost model
is its prior mean (TaskCreate.learned_prior), recorded so that every replica rebuilds it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 10:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: no task created before this revision learned its prior.
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("learned_from", sa.JSON(), nullable=True))


def downgrade() -> None:
    # In place (SQLite >= 3.35 drops a plain column): a batch copy of `tasks` would drop the
    # table that its own rows' prior_task foreign keys refer to, which SQLite refuses.
    with op.batch_alter_table("tasks", recreate="never") as batch:
        batch.drop_column("learned_from")
