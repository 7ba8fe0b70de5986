"""The HTTP wire contract between the service, the workers and the clients (API v1).

One home for every request and response body: the service validates with these models, the
SDK and the worker daemon build and parse them. Pure pydantic, no I/O, so every side can
import it (DESIGN.md: model <- tuner <- service; model <- workers; clients over HTTP).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipetune.model.hardware import HardwareError, resolve_gpu_key
from pipetune.model.space import KNOB_NAMES, KNOBS, Schedule
from pipetune.model.trials import MeasureResult, TrialStatus
from pipetune.model.workloads import Workload

MAX_BUDGET = 5000  # trials per task; larger spaces are swept, not tuned
MAX_LEASE_WAIT_S = 30.0
MAX_JOBS_PER_LEASE = 64

StrategyName = Literal["grid", "random", "analytical", "xgb", "analytical+xgb"]
TaskState = Literal["queued", "running", "done", "failed", "cancelled"]
JobState = Literal["queued", "leased", "done", "failed", "lost", "cancelled"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Request(_Body):
    """A body a client sends: its strings end up in database columns."""

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # PostgreSQL text cannot hold NUL: refuse it here as a 422, not a 500 in the database.
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class _GpuField(_Request):
    gpu: str = Field(description="GPU key or alias: a100, h100, h200, ...")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        try:
            return resolve_gpu_key(value)
        except HardwareError as exc:
            raise ValueError(str(exc)) from None


class ScheduleDoc(_Body):
    """A schedule's knob values (validated against the knob domains)."""

    block_row_warps: int
    block_col_warps: int
    warp_row_tiles: int
    warp_col_tiles: int
    chunk: int
    smem_stages: int
    reg_stages: int

    @field_validator(*KNOB_NAMES)
    @classmethod
    def _in_domain(cls, value: int, info: Any) -> int:
        if value not in KNOBS[info.field_name]:
            raise ValueError(f"must be one of {list(KNOBS[info.field_name])}")
        return value

    def to_schedule(self) -> Schedule:
        return Schedule(**self.model_dump())

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleDoc:
        return cls(**schedule.as_dict())


# ---- users: schedules and tasks -------------------------------------------------------


class TuneOptions(_Request):
    budget: int = Field(50, ge=1, le=MAX_BUDGET)
    strategy: StrategyName = "analytical+xgb"
    seed: int = Field(0, ge=0, le=2**31 - 1)


class ScheduleRequest(_GpuField):
    """POST /v1/schedules: the best known schedule; with `tune`, also start a task."""

    workload: Workload
    tune: TuneOptions | None = None


class ScheduleResponse(_Body):
    source: Literal["measured", "model"]
    workload: dict[str, Any]
    gpu: str
    schedule: ScheduleDoc
    schedule_id: str
    latency_us: float | None = None  # measured median, when source == "measured"
    predicted_us: float
    tflops: float  # measured when source == "measured", else predicted
    # The runner behind a measured schedule: "cupy" is a GPU measurement; "simulated" is the
    # analytical model plus noise (demos and CI), to be labelled as such by every client.
    runner: str | None = None
    task_id: int | None = None
    url: str | None = None


class TaskCreate(_GpuField):
    """POST /v1/tasks."""

    workload: Workload
    budget: int = Field(50, ge=1, le=MAX_BUDGET)
    strategy: StrategyName = "analytical+xgb"
    seed: int = Field(0, ge=0, le=2**31 - 1)


class BestTrial(_Body):
    trial: int
    schedule: ScheduleDoc
    latency_us: float
    tflops: float


class TaskDoc(_Body):
    id: int
    state: TaskState
    workload: dict[str, Any]
    gpu: str
    strategy: StrategyName
    budget: int
    seed: int
    trials_done: int  # trials with a final result (failed ones included)
    trials_failed: int
    best: BestTrial | None = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime


class TaskList(_Body):
    tasks: list[TaskDoc]


class TrialDoc(_Body):
    trial: int  # 0-based index in the task's proposal order
    state: JobState
    status: TrialStatus | None = None
    schedule: ScheduleDoc
    latency_us: float | None = None
    predicted_us: float | None = None
    worker: str | None = None
    error: str | None = None


class TrialList(_Body):
    trials: list[TrialDoc]


class CurvePoint(_Body):
    trial: int
    best_latency_us: float | None  # None until a trial has succeeded
    best_tflops: float | None


class Curve(_Body):
    points: list[CurvePoint]


class AggregatePoint(_Body):
    k: int
    best_in_k: float  # geometric mean over workloads of mean-over-tasks, normalised
    tasks: int


class AggregateCurves(_Body):
    """GET /v1/curves: best-in-k-trials per strategy (ALCOP Fig. 13 view)."""

    gpu: str | None
    op: str | None
    curves: dict[str, list[AggregatePoint]]  # strategy -> points


# ---- workers: registration, leases, results -------------------------------------------


class WorkerRegister(_GpuField):
    """POST /v1/workers (worker token required)."""

    name: str = Field(min_length=1, max_length=128)
    arch: str = Field(pattern=r"^sm_\d{2,3}a?$")
    runner: Literal["cupy", "replay", "simulated"]
    device_name: str | None = Field(None, max_length=256)
    sm_count: int | None = Field(None, ge=1)
    driver: str | None = Field(None, max_length=64)
    clocks_mhz: int | None = Field(None, ge=1)


class WorkerDoc(_Body):
    id: int
    name: str
    gpu: str
    arch: str
    runner: str
    last_heartbeat: datetime


class Heartbeat(_Request):
    """POST /v1/workers/{id}/heartbeat; the response echoes the server's clock."""

    busy_jobs: int = Field(0, ge=0)


class HeartbeatAck(_Body):
    ok: bool
    server_time: datetime


class LeaseRequest(_Request):
    """POST /v1/jobs/lease: long-polls up to wait_s for jobs matching the worker's arch."""

    worker_id: int
    max_jobs: int = Field(1, ge=1, le=MAX_JOBS_PER_LEASE)
    wait_s: float = Field(10.0, ge=0, le=MAX_LEASE_WAIT_S)


class JobLease(_Body):
    job_id: int
    lease_token: str
    lease_expires_at: datetime
    task_id: int
    trial: int
    workload: dict[str, Any]
    gpu: str
    schedule: ScheduleDoc


class LeaseResponse(_Body):
    jobs: list[JobLease]


class JobResult(_Request):
    """POST /v1/jobs/{id}/result: idempotent per (job, lease_token)."""

    worker_id: int
    lease_token: str = Field(min_length=8, max_length=128)
    result: MeasureResult


class ResultAck(_Body):
    accepted: bool  # False: stale lease (expired and re-leased, or cancelled); not counted
    job_state: JobState
    detail: str | None = None


# ---- added with the service: listings, errors, health ---------------------------------


class WorkerList(_Body):
    """GET /v1/workers: registered workers, most recent heartbeat first."""

    workers: list[WorkerDoc]


class ErrorItem(_Body):
    """One problem with a request: where (loc), which field, and why."""

    loc: list[str | int]
    field: str  # the offending field's name, e.g. "k" for a misaligned GEMM K
    reason: str
    type: str


class ValidationErrorBody(_Body):
    """Every 422: the first problem's field and reason, then all of them."""

    field: str
    reason: str
    detail: list[ErrorItem]


class Health(_Body):
    """GET /healthz."""

    status: Literal["ok"]
    database: str  # "sqlite" or "postgresql"
    schema_revision: str
