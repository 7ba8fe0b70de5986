"""Which batch's proposal first saw a job's result, where early proposals (a model-guided task
proposing its next batch while a few jobs of the last one are still measured) made it differ
from the rule of whole batches: replaying a task must observe each result where its proposer
did.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27 21:45:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: as the rule of whole batches says (service/driver.py, first_seen_by), which is
    # where every proposal before this revision saw its results: nothing to backfill.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("seen_at", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.drop_column("seen_at")
