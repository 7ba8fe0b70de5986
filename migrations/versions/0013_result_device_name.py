"""The device that measured a trial, kept with the trial once its worker registers another.

A trial named its device through its worker's row, which a re-registration under the same
name as another GPU (allowed once the worker stopped cleanly or fell silent) rewrites in
place: every trial that worker had measured then named the new device, in the trials, the
schedule answers and the exports (an A100's times as an H200's). The registration now copies
the old device into the worker's trials first (`jobs.result_device_name`).

Rows from before this revision keep NULL: their worker's row names the device, as it did.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 23:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("result_device_name", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.drop_column("result_device_name")
