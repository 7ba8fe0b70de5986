"""What an imported dataset said of its measurement: the device its records were measured on
(a T4 file's device_name) and its measurement settings (warm-up, repeats, the sweep's or the
exporting task's own). An export of an imported task wrote neither back: its device name
came only from the workers that measured the trials, and an imported task has none.

Rows from before this revision keep NULL in both: an import before it recorded neither.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 04:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("imported_device_name", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("imported_settings", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", recreate="never") as batch:
        batch.drop_column("imported_settings")
        batch.drop_column("imported_device_name")
