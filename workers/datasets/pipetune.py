"""pipetune's own datasets: schedules (the knobs of the workload's kernel family: the
tensor-core GEMMs' seven, the memory-intensive operators' thread mapping) -> measurements,
with the workload, GPU and runner that produced them. The metadata names the family and its
knobs; a dataset is checked against the family of its workload.

Units: a :class:`~model.trials.MeasureResult` is in microseconds, a record in milliseconds
(the T4 unit). The conversion is a division by 1000 one way and a multiplication the other,
so a MeasureResult that goes into a file comes back equal to within one unit in the last
place; a *dataset* written and read back is identical.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from pipetune.model.family import (
    FIRST_REVISION,
    ScheduleError,
    family_of,
    generator_revision_of,
    parse_any_workload,
)
from pipetune.model.hardware import GPUSpec, HardwareError, get_gpu, resolve_gpu_key
from pipetune.model.trials import MeasureResult, runner_label_problem
from pipetune.model.workloads import WorkloadError
from pipetune.workers.datasets.records import (
    INVALIDITY_OF_STATUS,
    Dataset,
    DatasetError,
    Record,
    clipped,
    shown,
)

FORMAT_VERSION = 1
MAX_SETTINGS_CHARS = 8192  # the metadata's `settings`, as compact JSON (`_settings_problem`)
# MeasureResult fields kept as named T4 measurements (when not None). A record's
# generator_revision is the revision of the generator line the metadata names ("generator")
# that made its kernel; a record without one was made by revision 1 (record_revision).
MEASUREMENT_FIELDS = (
    "spread",
    "registers",
    "spill_bytes",
    "smem_bytes",
    "max_abs_error",
    "generator_revision",
)
# A record's own runner, kept where it is not the dataset's label: the label of a task that
# workers of several runners measured names them all ("replay:cupy,simulated"), which is no
# trial's runner (and longer than a trial row's runner holds: the file could not be read).
RUNNER_FIELD = "runner"
UNKNOWN_RUNNER = "unknown"


def _as_utc(when: dt.datetime) -> dt.datetime:
    """An aware UTC time; a naive one is taken as UTC (as the service's database keeps
    them, and as Kernel Tuner's files mean them)."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def t4_timestamp(when: dt.datetime) -> str:
    """A time in the benchmark hub's format, ``2023-12-22 09:54:05.502007+00:00`` (UTC)."""
    return str(_as_utc(when))


def parse_t4_timestamp(text: str | None) -> dt.datetime | None:
    """A record's timestamp as an aware UTC datetime; None where it has none or it is not
    an ISO 8601 time (the schema does not constrain its format) or not one UTC can hold
    (9999-12-31 23:59-05:00 overflowed: an OverflowError and exit 1 from the import)."""
    if text is None:
        return None
    try:
        return _as_utc(dt.datetime.fromisoformat(text))
    except (ValueError, OverflowError):
        return None


def now_timestamp() -> str:
    """The time now in the benchmark hub's format."""
    return t4_timestamp(dt.datetime.now(dt.UTC))


def record_from_result(
    schedule: Any,
    result: MeasureResult,
    timestamp: str | None = None,
    dataset_runner: str | None = None,
) -> Record:
    """The record of one result. `dataset_runner`: the runner label of the dataset it goes
    into; a result of another runner keeps its own as the measurement "runner" (one that
    names none is the dataset's runner's, unknown where the label names several)."""
    measurements = {
        name: getattr(result, name)
        for name in MEASUREMENT_FIELDS
        if getattr(result, name) is not None
    }
    own = result.runner
    if own is None and dataset_runner is not None and "," in dataset_runner:
        own = UNKNOWN_RUNNER  # (not the dataset's: it names several runners)
    if own is not None and dataset_runner is not None and own != dataset_runner:
        measurements[RUNNER_FIELD] = own
    return Record(
        configuration=schedule.as_dict(),
        invalidity=INVALIDITY_OF_STATUS[result.status],  # type: ignore[arg-type]
        time_ms=None if result.latency_us is None else result.latency_us / 1e3,
        runtimes_ms=tuple(s / 1e3 for s in result.samples_us),
        compile_ms=result.compile_ms,
        status=result.status,
        error=result.error,
        measurements=measurements,
        timestamp=timestamp,
    )


def record_runner(record: Record, runner: str | None) -> str | None:
    """The runner that measured a record: its own where it names one (a dataset of several
    runners' results, an export of a task that workers of each measured), else `runner`,
    the dataset's (metadata "runner")."""
    own = record.measurements.get(RUNNER_FIELD)
    return runner if own is None else own


def record_revision(record: Record) -> int:
    """The revision of its generator line that made a record's kernel (FIRST_REVISION where
    it says none: recorded before revisions were; check_pipetune has checked the value)."""
    revision = record.measurements.get("generator_revision")
    return FIRST_REVISION if revision is None else int(revision)


def result_from_record(record: Record, runner: str | None) -> MeasureResult:
    """The MeasureResult a record stands for (times back in microseconds)."""
    extra = {k: v for k, v in record.measurements.items() if k in MEASUREMENT_FIELDS}
    # A failed record's timings (a foreign file may keep some) are not a measurement, nor is
    # a valid one's error text an error: the service refuses a result that mixes them.
    valid = record.valid
    samples = [s * 1e3 for s in record.runtimes_ms] if valid else []
    time_us = None if record.time_ms is None or not valid else record.time_ms * 1e3
    if "spread" not in extra and record.valid:
        # A record with no spread of its own (one sample, or a foreign file) has spread 0,
        # as the MeasureResult contract says of replayed single samples.
        extra["spread"] = 0.0
    try:
        return MeasureResult(
            status=record.trial_status,  # type: ignore[arg-type]
            latency_us=time_us,
            samples_us=samples,
            compile_ms=record.compile_ms,
            error=None if valid else record.error,
            runner=runner,
            **extra,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise DatasetError(
            f"record {shown(dict(record.configuration))}: {field}: {clipped(first['msg'])}"
        ) from None


def pipetune_metadata(
    workload: Any,
    gpu: GPUSpec,
    runner: str,
    *,
    device_name: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "workload": workload.canonical(),
        "workload_hash": workload.workload_hash,
        "workload_label": workload.label(),
        "gpu": gpu.key,
        "gpu_name": gpu.name,
        "arch": gpu.arch,
        "hardware_profile": gpu.profile,
        "device_name": device_name,
        "runner": runner,
        "family": family_of(workload).name,
        # The generator line whose revisions the records' generator_revision counts.
        "generator": generator_revision_of(workload).line,
        "knobs": list(family_of(workload).knob_names),
        "statistic": "median",
        "settings": dict(settings or {}),
    }


def dataset_from_results(
    workload: Any,
    gpu: GPUSpec,
    schedules: Sequence[Any],
    results: Sequence[MeasureResult],
    *,
    runner: str,
    device_name: str | None = None,
    settings: Mapping[str, Any] | None = None,
    timestamps: Sequence[str | None] | str | None = None,
) -> Dataset:
    """A pipetune dataset from one sweep's schedules and their results (same order).
    `timestamps`: one per result (None: that record has none), one for all, or None for
    now."""
    if len(schedules) != len(results):
        raise ValueError(f"{len(schedules)} schedules but {len(results)} results")
    if timestamps is None or isinstance(timestamps, str):
        timestamps = [timestamps or now_timestamp()] * len(schedules)
    records = [
        record_from_result(s, r, t, runner)
        for s, r, t in zip(schedules, results, timestamps, strict=True)
    ]
    metadata = {
        "pipetune": pipetune_metadata(
            workload, gpu, runner, device_name=device_name, settings=settings
        )
    }
    knobs = family_of(workload).knob_names
    return Dataset(records, knobs=knobs, metadata=metadata, format="t4")


def _provenance_problem(meta: Mapping[str, Any], family: str, gpu: str, line: str) -> str | None:
    """What is wrong with the metadata fields that restate what the workload and GPU say
    (None: nothing). A file from a newer pipetune (a format this one cannot read), or one
    whose family or architecture contradicts its own workload or GPU (edited by hand, or
    mixed from two files), was read as if it were what its workload says."""
    fmt = meta.get("format", FORMAT_VERSION)  # (absent: a foreign or early file)
    if type(fmt) is not int or not 1 <= fmt <= FORMAT_VERSION:
        return (
            f"format: {shown(fmt)} is not one this pipetune reads (formats 1 to "
            f"{FORMAT_VERSION}; a newer pipetune wrote it?)"
        )
    stated = meta.get("family", family)
    if stated != family:
        return f"family: {shown(stated)} contradicts its workload, a {family} workload"
    stated = meta.get("generator", line)  # (absent: a file from before lines were named)
    if stated != line:
        return f"generator: {shown(stated)} contradicts its workload, made by {line}"
    expected = get_gpu(gpu).arch
    arch = meta.get("arch", expected)
    if arch != expected:
        return f"arch: {shown(arch)} contradicts its GPU, {gpu} ({expected})"
    return None


def _settings_problem(settings: Any) -> str | None:
    """What is wrong with the metadata's measurement settings (None: nothing). They travel
    with what the dataset becomes: an imported task keeps them and every task listing
    returns them; a replay worker reports them with each trial. 100 kB of them was stored,
    and every listing of the service's tasks carried it."""
    if settings is None:
        return None
    size = len(json.dumps(settings, separators=(",", ":"), default=str))
    if size > MAX_SETTINGS_CHARS:
        return (
            f"settings: {size:,} characters of JSON, over the {MAX_SETTINGS_CHARS:,} a "
            "dataset's settings may take (a sweep's or a tuning run's are a few numbers)"
        )
    return None


class PipetuneInfo:
    """The validated pipetune provenance of a dataset."""

    def __init__(self, dataset: Dataset):
        meta = dataset.metadata.get("pipetune")
        where = dataset.name
        if not isinstance(meta, dict):
            raise DatasetError(f"{where}: not a pipetune dataset (no pipetune metadata)")
        workload = meta.get("workload")
        op = workload.get("op") if isinstance(workload, dict) else None
        if op is not None and not isinstance(op, str):
            # The op is looked up in a mapping: an unhashable op (a list or an object in a
            # corrupt file) is refused here by name instead.
            raise DatasetError(f"{where}: pipetune metadata: op: unknown operator {shown(op)}")
        try:
            self.workload = parse_any_workload(workload)
            self.gpu = resolve_gpu_key(str(meta.get("gpu")))
        except (WorkloadError, HardwareError) as exc:
            raise DatasetError(f"{where}: pipetune metadata: {clipped(str(exc))}") from None
        self.family = family_of(self.workload)
        self.generator = generator_revision_of(self.workload)
        if problem := _provenance_problem(meta, self.family.name, self.gpu, self.generator.line):
            raise DatasetError(f"{where}: pipetune metadata: {problem}")
        if not dataset.records:
            # (It said "knobs [] are not the schedule knobs of ...", which hid the cause.)
            raise DatasetError(f"{where}: no results: the file records no configuration")
        if dataset.knobs != self.family.knob_names:
            raise DatasetError(
                f"{where}: knobs {shown(list(dataset.knobs))} are not the schedule knobs of "
                f"{self.workload.label()} ({self.family.name})"
            )
        self.runner = meta.get("runner")
        if isinstance(self.runner, str) and (problem := runner_label_problem(self.runner)):
            # (An unknown label such as "Simulated" was stored, and read as measured.)
            raise DatasetError(f"{where}: pipetune metadata: {clipped(problem)}")
        if problem := _settings_problem(meta.get("settings")):
            raise DatasetError(f"{where}: pipetune metadata: {problem}")
        self.device_name = meta.get("device_name")
        self.gpu_name = meta.get("gpu_name")
        self.metadata = meta


def schedules_outside_space(
    info: PipetuneInfo, schedules: Sequence[Any], space: Any | None = None
) -> list[int]:
    """Which of a dataset's schedules (their indices, in record order) are not in the valid
    space of its workload on its GPU: schedules that GPU cannot run (a file measured on
    another board, or labelled with another GPU). check_pipetune checks each knob against
    its domain only. `space`: that valid space, where the caller has enumerated it."""
    if space is None:
        space = info.family.enumerate(info.workload, get_gpu(info.gpu))
    valid = set(space.ids)
    return [i for i, schedule in enumerate(schedules) if schedule.id not in valid]


def outside_space_reason(info: PipetuneInfo, schedule: Any) -> str:
    """Why a schedule is not valid for the dataset's workload on its GPU: the family's rules
    it breaks, in the words `pipetune.kernel(workload, gpu, schedule=...)` refuses it with."""
    problems = info.family.schedule_problems(schedule, info.workload, get_gpu(info.gpu))
    why = "; ".join(problems) or "not in the family's valid space"
    return f"schedule {schedule.id} is not valid for {info.workload.label()} on {info.gpu}: {why}"


def _own_runner_problem(record: Record) -> str | None:
    """What is wrong with a record's own runner (None: nothing, or it names none)."""
    own = record.measurements.get(RUNNER_FIELD)
    if own is None:
        return None
    if not isinstance(own, str):
        return f"runner {shown(own)} is not a name"
    return runner_label_problem(own)


def check_pipetune(dataset: Dataset) -> PipetuneInfo:
    """Check that a dataset is a usable pipetune dataset: provenance parses, every
    configuration is a schedule, every record converts to a MeasureResult."""
    info = PipetuneInfo(dataset)
    for record in dataset.records:
        try:
            info.family.parse_schedule(dict(record.configuration))
        except ScheduleError as exc:
            raise DatasetError(f"{dataset.name}: {clipped(str(exc))}") from None
        if problem := _own_runner_problem(record):
            raise DatasetError(
                f"{dataset.name}: record {shown(dict(record.configuration))}: {clipped(problem)}"
            )
        try:
            result_from_record(record, record_runner(record, info.runner))
        except DatasetError as exc:
            raise DatasetError(f"{dataset.name}: {exc}") from None
    return info
