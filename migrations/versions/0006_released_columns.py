"""The columns that revisions 0002 and 0005 gained after they were first released: a database
upgraded by the first 0002 lacks tasks.imported_from, and one upgraded by the first 0005
lacks tasks.only_runner and jobs.only_runner, while reading as that revision, so the later
0002 and 0005 never ran for them and every task query failed on the missing column. Each is
added here where it is missing (a database built by the final 0002 and 0005 has them all,
and this revision changes nothing there). Released revisions are not edited any more:
tests/test_migrations.py pins them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 19:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, column) as the final 0002 and 0005 add them.
LATE_COLUMNS = (
    ("tasks", lambda: sa.Column("imported_from", sa.String(length=512), nullable=True)),
    ("tasks", lambda: sa.Column("only_runner", sa.String(length=16), nullable=True)),
    ("jobs", lambda: sa.Column("only_runner", sa.String(length=16), nullable=True)),
)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table, column in LATE_COLUMNS:
        made = column()
        if made.name not in {c["name"] for c in inspector.get_columns(table)}:
            # NULL, as every row had in a database the final revision upgraded.
            with op.batch_alter_table(table) as batch:
                batch.add_column(made)


def downgrade() -> None:
    # Nothing of its own: the columns are 0002's and 0005's, whose downgrades drop them.
    pass
