"""Initial schema: workloads, tasks, jobs (trials), leases, workers, reference optima.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 20:38:54.466433
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("gpu", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=16), nullable=False),
        sa.Column("runner", sa.String(length=16), nullable=False),
        sa.Column("device_name", sa.String(length=256), nullable=True),
        sa.Column("sm_count", sa.Integer(), nullable=True),
        sa.Column("driver", sa.String(length=64), nullable=True),
        sa.Column("clocks_mhz", sa.Integer(), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("busy_jobs", sa.Integer(), nullable=False),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "last_heartbeat",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
        sa.UniqueConstraint("name", name=op.f("uq_workers_name")),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=32), nullable=False),
        sa.Column("op", sa.String(length=16), nullable=False),
        sa.Column("canonical", sa.JSON(), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("flops", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workloads")),
        sa.UniqueConstraint("hash", name=op.f("uq_workloads_hash")),
    )
    op.create_table(
        "reference_optima",
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.String(length=16), nullable=False),
        sa.Column("best_latency_us", sa.Float(), nullable=False),
        sa.Column("configurations", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=512), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workloads.id"],
            name=op.f("fk_reference_optima_workload_id_workloads"),
        ),
        sa.PrimaryKeyConstraint("workload_id", "gpu", name=op.f("pk_reference_optima")),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=16), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("batches", sa.Integer(), nullable=False),
        sa.Column("trials_target", sa.Integer(), nullable=False),
        sa.Column("trials_enqueued", sa.Integer(), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("trials_failed", sa.Integer(), nullable=False),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("best_latency_us", sa.Float(), nullable=True),
        sa.Column("curve", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_tasks_workload_id_workloads")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_state"), ["state"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_tasks_workload_id_gpu"), ["workload_id", "gpu"], unique=False
        )

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=16), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("schedule", sa.JSON(), nullable=False),
        sa.Column("schedule_id", sa.String(length=40), nullable=False),
        sa.Column("predicted_us", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.Integer(), nullable=True),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result_token", sa.String(length=64), nullable=True),
        sa.Column("result_worker", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=24), nullable=True),
        sa.Column("latency_us", sa.Float(), nullable=True),
        sa.Column("samples_us", sa.JSON(), nullable=True),
        sa.Column("spread", sa.Float(), nullable=True),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("spill_bytes", sa.Integer(), nullable=True),
        sa.Column("smem_bytes", sa.Integer(), nullable=True),
        sa.Column("compile_ms", sa.Float(), nullable=True),
        sa.Column("max_abs_error", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("runner", sa.String(length=16), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["lease_owner"], ["workers.id"], name=op.f("fk_jobs_lease_owner_workers")
        ),
        sa.ForeignKeyConstraint(
            ["result_worker"], ["workers.id"], name=op.f("fk_jobs_result_worker_workers")
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_jobs_task_id_tasks"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_jobs_workload_id_workloads")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("task_id", "trial", name=op.f("uq_jobs_task_id_trial")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_best", ["workload_id", "gpu", "status", "latency_us"], unique=False
        )
        batch_op.create_index("ix_jobs_lease_expiry", ["state", "lease_expires_at"], unique=False)
        batch_op.create_index("ix_jobs_owner", ["lease_owner", "state"], unique=False)
        batch_op.create_index("ix_jobs_queue", ["state", "arch", "gpu", "id"], unique=False)
        batch_op.create_index("ix_jobs_task_state", ["task_id", "state"], unique=False)

    op.create_table(
        "leases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("leased_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_leases_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["worker_id"], ["workers.id"], name=op.f("fk_leases_worker_id_workers")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leases")),
    )
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_leases_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_leases_job_id"))

    op.drop_table("leases")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_task_state")
        batch_op.drop_index("ix_jobs_queue")
        batch_op.drop_index("ix_jobs_owner")
        batch_op.drop_index("ix_jobs_lease_expiry")
        batch_op.drop_index("ix_jobs_best")

    op.drop_table("jobs")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_workload_id_gpu"))
        batch_op.drop_index(batch_op.f("ix_tasks_state"))

    op.drop_table("tasks")
    op.drop_table("reference_optima")
    op.drop_table("workloads")
    op.drop_table("workers")
