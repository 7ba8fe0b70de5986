"""The least latency a task's trial can take (`tasks.latency_floor_us`).

A worker's ok result far below anything its GPU can do (0.001 us for a 1024^3 GEMM: 2,000
times an H100's peak tensor throughput), consistent with its own samples, was recorded as a
valid trial and became the task's best, its curve and every schedule lookup's answer. A task
now keeps, from its creation, the latency of its workload's FLOPs at a few times its GPU's
peak (service/orm.py, latency_floor_us), beside what the results statement reads already;
a result below it is recorded as a failed trial instead (service/queue.py).

Rows from before this revision keep NULL: no bound, as before (a migration does not compute
what the model says of a GPU, which changes with the model).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("latency_floor_us", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", recreate="never") as batch:
        batch.drop_column("latency_floor_us")
