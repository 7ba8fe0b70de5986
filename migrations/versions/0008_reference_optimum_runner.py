"""Which runner measured a reference optimum (an exhaustive sweep's best latency): best-in-k
curves normalise a task's trials to an optimum of their own kind, a simulated sweep's for
simulated tasks and a measured one's for measured tasks (service/curves.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 23:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: not recorded (an optimum imported before this revision): it normalises every
    # task's curve, as it did.
    with op.batch_alter_table("reference_optima") as batch:
        batch.add_column(sa.Column("runner", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reference_optima", recreate="never") as batch:
        batch.drop_column("runner")
