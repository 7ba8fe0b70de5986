"""The HTTP wire contract between the service, the workers and the clients (API v1).

One home for every request and response body: the service validates with these models, the
SDK and the worker daemon build and parse them. Pure pydantic, no I/O, so every side can
import it (docs/architecture.md: model <- tuner <- service; model <- workers; clients over
HTTP).

Every enum of the schema is derived from its one definition: the states from
model/states.py, the knobs from model/space.py, the runners from model/trials.py, the
operators from model/workloads.py.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipetune.model.hardware import HardwareError, resolve_gpu_key
from pipetune.model.space import KNOB_NAMES, KNOB_SPECS, KNOBS, KnobValues, Schedule
from pipetune.model.states import JobState, TaskState
from pipetune.model.trials import MeasureResult, RunnerKind, TrialStatus
from pipetune.model.workloads import OPS, Workload

MAX_BUDGET = 5000  # trials per task; larger spaces are swept, not tuned
MAX_LEASE_WAIT_S = 30.0
MAX_JOBS_PER_LEASE = 64
MAX_RESULTS_PER_POST = 256  # results in one POST /v1/jobs/results

# The tuner's registry (tuner.strategies.STRATEGY_MAP) checks itself against this list.
StrategyName = Literal["grid", "random", "analytical", "xgb", "bo", "analytical+xgb", "auto"]
DEFAULT_STRATEGY: StrategyName = "auto"
# The operator names as a schema enum (query parameters), from the workload types.
OpName = StrEnum("OpName", [(op.upper(), op) for op in OPS])  # type: ignore[misc]


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


def _knob_enums(schema: dict[str, Any]) -> None:
    for name, knob in KNOB_SPECS.items():
        schema["properties"][name].update(enum=list(knob.values), description=knob.meaning)


class ScheduleDoc(BaseModel, KnobValues, frozen=True):
    """A schedule's knob values (validated against the knob domains). The fields are the
    knob declaration's (model/space.py KnobValues); the schema lists each knob's values."""

    # A body like _Body's (extra fields refused), frozen like the declaration it inherits.
    model_config = ConfigDict(extra="forbid", json_schema_extra=_knob_enums)

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
    strategy: StrategyName = DEFAULT_STRATEGY
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
    strategy: StrategyName = DEFAULT_STRATEGY
    seed: int = Field(0, ge=0, le=2**31 - 1)


class BestTrial(_Body):
    trial: int
    schedule: ScheduleDoc
    latency_us: float
    tflops: float
    # The runner that produced it (RunnerKind.of reads the kind): "simulated" latencies are
    # the analytical model plus noise, to be labelled as such by every client.
    runner: str | None = None


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
    # The runner that produced the result ("simulated": the model plus noise, not measured).
    runner: str | None = None


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
    # The runner kinds of the tasks' best trials behind the curves ("simulated": the curves
    # rank the analytical model plus noise, not measurements).
    runners: list[str] = Field(default_factory=list)


# ---- workers: registration, leases, results -------------------------------------------


class WorkerRegister(_GpuField):
    """POST /v1/workers (worker token required)."""

    name: str = Field(min_length=1, max_length=128)
    arch: str = Field(pattern=r"^sm_\d{2,3}a?$")
    runner: RunnerKind
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
    """POST /v1/jobs/lease: long-polls up to wait_s for jobs matching the worker's arch (the
    service answers as soon as jobs are enqueued: it waits on a wake-up, it does not poll)."""

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


class ReportedResult(_Request):
    """One result of POST /v1/jobs/results: the job, the lease it was measured under."""

    job_id: int
    lease_token: str = Field(min_length=8, max_length=128)
    result: MeasureResult


class JobResults(_Request):
    """POST /v1/jobs/results: many results in one request (a worker's reporter sends what
    it has measured since its last report). Each is judged on its own, as the single-job
    route judges one, and each is idempotent per (job, lease_token): the whole request may
    be sent again."""

    worker_id: int
    results: list[ReportedResult] = Field(min_length=1, max_length=MAX_RESULTS_PER_POST)


class JobResultAck(_Body):
    """One result's answer, in the order of the request's results. `status_code` is what
    the single-job route would have answered: 200 (then `accepted` says whether it was
    recorded, as ResultAck), 403 (not this worker's lease) or 404 (no such job)."""

    job_id: int
    status_code: Literal[200, 403, 404]
    accepted: bool
    job_state: JobState | None = None  # None when refused (403, 404)
    detail: str | None = None


class JobResultAcks(_Body):
    acks: list[JobResultAck]


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
