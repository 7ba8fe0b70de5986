"""A workload's op in 32 characters, not 16: the Hopper family's fused GEMMs
(`hopper_gemm_bias_gelu`, 21; `hopper_gemm_swiglu`, 18) did not fit, and PostgreSQL refused
every task of theirs with a 500 (SQLite ignores a VARCHAR's length and kept them).

SQLite rebuilds the small workloads table (one row per operator shape); PostgreSQL widens
the column in place.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.alter_column(
            "op", existing_type=sa.String(length=16), type_=sa.String(length=32), nullable=False
        )


def downgrade() -> None:
    # A workload whose op needs the wider column would be cut (SQLite) or refused midway
    # (PostgreSQL): say which, and change nothing.
    longer = (
        op.get_bind()
        .execute(sa.text("SELECT DISTINCT op FROM workloads WHERE length(op) > 16"))
        .scalars()
        .all()
    )
    if longer:
        raise RuntimeError(
            "cannot go below revision 0012: workloads of op "
            + ", ".join(sorted(longer))
            + " need more than 16 characters; delete them first"
        )
    with op.batch_alter_table("workloads") as batch:
        batch.alter_column(
            "op", existing_type=sa.String(length=32), type_=sa.String(length=16), nullable=False
        )
