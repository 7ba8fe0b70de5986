"""The HTTP wire contract between the service, the workers and the clients (API v1).

One home for every request and response body: the service validates with these models, the
SDK and the worker daemon build and parse them. Pure pydantic, no I/O, so every side can
import it (docs/architecture.md: model <- tuner <- service; model <- workers; clients over
HTTP).

Every enum of the schema is derived from its one definition: the states from
model/states.py, the knobs and the operators from the kernel families' declarations
(model/family.py's registry: model/space.py and model/workloads.py for the tensor-core
GEMMs, model/memops/ for the memory-intensive operators), the runners from
model/trials.py.
"""

from __future__ import annotations

import functools
import secrets
import unicodedata
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

from pipetune.model.errors import PipetuneError
from pipetune.model.family import (
    THROUGHPUT_UNITS,
    KernelFamily,
    check_knob_dict,
    families,
    family_for_knobs,
    op_families,
)
from pipetune.model.hardware import HardwareError, resolve_gpu_key

# (Re-exported, `as`: the SDK reads the states through the wire contract alone.)
from pipetune.model.states import FINAL_TASK_STATES as FINAL_TASK_STATES
from pipetune.model.states import JobState as JobState
from pipetune.model.states import TaskState as TaskState
from pipetune.model.states import WorkerState as WorkerState
from pipetune.model.trials import MeasureResult, RunnerKind, TrialStatus

MAX_BUDGET = 5000  # trials per task; larger spaces are swept, not tuned
MAX_BATCH_SIZE = 64  # trials per proposal round (a task's, or the service's default)
MAX_PRIORITY = 10  # a task's share of its GPU's workers, against priority 1
DEFAULT_PRIORITY = 1  # a task's priority where none is asked for (the service's, the clients')
ID_MAX = 2**31 - 1  # ids and counts are 32-bit integer columns (service/orm.py)
# Tasks per page of GET /v1/tasks (and of the local store, which answers as it does).
TASK_PAGE = 100
MAX_TASK_PAGE = 1000
# Workers per answer of GET /v1/workers.
WORKER_PAGE = 200
MAX_WORKER_PAGE = 1000
MAX_LEASE_WAIT_S = 30.0
# The longest duration any setting or option of the service or a worker takes (a week): past
# threading.TIMEOUT_MAX a wait overflows, past a few centuries a database's date arithmetic
# does (an infinite lease TTL left leases with no expiry on SQLite and every lease a 500 on
# PostgreSQL), and nothing an operator means is longer.
MAX_SECONDS = 7 * 24 * 3600.0
MAX_JOBS_PER_LEASE = 64
MAX_RESULTS_PER_POST = 256  # results in one POST /v1/jobs/results
# A request id that makes a lease retry-safe (LeaseRequest.request_id, JobResults.request_id).
REQUEST_ID_PATTERN = r"^[A-Za-z0-9_-]{8,64}$"


def new_request_id() -> str:
    """A fresh request id (16 URL-safe characters, REQUEST_ID_PATTERN's)."""
    return secrets.token_urlsafe(12)


MAX_WORKER_NAME = 128  # characters of a worker's name (WorkerRegister.name)
# The environment variable `pipetune worker` reads its token from (its documented option),
# which `pipetune serve --local-workers` sets for the workers it starts.
TOKEN_ENV = "PIPETUNE_WORKER_TOKEN"


def secret_char_ok(char: str) -> bool:
    """Whether a secret sent in an HTTP header (a worker token, an API key) may hold `char`:
    visible ASCII only. httpx encodes header values as ASCII and h11 refuses control
    characters; a space is legal inside a field value but no bearer token (RFC 6750) or API
    key holds one, so it means a pasted or misread secret rather than a real one. The one
    rule of the clients (clients.sdk.http.header_value_problem) and of the service's
    settings (service.settings.secret_problem)."""
    return "!" <= char <= "~"


# The tuner's registry (tuner.strategies.STRATEGY_MAP) checks itself against this list.
StrategyName = Literal["grid", "random", "analytical", "xgb", "bo", "analytical+xgb", "auto"]
DEFAULT_STRATEGY: StrategyName = "auto"
# Every family's operators: the workload union of the API (discriminated by "op") and the
# operator names as a schema enum (query parameters), from the families' workload types.
_OP_TYPES = {op: fam.ops[op] for op, fam in op_families().items()}
Workload = Annotated[Union[tuple(_OP_TYPES.values())], Field(discriminator="op")]  # type: ignore[valid-type]  # noqa: UP007
OpName = StrEnum("OpName", [(op.upper(), op) for op in _OP_TYPES])  # type: ignore[misc]
# How throughput is shown: work per second in the family's unit (TFLOP/s, GB/s).
ThroughputUnit = Literal[tuple(unit for unit, _ in THROUGHPUT_UNITS.values())]  # type: ignore[valid-type]
TFLOPS = THROUGHPUT_UNITS["flop"][0]


# A row a request refers to (a task, a worker, a job): a positive 32-bit id. Strict: an id
# sent as a string, a float or a boolean is a client's mistake, refused rather than coerced.
RowRef = Annotated[int, Field(strict=True, ge=1, le=ID_MAX)]


# The validation context a client reads the service's answers with (the SDK): fields it does
# not know are ignored there, and values it does not know are kept as their text (`Open`), so
# that a service which adds a field to an answer, or a value to one of its vocabularies (a
# state, a strategy, an operator: additive changes of API v1), does not break the clients
# already deployed. What a client sends the service is still refused with an unknown field or
# value (a misspelt option must not pass silently).
READING = {"reading": True}


def _reading(info: ValidationInfo) -> bool:
    return info.context is not None and bool(info.context.get("reading"))


def _unknown_value_kept(
    value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> Any:
    try:
        return handler(value)
    except ValidationError:
        # Only text, only when reading an answer: a value of another type is no newer
        # vocabulary's but a broken answer, and the service checks its own answers strictly.
        if isinstance(value, str) and _reading(info):
            return value
        raise


def _unknown_value_as_text(value: Any, handler: SerializerFunctionWrapHandler) -> Any:
    # A value the vocabulary knows is its member (an enum) or its literal; one it does not
    # is the plain text it was read as, written back as such (the enum's serializer warned
    # "Expected `enum`" at every model_dump of a row holding one).
    return value if type(value) is str else handler(value)


class _OpenWhenReading:
    """Annotated metadata of `Open`: validates as the vocabulary, and when reading (READING)
    keeps text outside it as that text. The JSON schema stays the vocabulary's, for both
    requests and answers (no serialization return type is declared, so the answer's schema
    is the inner one too)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = handler(source)
        return core_schema.with_info_wrap_validator_function(
            _unknown_value_kept,
            inner,
            serialization=core_schema.wrap_serializer_function_ser_schema(
                _unknown_value_as_text, schema=inner
            ),
        )


_V = TypeVar("_V")
if TYPE_CHECKING:
    # A value of an answer's vocabulary (an enum, a Literal), or, read from a newer service
    # that added to the vocabulary, that value as its text: code that acts on the value says
    # what it does with one it does not know (`state in FINAL_TASK_STATES` is False for it).
    Open = Union[_V, str]  # noqa: UP007 - a generic alias of a TypeVar
else:

    class Open:
        """`Open[T]`: T on the wire and in the schema; text outside T read from an answer."""

        def __class_getitem__(cls, vocabulary: Any) -> Any:
            return Annotated[vocabulary, _OpenWhenReading()]


@functools.cache
def _known_keys(model: type[BaseModel]) -> frozenset[str]:
    keys = set()
    for name, info in model.model_fields.items():
        keys.add(name)
        if isinstance(info.alias, str):
            keys.add(info.alias)
        if isinstance(info.validation_alias, str):
            keys.add(info.validation_alias)
    return frozenset(keys)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unknown_fields_ignored_when_reading(cls, data: Any, info: ValidationInfo) -> Any:
        if not _reading(info) or not isinstance(data, dict):
            return data
        known = _known_keys(cls)
        return {k: v for k, v in data.items() if k in known}


class _Request(_Body):
    """A body a client sends: its strings end up in database columns."""

    @field_validator("*", mode="before")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        # Before any other check of the field (which may quote the value): PostgreSQL text
        # cannot hold NUL, and no UTF-8 column (nor the JSON of a 422) can hold the lone
        # surrogates that JSON's \udXXX escapes decode to. A 422 here, not a 500 later.
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError("must not contain NUL characters")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
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


def _schedule_schema(schema: dict[str, Any]) -> None:
    """Every family's knobs with their values and meaning; a document holds exactly one
    family's (``oneOf`` by the required knobs)."""
    properties: dict[str, Any] = {}
    for fam in families():
        for knob in fam.knobs:
            properties[knob.name] = {
                "type": "integer",
                "enum": list(knob.values),
                "description": knob.doc
                + (f" (codes: {knob.values_said()})" if knob.labels else ""),
            }
    schema.update(
        properties=properties,
        additionalProperties=False,
        oneOf=[{"title": fam.name, "required": list(fam.knob_names)} for fam in families()],
    )


class ScheduleDoc(BaseModel):
    """A schedule: one int per knob of one kernel family, checked against that family's
    declaration (the family is the one whose knobs the document names; an unknown or
    missing knob, or a value outside its domain, is refused naming the knob). Knobs read
    as attributes (``doc.chunk``) and dump as the plain knob dict."""

    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra=_schedule_schema)

    @model_validator(mode="before")
    @classmethod
    def _family_knobs(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, ScheduleDoc):
            return data.model_dump()
        if not isinstance(data, dict):
            raise ValueError("a schedule must be an object of knob values")
        try:
            return check_knob_dict(family_for_knobs(data).knobs, data, ValueError)
        except ValueError:
            # A newer service's schedule, read: of an operator (a family) or with a knob value
            # this client predates. Kept as sent, so that the task or trial it belongs to is
            # still read (a task list failed whole on one such task's best schedule);
            # `family` and `to_schedule()` then say what this client does not know.
            if _reading(info) and _plain_knobs(data):
                return dict(data)
            raise

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> ScheduleDoc:
        """A document from stored, already validated knobs, in the family's knob order (a
        database may have reordered them)."""
        names = family_for_knobs(values).knob_names
        ordered = {k: values[k] for k in names if k in values}
        return super().model_construct(_fields_set, **ordered)

    @property
    def family(self) -> KernelFamily:
        return family_for_knobs(self.model_extra or {})

    def knobs(self) -> dict[str, int]:
        return dict(self.model_extra or {})

    def to_schedule(self) -> Any:
        """The family's schedule object (model/space.py Schedule, MemSchedule, ...)."""
        return self.family.parse_schedule(self.knobs())

    @classmethod
    def of(cls, schedule: Any) -> ScheduleDoc:
        return cls(**schedule.as_dict())


def _plain_knobs(data: dict[Any, Any]) -> bool:
    """Whether `data` is a schedule document of some family: knob names with int values."""
    return bool(data) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in data.items()
    )


class _Throughput(_Body):
    """Throughput in the workload family's unit (TFLOP/s for the tensor-core GEMMs, GB/s of
    compulsory traffic for the memory-intensive operators). ``tflops`` is API v1's field,
    kept for its clients: the same number when the unit is TFLOP/s, else None."""

    throughput: float
    throughput_unit: Open[ThroughputUnit] = TFLOPS
    tflops: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_throughput(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        unit = data.get("throughput_unit", TFLOPS)
        if data.get("throughput") is None and unit == TFLOPS:
            data["throughput"] = data.get("tflops")  # a v1 client's document
        if unit == TFLOPS and data.get("tflops") is None:
            data["tflops"] = data.get("throughput")
        elif unit != TFLOPS and data.get("tflops") is not None:
            raise ValueError(f"tflops is only given in TFLOP/s; this throughput is in {unit}")
        return data


# ---- users: schedules and tasks -------------------------------------------------------


# A finished task of the same workload on another GPU whose trials warm-start the search
# (tuner/transfer.py): its measurements are the prior mean where it has them.
PRIOR_TASK_DESCRIPTION = (
    "a finished task of the same workload on another GPU, or of the same shape in the other "
    "element type (float16 for a bfloat16 workload, and back) on any GPU: its trials "
    "warm-start the search (for the strategies that take a prior; any other is refused, "
    "naming them)"
)
PRIOR_GPU_DESCRIPTION = (
    "instead of prior_task: warm-start from the finished task of the same workload on this GPU "
    "measured on a GPU ahead of a simulated one (a cupy task takes measured ones only), then "
    "measured by the newest generator revision, of those the one with the most successful "
    "trials (the newest of those); the task records which one"
)
LEARNED_PRIOR_DESCRIPTION = (
    "instead of prior_task: the prior mean is a cost model fitted to every finished task of "
    "the same kernel family measured on a GPU (other shapes, other GPUs; simulated trials never "
    "count), over the analytical model's terms; the task records which tasks (learned_from). "
    "true: required (a 422 where there is none); false: never; null (the default): the kernel "
    "family's choice (tensor-core GEMMs and memory-intensive operators: where such tasks "
    "of 8 or more shapes exist; the Hopper wgmma family: no), for a strategy that takes a "
    "prior and without prior_task or prior_gpu"
)


class FieldError(PipetuneError, ValueError):
    """A model validator's error about one of the model's fields (the 422 names it)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class _PriorFields(_Request):
    """Where a task's warm start comes from: a task, or the newest one on a GPU."""

    prior_task: RowRef | None = Field(default=None, description=PRIOR_TASK_DESCRIPTION)
    prior_gpu: str | None = Field(default=None, description=PRIOR_GPU_DESCRIPTION)
    learned_prior: bool | None = Field(
        default=None, strict=True, description=LEARNED_PRIOR_DESCRIPTION
    )

    @field_validator("prior_gpu")
    @classmethod
    def _known_prior_gpu(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return resolve_gpu_key(value)
        except HardwareError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _one_prior(self) -> Any:
        if self.prior_task is not None and self.prior_gpu is not None:
            raise FieldError("prior_gpu", "give prior_task or prior_gpu, not both")
        if self.learned_prior and (self.prior_task is not None or self.prior_gpu is not None):
            given = "prior_task" if self.prior_task is not None else "prior_gpu"
            raise FieldError(
                "learned_prior", f"give {given} or learned_prior, not both (one prior per task)"
            )
        return self


BATCH_SIZE_DESCRIPTION = (
    "Trials per proposal round: the tuner proposes this many, then waits for their results. "
    "Null: the service's PIPETUNE_BATCH_SIZE (8 by default), which keeps that many GPUs busy "
    "on the task. 1 lets every proposal see every result before it, the better search where "
    "one GPU serves the task: knob-only search on the development set came 0.013-0.019 "
    "nearer the optimum at 16-24 trials than in batches of 8; on pipetune's own kernels, "
    "searched from a prior, the two differed by 0.012 at most, and by 0.003 at most from 20 "
    'trials on (benchmarks/RESULTS.md, "a task\'s own batch size").'
)
PRIORITY_DESCRIPTION = (
    "The task's share of its GPU's workers while other tasks wait for them too: tasks take "
    "turns, and a task of priority p takes p trials to a priority-1 task's one. A share, not "
    "a rank: no task waits for another to finish. 1 by default."
)
# Where a task's priority is asked for (POST /v1/tasks, "tune" of POST /v1/schedules).
Priority = Annotated[
    int, Field(strict=True, ge=1, le=MAX_PRIORITY, description=PRIORITY_DESCRIPTION)
]
RUNNER_DESCRIPTION = (
    "only workers of this runner measure the task's trials (`cupy`: GPU measurements only; "
    "`pipetune.tune` in a process sets its own runner's). Null: any worker of the GPU "
    "(a task then waits for such a worker)"
)
# Where a task's batch size is asked for (POST /v1/tasks, "tune" of POST /v1/schedules).
BatchSize = Annotated[
    int, Field(strict=True, ge=1, le=MAX_BATCH_SIZE, description=BATCH_SIZE_DESCRIPTION)
]


class TuneOptions(_PriorFields):
    budget: int = Field(default=50, strict=True, ge=1, le=MAX_BUDGET)
    strategy: StrategyName = DEFAULT_STRATEGY
    seed: int = Field(default=0, strict=True, ge=0, le=ID_MAX)
    batch_size: BatchSize | None = None
    runner: RunnerKind | None = Field(default=None, description=RUNNER_DESCRIPTION)
    priority: Priority = DEFAULT_PRIORITY


class ScheduleRequest(_GpuField):
    """POST /v1/schedules: the best known schedule; with `tune`, also start a task."""

    workload: Workload
    tune: TuneOptions | None = None


class ScheduleResponse(_Throughput):
    source: Open[Literal["measured", "model"]]
    workload: dict[str, Any]
    gpu: str
    schedule: ScheduleDoc
    schedule_id: str
    latency_us: float | None = None  # measured median, when source == "measured"
    predicted_us: float
    # throughput (and v1's tflops): measured when source == "measured", else predicted
    # The runner behind a measured schedule: "cupy" is a GPU measurement; "simulated" is the
    # analytical model plus noise (demos and CI), to be labelled as such by every client.
    runner: str | None = None
    # source "model": the finished, measured tasks whose cost model made the pick (a tensor-core
    # GEMM, where such tasks exist); null: the analytical model's pick.
    learned_from: list[int] | None = None
    # source "model": how many trials of the workload on the GPU failed (a compile error, a
    # wrong result, a timeout); the pick is none of their schedules. Null when measured.
    failed_trials: int | None = None
    # source "measured", a GPU's measurement: the revision of the workload's kernel generator
    # whose kernel was timed (model.family.GeneratorRevision; 1 where its trial recorded
    # none), and the revision `pipetune.kernel` and `pipetune export` make now. Where they
    # differ, the latency is an older kernel's (the convolution loader of 2026-11-28 made
    # every convolution 0.80x its time), and the schedule was picked by it. Null otherwise.
    measured_generator_revision: int | None = None
    generator_revision: int | None = None
    # source "measured": the device that measured it, as its worker registered it (an
    # imported task's: as its dataset named it); null where none was said (a simulated one).
    device_name: str | None = None
    task_id: int | None = None
    url: str | None = None


class TaskCreate(_GpuField, _PriorFields):
    """POST /v1/tasks."""

    workload: Workload
    budget: int = Field(default=50, strict=True, ge=1, le=MAX_BUDGET)
    strategy: StrategyName = DEFAULT_STRATEGY
    seed: int = Field(default=0, strict=True, ge=0, le=ID_MAX)
    batch_size: BatchSize | None = None
    runner: RunnerKind | None = Field(default=None, description=RUNNER_DESCRIPTION)
    priority: Priority = DEFAULT_PRIORITY


class TaskPrior(_Body):
    """POST /v1/tasks/prior: the prior a task of that TaskCreate would start from now, as
    the created task would record it (both null: cold, the strategy's own prior)."""

    # The finished task of the workload whose trials warm-start it (prior_gpu resolved).
    prior_task: int | None = None
    # The finished, measured tasks whose cost model is its prior (asked for, or by default).
    learned_from: list[int] | None = None


class BestTrial(_Throughput):
    trial: int
    schedule: ScheduleDoc
    # The schedule in one cell, by its family (a GEMM tile, a memory-intensive mapping).
    schedule_label: str | None = None
    latency_us: float
    # The runner that produced it (RunnerKind.of reads the kind): "simulated" latencies are
    # the analytical model plus noise, to be labelled as such by every client.
    runner: str | None = None


class TaskDoc(_Body):
    id: int
    state: Open[TaskState]
    workload: dict[str, Any]
    label: str | None = None  # the workload in words ("softmax 4096x768")
    gpu: str
    strategy: Open[StrategyName]
    budget: int
    seed: int
    # Trials per proposal round (an imported task: its trials, as one batch).
    batch_size: int | None = None
    prior_task: int | None = None  # the task whose trials warm-started this one
    # The finished, measured tasks whose cost model is this task's prior (learned_prior).
    learned_from: list[int] | None = None
    # The recorded dataset an imported task's trials came from (not tuned by the service).
    imported_from: str | None = None
    # What that dataset said of its measurement: the device its records were measured on
    # and its settings (an export of the task writes them back); null for a tuned task.
    imported_device_name: str | None = None
    imported_settings: dict[str, Any] | None = None
    # Only workers of this runner measure its trials (TaskCreate.runner); null: any.
    runner: str | None = None
    priority: int = DEFAULT_PRIORITY  # its share of its GPU's workers (TaskCreate.priority)
    trials_done: int  # trials with a final result (failed ones included)
    trials_failed: int
    # The trials the task runs: its budget, or its whole space where that is smaller (a
    # task that ends with fewer trials than its budget has measured every schedule).
    trials_target: int | None = None
    best: BestTrial | None = None
    error: str | None = None
    # Why the task cannot progress now, while it is queued or running and no live worker
    # (one heard from within the lease TTL) could take its trials: "no a100 worker has
    # registered", say. Read from the workers table when the task is read; null: a live
    # worker can take them (or the task has ended).
    no_worker: str | None = None
    created_at: datetime
    updated_at: datetime
    # When it ended (done, failed or cancelled); null while it runs, and from a service before
    # the field. What tells a client a state it does not know is a final one (is_finished).
    finished_at: datetime | None = None

    def is_finished(self) -> bool:
        """Whether the task has ended: a final state, or a state a newer service added (read
        as its text) with an end time. Waiting on such a state by its name alone never
        ended."""
        if self.state in FINAL_TASK_STATES:
            return True
        return self.state not in set(TaskState) and self.finished_at is not None


class TaskList(_Body):
    tasks: list[TaskDoc]


class TrialDoc(_Body):
    trial: int  # 0-based index in the task's proposal order
    state: Open[JobState]
    # Closed still: a newer status would be read as its text, but a trial's status goes
    # whole into the measurement an export writes (clients/library/exports.py _trial_result).
    status: TrialStatus | None = None
    schedule: ScheduleDoc
    schedule_label: str | None = None  # as BestTrial's
    latency_us: float | None = None
    predicted_us: float | None = None
    worker: str | None = None
    # The GPU that worker registered (its device name), where it gave one.
    worker_device: str | None = None
    error: str | None = None
    # The runner that produced the result ("simulated": the model plus noise, not measured).
    runner: str | None = None
    # The rest of the measurement, as the worker reported it (MeasureResult's fields): the
    # timed repeats only where asked for (GET .../trials?samples=true: up to MAX_SAMPLES
    # a trial), so that following a task stays light; None: not asked, or not reported.
    samples_us: list[float] | None = None
    spread: float | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    smem_bytes: int | None = None
    compile_ms: float | None = None
    max_abs_error: float | None = None
    # The revision of the generator that made the measured kernel (MeasureResult's); None:
    # not said (revision 1 of its line), or a simulated answer.
    generator_revision: int | None = None
    # When its outcome was recorded (for an imported task: the dataset's own timestamp);
    # None while it has none.
    finished_at: datetime | None = None


# A page of trials with their samples holds at most this many (each may carry MAX_SAMPLES).
SAMPLES_PAGE = 100


class TrialList(_Body):
    trials: list[TrialDoc]


class CurvePoint(_Body):
    trial: int  # the place among the task's trials (0-based; a cancelled job is none)
    best_latency_us: float | None  # None until a trial has succeeded
    # In the curve's throughput_unit; best_tflops is API v1's (None unless in TFLOP/s).
    best_tflops: float | None = None
    best_throughput: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _v1_point(cls, data: Any) -> Any:
        # A v1 document has only best_tflops: its throughput, in TFLOP/s.
        if isinstance(data, dict) and data.get("best_throughput") is None:
            data = {**data, "best_throughput": data.get("best_tflops")}
        return data


class Curve(_Body):
    points: list[CurvePoint]
    throughput_unit: Open[ThroughputUnit] = TFLOPS
    # The runner kinds of the trials behind the points, as AggregateCurves says them
    # ("simulated": the analytical model plus noise, not measurements).
    runners: list[str] = Field(default_factory=list)


class AggregatePoint(_Body):
    k: int
    best_in_k: float  # geometric mean over workloads of mean-over-tasks, normalised
    tasks: int


class AggregateCurves(_Body):
    """GET /v1/curves: best-in-k-trials per strategy (ALCOP Fig. 13 view)."""

    gpu: str | None
    op: str | None
    curves: dict[str, list[AggregatePoint]]  # strategy -> points
    # The runner kinds of the tasks' best trials behind the curves, and "simulated" where a
    # simulated runner answered any trial of them ("simulated": the curves rank the
    # analytical model plus noise, not measurements).
    runners: list[str] = Field(default_factory=list)


# ---- workers: registration, leases, results -------------------------------------------


# Unicode categories a worker's name, device name or driver may not hold (`_one_line`):
# controls, format characters, line and paragraph separators.
_NOT_IN_A_NAME = frozenset({"Cc", "Cf", "Zl", "Zp"})


class WorkerRegister(_GpuField):
    """POST /v1/workers (worker token required)."""

    name: str = Field(min_length=1, max_length=MAX_WORKER_NAME)
    arch: str = Field(
        pattern=r"^sm_\d{2,3}a?$",
        description="the device's compute capability; an arch-specific target (sm_90a) is read "
        "as its device's (sm_90): jobs are matched by the device",
    )
    runner: RunnerKind
    device_name: str | None = Field(default=None, max_length=256)
    sm_count: int | None = Field(default=None, strict=True, ge=1, le=ID_MAX)
    driver: str | None = Field(default=None, max_length=64)
    clocks_mhz: int | None = Field(default=None, strict=True, ge=1, le=ID_MAX)
    workload: Workload | None = Field(
        default=None,
        description="the one workload the worker can answer (a replay worker: its dataset's); "
        "it leases only that workload's jobs. Left out: any job of its arch and GPU",
    )

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("name", "device_name", "driver")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        # Shown in the CLI's tables, the dashboard and the service's log lines: a name
        # holding a newline or an escape sequence ("a\nb\tc" was registered) split a row of
        # `pipetune workers` and could forge a log line or recolour a terminal. Invisible
        # format characters too: a right-to-left override made "node-\u202e10\u202c" read
        # as "node-01", another worker's name, and a zero-width space hides in one; Unicode's
        # line and paragraph separators break a line where a terminal honours them.
        if value is not None:
            bad = next((c for c in value if unicodedata.category(c) in _NOT_IN_A_NAME), None)
            if bad is not None:
                raise ValueError(
                    "must not contain control, format (invisible or reordering) or line "
                    f"separator characters, got {bad!r} at {value.index(bad)}"
                )
        return value

    @field_validator("arch")
    @classmethod
    def _device_arch(cls, value: str) -> str:
        # Stored as the device's: a worker said sm_90a once and then never got an sm_90 job.
        return value.removesuffix("a")


class WorkerDoc(_Body):
    id: int
    name: str
    gpu: str
    arch: str
    runner: str
    last_heartbeat: datetime
    # When it said its process ended (POST /v1/workers/{id}/exit): not live since, and its
    # name free to another token. Null: it has not, or was heard from again since.
    exited_at: datetime | None = None
    # Live, silent past the lease TTL, or exited, when the answer was made (by the
    # database's clock: a client's may differ). Null from a service before the field.
    state: Open[WorkerState] | None = None
    # The jobs it was measuring at its last heartbeat; 0 once it is silent or exited (its
    # leases have expired, or it handed them back).
    busy_jobs: int = 0
    # The hash of the one workload it answers (WorkerRegister.workload); null: any.
    workload_hash: str | None = None
    # POST /v1/workers' answer to a re-registration: the name's last heartbeat was within a
    # lease TTL, so another process may be running under it (each should have its own).
    name_in_use: bool | None = None
    # POST /v1/workers' answer: the service's lease TTL, the window within which a worker
    # must be heard from to count as live (an idle daemon heartbeats within half of it).
    # Null elsewhere, and from a service before the field.
    lease_ttl_s: float | None = None


# The most leases one heartbeat lists (a worker holding more sends none: all are extended).
MAX_HELD_LEASES = 4096


class HeldLease(_Request):
    """A lease a worker still holds: a job in hand, or measured and not yet acknowledged."""

    job_id: RowRef
    lease_token: str = Field(min_length=8, max_length=128)


class Heartbeat(_Request):
    """POST /v1/workers/{id}/heartbeat; the response echoes the server's clock.

    `leases`: the leases the worker holds; only those are extended by one TTL. A lease the
    worker lost track of (the answer that granted it never arrived, its result could not be
    reported, a process under the same name died holding it) is then left to expire and its
    job returns to the queue; extending all of the worker's leases kept such jobs leased for
    as long as the worker lived, and their tasks never finished. None (a worker from before
    the field): every live lease of the worker is extended, as before."""

    busy_jobs: int = Field(default=0, strict=True, ge=0, le=ID_MAX)
    leases: list[HeldLease] | None = Field(default=None, max_length=MAX_HELD_LEASES)


class HeartbeatAck(_Body):
    """`gone`: of the leases the heartbeat listed, those that are no longer the worker's (the
    task cancelled, the lease expired and the job requeued or leased to another, the job
    finished): a worker need not measure such a job it has not started. Empty where the
    heartbeat listed none, and from a service from before the field."""

    ok: bool
    server_time: datetime
    gone: list[RowRef] = Field(default_factory=list, max_length=MAX_HELD_LEASES)


class _RetrySafeLease(_Request):
    """A request that leases, made safe to send again: sent again with the same
    `request_id` and `retry`, it is answered with the jobs the first one leased, while they
    are still leased to the worker, instead of leasing more (an answer lost on the way, then
    the request retried, left the first jobs leased to a worker that never got them until
    their TTL). A fresh random id per request (`new_request_id`), the same for its retries;
    `retry` on the retries only: the service looks for earlier jobs only then, so a first
    request costs nothing more. A retry of a report with `max_jobs` 0 only looks for them.
    An id sent again without `retry` is a new request: a retry then repeats the newest
    request under the id, and one asking fewer jobs than that request leased is a 422
    naming `max_jobs` (an answer never holds more than its `max_jobs`). (A retry sent while
    the request it repeats is still being answered cannot see that one's jobs: those wait
    out their TTL, as every lost answer's did before.)"""

    request_id: str | None = Field(default=None, pattern=REQUEST_ID_PATTERN)
    retry: bool = Field(default=False, strict=True)

    @model_validator(mode="after")
    def _retry_of_a_request_id(self) -> Any:
        if self.retry and self.request_id is None:
            raise FieldError("retry", "needs a request_id (the id of the request it repeats)")
        return self


class LeaseRequest(_RetrySafeLease):
    """POST /v1/jobs/lease: long-polls up to wait_s for jobs of the worker's own GPU model (the
    service answers as soon as jobs are enqueued: it waits on a wake-up, it does not poll)."""

    worker_id: RowRef
    max_jobs: int = Field(default=1, strict=True, ge=1, le=MAX_JOBS_PER_LEASE)
    wait_s: float = Field(default=10.0, strict=True, ge=0, le=MAX_LEASE_WAIT_S, allow_inf_nan=False)


class JobLease(_Body):
    job_id: int
    lease_token: str
    lease_expires_at: datetime
    # The TTL the lease was granted for, and by which each heartbeat listing it extends it: a
    # worker extends a lease only once it has lived part of this (workers/daemon/heartbeats.py).
    # None from a service from before the field.
    lease_ttl_s: float | None = None
    task_id: int
    trial: int
    workload: dict[str, Any]
    gpu: str
    schedule: ScheduleDoc


class LeaseResponse(_Body):
    jobs: list[JobLease]


class JobResult(_Request):
    """POST /v1/jobs/{id}/result: idempotent per (job, lease_token)."""

    worker_id: RowRef
    lease_token: str = Field(min_length=8, max_length=128)
    result: MeasureResult


class ResultAck(_Body):
    accepted: bool  # False: stale lease (expired and re-leased, or cancelled); not counted
    job_state: Open[JobState]
    detail: str | None = None


class ReportedResult(_Request):
    """One result of POST /v1/jobs/results: the job, the lease it was measured under."""

    job_id: RowRef
    lease_token: str = Field(min_length=8, max_length=128)
    result: MeasureResult


class JobResults(_RetrySafeLease):
    """POST /v1/jobs/results: many results in one request (a worker's reporter sends what
    it has measured since its last report). Each is judged on its own, as the single-job
    route judges one, and each is idempotent per (job, lease_token): the whole request may
    be sent again."""

    worker_id: RowRef
    results: list[ReportedResult] = Field(min_length=1, max_length=MAX_RESULTS_PER_POST)
    # The worker's next lease in the same request: up to max_jobs jobs claimed once the
    # results are recorded, as POST /v1/jobs/lease would claim them but without waiting
    # (none when none is queued). A worker that reports and wants more work saves a round
    # trip; one that gets none long-polls the lease route as before.
    max_jobs: int = Field(default=0, strict=True, ge=0, le=MAX_JOBS_PER_LEASE)


class JobResultAck(_Body):
    """One result's answer, in the order of the request's results. `status_code` is what
    the single-job route would have answered: 200 (then `accepted` says whether it was
    recorded, as ResultAck), 403 (not this worker's lease) or 404 (no such job)."""

    job_id: int
    status_code: Literal[200, 403, 404]
    accepted: bool
    job_state: Open[JobState] | None = None  # None when refused (403, 404)
    detail: str | None = None


class JobResultAcks(_Body):
    acks: list[JobResultAck]
    jobs: list[JobLease] = []  # leased in the same request (JobResults.max_jobs)


class LeaseRelease(_Request):
    """POST /v1/jobs/release: leases the worker hands back unmeasured (it is stopping): the
    service queues their jobs again at once, without counting an attempt."""

    worker_id: RowRef
    leases: list[HeldLease] = Field(min_length=1, max_length=MAX_HELD_LEASES)


class ReleaseAck(_Body):
    """The jobs queued again; a lease no longer the worker's is left as it is (not listed)."""

    released: list[int]


# ---- added with the service: listings, errors, health ---------------------------------


class WorkerList(_Body):
    """GET /v1/workers: registered workers (of the state asked for), most recent heartbeat
    first, up to the limit asked for; `counts`: how many registered workers are in each
    state, all of them."""

    workers: list[WorkerDoc]
    counts: dict[Open[WorkerState], int] = Field(default_factory=dict)


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
