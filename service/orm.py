"""The service's tables (SQLAlchemy 2 typed ORM). migrations/ builds exactly this schema.

A job is one trial of a task: the schedule a TuningSession proposed, its place in the queue
(state, lease) and, once measured, its result. Columns copied from the task onto the job
(workload_id, gpu, arch) serve the two hot queries without a join: leasing (state, arch)
and the best measured schedule of a workload on a GPU (workload_id, gpu, status, latency).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    and_,
    event,
    func,
    select,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from pipetune.model.family import OP_MAX_CHARS, family_for_op
from pipetune.model.hardware import HardwareError, get_gpu
from pipetune.model.states import WorkerState
from pipetune.model.trials import RUNNER_MAX_CHARS
from pipetune.model.workloads import WorkloadError
from pipetune.service.db import SQLITE_NOW_FORMAT, UTCDateTime

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict] = {dict[str, Any]: JSON, dt.datetime: UTCDateTime}


class _insert_time(FunctionElement):  # noqa: N801 (named as the SQL it stands for)
    """The database's time when a row is inserted, to the microsecond on both databases:
    SQLite's CURRENT_TIMESTAMP is whole seconds (a task stamped as created before a worker
    that registered a moment earlier, since workers are stamped by Database.now)."""

    type = UTCDateTime()
    inherit_cache = True


@compiles(_insert_time)
def _insert_time_default(element: _insert_time, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(_insert_time, "sqlite")
def _insert_time_sqlite(element: _insert_time, compiler: Any, **kw: Any) -> str:
    return f"strftime('{SQLITE_NOW_FORMAT}', 'now')"


def _created() -> Mapped[dt.datetime]:
    # The schema's default (server_default, which migrations/ creates) is for rows written
    # by hand; the service's inserts through SQLAlchemy take _insert_time. (PostgreSQL's raw
    # batch insert, driver.COMMIT_BATCH_SQL, takes the schema's, precise there.)
    return mapped_column(
        UTCDateTime, default=_insert_time(), server_default=func.current_timestamp()
    )


class WorkloadRow(Base):
    """An operator shape in canonical form; one row per workload hash."""

    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(32), unique=True)
    op: Mapped[str] = mapped_column(String(OP_MAX_CHARS))
    canonical: Mapped[dict[str, Any]]
    label: Mapped[str] = mapped_column(String(200))
    flops: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = _created()


class TaskRow(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        Index(None, "state"),
        Index(None, "workload_id", "gpu"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    gpu: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(16))
    strategy: Mapped[str] = mapped_column(String(32))
    budget: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    batch_size: Mapped[int] = mapped_column(Integer)
    # A finished task of the same workload on another GPU (or of its element-type twin on any
    # GPU) whose trials are this task's prior
    # (model.wire.TaskCreate.prior_task); immutable once finished, so every replay is exact.
    prior_task: Mapped[int | None] = mapped_column(ForeignKey("tasks.id"))
    # The finished, measured tasks whose cost model is this task's prior mean, in id order
    # (TaskCreate.learned_prior): chosen once, when the task is created, so that every replica
    # fits the same model on the same trials and replays the task exactly.
    learned_from: Mapped[list[int] | None] = mapped_column(JSON)
    # The dataset file an imported task's trials came from (`pipetune db import-dataset`): its
    # trials were measured elsewhere, not tuned here; None for a task the service ran.
    imported_from: Mapped[str | None] = mapped_column(String(512))
    # What the imported dataset said of its measurement, written back by an export of the
    # task: the device its records were measured on and its measurement settings.
    imported_device_name: Mapped[str | None] = mapped_column(String(256))
    imported_settings: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Only workers of this runner kind measure its trials (TaskCreate.runner); None: any.
    only_runner: Mapped[str | None] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    # Batches enqueued so far: the version a replica compares-and-sets to enqueue the next.
    batches: Mapped[int] = mapped_column(Integer, default=0)
    # min(budget, space size): the exact number of trials the task will have.
    trials_target: Mapped[int] = mapped_column(Integer)
    trials_enqueued: Mapped[int] = mapped_column(Integer, default=0)
    # Its share of its GPU's workers (TaskCreate.priority), and its fair-queue key after its
    # last enqueued job (service/fair_share.py).
    priority: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    fair_key: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    trials_failed: Mapped[int] = mapped_column(Integer, default=0)
    best_trial: Mapped[int | None] = mapped_column(Integer)
    best_latency_us: Mapped[float | None] = mapped_column(Float)
    # Best-so-far latency per trial index (None before the first success), written at each
    # batch boundary: the aggregated curves read these instead of every trial.
    curve: Mapped[list[float | None] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    # The least latency a trial of its workload can take on its GPU (`latency_floor_us`, set
    # when the row is inserted): a worker's ok result below it is recorded as failed (the
    # result path reads it with the job, service/queue.py). NULL: no bound (a GPU or a kind
    # of work the model has no peak for, or a task from before revision 0014).
    latency_floor_us: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = _created()
    updated_at: Mapped[dt.datetime] = _created()
    finished_at: Mapped[dt.datetime | None]


# How many times its GPU's peak dense tensor throughput a trial may seem to run at before its
# latency is no measurement. Generous: a bound must never refuse a real one. 2x is the rate
# of 2:4 sparse operands, which the family's dense kernels never reach; 2x more covers a
# board clocked above the model's numbers and a timer's granularity. The fastest trial of
# the GPU campaigns committed (benchmarks/data, 86 sweeps) lies 5.8x above its floor; a
# latency that is no measurement at all (0.001 us for a 1024^3 GEMM: 2,000 times the peak)
# far below.
LATENCY_FLOOR_PEAK_FACTOR = 4.0


def latency_floor_us(op: str, work: float, gpu: str) -> float | None:
    """The least latency (us) one run of a workload (its op and its work, as its workload
    row holds them) can take on a GPU: its FLOPs at LATENCY_FLOOR_PEAK_FACTOR times the
    GPU's peak tensor throughput, the higher of the spec sheet's and the shipped profile's
    (a clock measured above the sheet's boost). None where the model bounds nothing: a GPU
    it does not know, an op of no family, work counted in bytes (a memory-bound operator:
    caches can beat DRAM's bandwidth, so its bytes bound no latency)."""
    try:
        if family_for_op(op).work_unit != "flop":
            return None
        sheet = get_gpu(gpu, calibrated=False)
    except (WorkloadError, HardwareError):
        return None
    try:
        # (Not the user's own profile: every replica bounds a task alike.)
        peak_tflops = max(
            sheet.peak_tensor_tflops, get_gpu(gpu, user_profile=False).peak_tensor_tflops
        )
    except HardwareError:  # (a malformed shipped profile: the sheet's numbers)
        peak_tflops = sheet.peak_tensor_tflops
    return work / (LATENCY_FLOOR_PEAK_FACTOR * peak_tflops * 1e12) * 1e6


class WorkerRow(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    gpu: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(16))
    runner: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str | None] = mapped_column(String(256))
    sm_count: Mapped[int | None] = mapped_column(Integer)
    driver: Mapped[str | None] = mapped_column(String(64))
    clocks_mhz: Mapped[int | None] = mapped_column(Integer)
    # The one workload it answers (a replay worker's dataset), by hash: it leases only that
    # workload's jobs. NULL: any job of its GPU.
    workload_hash: Mapped[str | None] = mapped_column(String(32))
    # sha256 of the token the worker registered with: only that token may act for it.
    token_hash: Mapped[str] = mapped_column(String(64))
    busy_jobs: Mapped[int] = mapped_column(Integer, default=0)
    registered_at: Mapped[dt.datetime] = _created()
    last_heartbeat: Mapped[dt.datetime] = _created()
    # When the worker said its process ended (POST /v1/workers/{id}/exit); NULL again once
    # it is heard from (a heartbeat, a registration). See `in_state`.
    exited_at: Mapped[dt.datetime | None]

    def state(self, now: dt.datetime, live_within_s: float) -> WorkerState:
        """The worker's state at the database's time `now` (`in_state`, in Python)."""
        if self.exited_at is not None:
            return WorkerState.EXITED
        if (now - self.last_heartbeat).total_seconds() <= live_within_s:
            return WorkerState.LIVE
        return WorkerState.SILENT


def in_state(state: WorkerState, since: Any) -> ColumnElement[bool]:
    """The workers in `state` (model.states.WorkerState), where `since` is the database's
    clock less the lease TTL: a worker heard from at `since` or later, and not exited since,
    is live. The one definition, for every count of live workers, every name in use and
    every list of workers (WorkerRow.state is its twin in Python)."""
    exited = WorkerRow.exited_at.is_not(None)
    if state is WorkerState.EXITED:
        return exited
    heard = WorkerRow.last_heartbeat >= since
    return and_(~exited, heard if state is WorkerState.LIVE else ~heard)


class JobRow(Base):
    """One trial: a proposed schedule, its lease and its measurement."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("task_id", "trial"),
        # A lease's order: fair keys, then age (service/fair_share.py).
        Index("ix_jobs_queue", "state", "arch", "gpu", "fair_key", "id"),
        Index("ix_jobs_lease_expiry", "state", "lease_expires_at"),
        Index("ix_jobs_task_state", "task_id", "state"),
        Index("ix_jobs_owner", "lease_owner", "state"),
        Index("ix_jobs_best", "workload_id", "gpu", "status", "latency_us"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    gpu: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(16))
    trial: Mapped[int] = mapped_column(Integer)  # 0-based, in proposal order
    batch: Mapped[int] = mapped_column(Integer)  # which propose() call made it
    # Where early proposals made it differ from the rule of whole batches: the batch whose
    # proposal first saw this job's result, or -1 for none yet (service/driver.py,
    # first_seen_by). NULL: as the rule says.
    seen_at: Mapped[int | None] = mapped_column(Integer)
    schedule: Mapped[dict[str, Any]]
    schedule_id: Mapped[str] = mapped_column(String(40))
    predicted_us: Mapped[float | None] = mapped_column(Float)
    # Its task's only_runner, beside arch and gpu: what a lease matches a worker against.
    only_runner: Mapped[str | None] = mapped_column(String(16))
    # Its start key in its GPU's fair queue: leases take the smallest (service/fair_share.py).
    fair_key: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # leases that expired
    lease_owner: Mapped[int | None] = mapped_column(ForeignKey("workers.id"))
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[dt.datetime | None]
    # The lease whose result was applied: a repeat of it is acknowledged, not counted again.
    result_token: Mapped[str | None] = mapped_column(String(64))
    result_worker: Mapped[int | None] = mapped_column(ForeignKey("workers.id"))
    # The device the result's worker had registered, kept here once that worker registers
    # another under its name ("" where it had named none); NULL: the worker's own row says
    # it (records.measured_device_name).
    result_device_name: Mapped[str | None] = mapped_column(String(256))
    status: Mapped[str | None] = mapped_column(String(24))
    latency_us: Mapped[float | None] = mapped_column(Float)
    samples_us: Mapped[list[float] | None] = mapped_column(JSON)
    spread: Mapped[float | None] = mapped_column(Float)
    registers: Mapped[int | None] = mapped_column(Integer)
    spill_bytes: Mapped[int | None] = mapped_column(Integer)
    smem_bytes: Mapped[int | None] = mapped_column(Integer)
    compile_ms: Mapped[float | None] = mapped_column(Float)
    max_abs_error: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    runner: Mapped[str | None] = mapped_column(String(RUNNER_MAX_CHARS))
    # The revision of the generator that made the measured kernel (NULL: not said: 1).
    generator_revision: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = _created()
    finished_at: Mapped[dt.datetime | None]


@event.listens_for(TaskRow, "before_insert")
def _bound_latency(mapper: Any, connection: Any, task: TaskRow) -> None:
    """A task's latency floor, computed once as the row is inserted, wherever it is made
    (service/driver.py, service/imports.py): from its workload's row and its GPU."""
    if task.latency_floor_us is not None or task.workload_id is None:
        return
    workload = connection.execute(
        select(WorkloadRow.op, WorkloadRow.flops).where(WorkloadRow.id == task.workload_id)
    ).one_or_none()
    if workload is not None:
        task.latency_floor_us = latency_floor_us(workload.op, workload.flops, task.gpu)


class LeaseRow(Base):
    """Every lease ever granted: the audit trail that shows no job was held twice at once."""

    __tablename__ = "leases"
    __table_args__ = (Index(None, "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    worker_id: Mapped[int] = mapped_column(ForeignKey("workers.id"))
    token: Mapped[str] = mapped_column(String(64))
    leased_at: Mapped[dt.datetime]
    # model.states.LeaseOutcome; None while the lease is live.
    outcome: Mapped[str | None] = mapped_column(String(16))
    ended_at: Mapped[dt.datetime | None]


class ReferenceOptimumRow(Base):
    """The best latency of an exhaustive sweep of a workload on a GPU (curve normalisation)."""

    __tablename__ = "reference_optima"

    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), primary_key=True)
    gpu: Mapped[str] = mapped_column(String(16), primary_key=True)
    best_latency_us: Mapped[float] = mapped_column(Float)
    configurations: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(512))
    # The sweep's runner ("simulated", "cupy", "replay:cupy"...): its optimum normalises the
    # curves of tasks of its kind only (service/curves.py); None (imported before it was
    # recorded): every task's.
    runner: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = _created()
