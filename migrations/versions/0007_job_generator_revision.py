"""Which revision of its kernel generator measured a job (MeasureResult.generator_revision):
a learned prior reads only the newest revision of each generator line, so that measurements
of kernels that have since changed do not teach it (model.family.GeneratorRevision).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 04:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: not recorded, which reads as revision 1 of the job's generator line (every
    # result before this revision came from a worker that did not say).
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("generator_revision", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.drop_column("generator_revision")
