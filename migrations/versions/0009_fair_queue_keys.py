"""Fair shares between tasks: each task's priority (its share), each job's key in its GPU's
fair queue and each task's key after its last job (service/fair_share.py), and the queue
index ordered by that key.

Rows from before this revision get priority 1, and the jobs queued then keys that number
each task's queue from 0 (its oldest first), the task's key after them: at key 0 alike, a
task created after the upgrade would wait behind the whole backlog queued before it, where
so it takes turns with the tasks that had one. Every other job keeps key 0.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 15:00:00.000000
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# A priority-1 job's step (service/fair_share.KEY_UNIT at this revision: a migration keeps
# its own copy, the application's may change).
STEP = 2520


# The columns the upgrade numbers, as this revision has them.
JOBS = sa.table(
    "jobs", sa.column("id"), sa.column("task_id"), sa.column("state"), sa.column("fair_key")
)
TASKS = sa.table("tasks", sa.column("id"), sa.column("fair_key"))


def _key() -> sa.Column:
    return sa.Column("fair_key", sa.BigInteger(), server_default="0", nullable=False)


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="1", nullable=False))
        batch.add_column(_key())
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(_key())
        batch.drop_index("ix_jobs_queue")
        batch.create_index("ix_jobs_queue", ["state", "arch", "gpu", "fair_key", "id"])
    _number_the_queues()


def _number_the_queues() -> None:
    """Each task's queued jobs numbered from 0, oldest first; the task's key after them."""
    conn = op.get_bind()
    jobs, tasks = JOBS, TASKS
    queued = conn.execute(
        sa.select(jobs.c.id, jobs.c.task_id).where(jobs.c.state == "queued").order_by(jobs.c.id)
    ).all()
    place: defaultdict[int, int] = defaultdict(int)
    keys = []
    for job_id, task_id in queued:
        keys.append({"job": job_id, "key": place[task_id] * STEP})
        place[task_id] += 1
    if keys:
        conn.execute(
            jobs.update()
            .where(jobs.c.id == sa.bindparam("job"))
            .values(fair_key=sa.bindparam("key")),
            keys,
        )
        conn.execute(
            tasks.update()
            .where(tasks.c.id == sa.bindparam("task"))
            .values(fair_key=sa.bindparam("key")),
            [{"task": task_id, "key": n * STEP} for task_id, n in place.items()],
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_queue")
        batch.create_index("ix_jobs_queue", ["state", "arch", "gpu", "id"])
        batch.drop_column("fair_key")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("fair_key")
        batch.drop_column("priority")
