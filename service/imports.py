"""A recorded dataset imported as a finished task (`pipetune db import-dataset FILE`).

A pipetune dataset (a sweep of one workload on one GPU, from `pipetune sweep`, a GPU campaign,
or `pipetune export --format t4` of another service's task) becomes a task in state `done`
whose trials are the dataset's records, measured elsewhere: `imported_from` names the file.
Then the service knows what it holds: a task on another GPU can warm-start from it
(`prior_task`), `POST /v1/schedules` answers with its best schedule, and the best-in-k curves
normalise to it. It is left out of the per-strategy curves (nothing was tuned here).

Importing the same trials again (the same file, or a copy of it under another name) finds
the task they became (`import_once`) instead of making a second one: an import script
that is run twice must not double what the service knows of a workload. The same trials
means the same workload, GPU, device and measurement settings, and records equal in every
field a trial row keeps (TRIAL_COLUMNS), so a renamed copy is still the same dataset, and
another sweep written to the same path, or the same sweep measured again, is not.

`sweep_coverage` says whether a dataset is an exhaustive sweep: every valid schedule of its
workload on its GPU (what `pipetune db import-optimum` needs for the optimum it records).

A record whose schedule is not in the valid space of the workload on the GPU the file names
(a sweep of another board, or one labelled with another GPU) refuses the whole file, before
anything is written: its schedule cannot run there, yet stored it was answered as the
measured best, `pipetune export` wrote an unlaunchable kernel of it, and its time became the
optimum the curves normalise to. The file's knobs are checked against their domains when it
is read (check_pipetune); the space of its GPU is checked here, where the service takes it.

A record whose ok latency is below the task's latency floor (TaskRow.latency_floor_us: its
workload's FLOPs at a few times its GPU's peak) is no measurement: it is recorded as a
failed trial that says why, as a worker's result below it is (records.implausible_failure),
never the task's best nor the workload's answer to a schedule lookup.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.knobs import ScheduleError
from pipetune.model.states import TaskState
from pipetune.model.trials import MeasureResult, readable_os_text, storable_text
from pipetune.service.errors import InputError
from pipetune.service.orm import JobRow, TaskRow, WorkloadRow, latency_floor_us
from pipetune.service.queue import check_storable
from pipetune.service.queue_types import result_columns
from pipetune.service.records import below_latency_floor, implausible_failure, workload_id
from pipetune.workers.datasets import Dataset
from pipetune.workers.datasets.pipetune import (
    PipetuneInfo,
    outside_space_reason,
    parse_t4_timestamp,
    record_runner,
    result_from_record,
    schedules_outside_space,
)

log = logging.getLogger(__name__)

# The strategy an imported task is filed under: the records were not proposed by a search
# here; a sweep of the space in its own order is what `grid` names.
IMPORTED_STRATEGY = "grid"


def sweep_coverage(data: Dataset, info: PipetuneInfo) -> tuple[int, int]:
    """(how many of the valid schedules of the dataset's workload on its GPU the dataset
    holds a record of, how many valid schedules there are). A record of a schedule outside
    that space is refused (ScheduleError naming the file and the record): its time is no
    optimum of the GPU."""
    space = info.family.enumerate(info.workload, get_gpu(info.gpu))
    schedules = [info.family.parse_schedule(dict(r.configuration)) for r in data.records]
    if (outside := _outside_space(info, schedules, space)) is not None:
        raise ScheduleError(f"{data.name}: record {outside[0]}'s configuration: {outside[1]}")
    recorded = {s.id for s in schedules}
    return sum(i in recorded for i in space.ids), len(space)


def _outside_space(
    info: PipetuneInfo, schedules: list[Any], space: Any | None = None
) -> tuple[int, str] | None:
    """The first record whose schedule the valid space of the dataset's workload on its GPU
    does not hold: (its index, why, as `pipetune.kernel` says it); None if there is none."""
    outside = schedules_outside_space(info, schedules, space)
    if not outside:
        return None
    return outside[0], outside_space_reason(info, schedules[outside[0]])


# What of a trial an import compares with an earlier one's job rows: its schedule and every
# column of its measurement (result_columns: runner, samples, errors, generator revision...).
# Schedule, status and latency alone called a re-measured file (another runner, device or
# repeats) "already imported", and its content was dropped without a word.
TRIAL_COLUMNS = ("trial", "schedule_id", *result_columns(MeasureResult(status="ok")))


def _trial_keys(schedules: list[Any], results: list[Any]) -> list[tuple[Any, ...]]:
    """What identifies an import's trials, as its job rows keep them (TRIAL_COLUMNS)."""
    keys = []
    for i, (s, r) in enumerate(zip(schedules, results, strict=True)):
        row = {"trial": i, "schedule_id": s.id, **result_columns(r)}
        keys.append(tuple(row[c] for c in TRIAL_COLUMNS))
    return keys


def _trials(data: Dataset, info: PipetuneInfo) -> tuple[list[Any], list[Any]]:
    """The dataset's records as the family's schedules and measurement results. A result a
    trial row cannot hold is refused as a worker's would be (InputError, located at
    ["records", i, field]): a register count past int32 failed on PostgreSQL's insert. So is
    a schedule outside the valid space of the workload on the file's GPU (located at
    ["records", i, "configuration"], with the rules it breaks)."""
    fam = info.family
    schedules = [fam.parse_schedule(dict(r.configuration)) for r in data.records]
    if (outside := _outside_space(info, schedules)) is not None:
        raise InputError(["records", outside[0], "configuration"], outside[1])
    results = [result_from_record(r, record_runner(r, info.runner)) for r in data.records]
    for i, result in enumerate(results):
        check_storable(result, ["records", i], from_worker=False)
    return schedules, _below_floor_failed(data, info, results)


def task_latency_floor(info: PipetuneInfo) -> float | None:
    """The latency floor of the task a dataset becomes (TaskRow.latency_floor_us), from its
    workload's work as its workload row holds it (records.workload_id) and its GPU."""
    work = int(family_of(info.workload).work(info.workload))
    return latency_floor_us(info.workload.op, work, info.gpu)


def _below_floor_failed(data: Dataset, info: PipetuneInfo, results: list[Any]) -> list[Any]:
    """The results with each ok latency below the task's floor recorded as failed, as a
    worker's would be (records.implausible_failure): an import bypassed that rule, and an
    impossible latency in a file became the workload's best and its schedule's answer."""
    floor = task_latency_floor(info)
    below = [i for i, r in enumerate(results) if below_latency_floor(r, floor)]
    if not below:
        return results
    assert floor is not None
    results = list(results)
    for i in below:
        results[i] = implausible_failure(results[i], floor)
    # (Said once per file, with the first record's reason: a file may hold thousands.)
    shown = ", ".join(map(str, below[:10])) + (", ..." if len(below) > 10 else "")
    log.warning(
        "%s: record %s (%d of %d): %s",
        data.name,
        shown,
        len(below),
        len(results),
        results[below[0]].error,
    )
    return results


def _imported_task(
    session: Session, info: PipetuneInfo, schedules: list[Any], results: list[Any]
) -> int | None:
    """The task an earlier import of the same trials became (the oldest, were there several),
    else None. Only imported tasks of the workload on the GPU with as many trials, of the
    same device and measurement settings, are read."""
    wanted = _trial_keys(schedules, results)
    candidates = session.execute(
        select(TaskRow.id, TaskRow.imported_device_name, TaskRow.imported_settings)
        .join(WorkloadRow, TaskRow.workload_id == WorkloadRow.id)
        .where(
            WorkloadRow.hash == info.workload.workload_hash,
            TaskRow.gpu == info.gpu,
            TaskRow.imported_from.is_not(None),
            TaskRow.trials_done == len(wanted),
        )
        .order_by(TaskRow.id)
    ).all()
    described = (_device_name(info), _settings(info) or None)
    for task_id, device_name, settings in candidates:
        # ({} and none both state no settings: imports before {} was kept stored none.)
        if (device_name, settings or None) != described:
            continue
        rows = session.execute(
            select(*(getattr(JobRow, c) for c in TRIAL_COLUMNS))
            .where(JobRow.task_id == task_id)
            .order_by(JobRow.trial)
        ).all()
        if [tuple(row) for row in rows] == wanted:
            return task_id
    return None


def _one_import_at_a_time(session: Session, info: PipetuneInfo) -> None:
    """On PostgreSQL, wait for any other import of the workload on the GPU to commit before
    looking for its task (a lock held to the end of this transaction). Each of two imports
    of one file at once found no task and wrote its own; SQLite's writers already queue
    (BEGIN IMMEDIATE), and a statement here reads what the one before it committed."""
    if session.get_bind().dialect.name != "postgresql":
        return
    name = f"pipetune import {info.workload.workload_hash} {info.gpu}".encode()
    key = int.from_bytes(hashlib.sha256(name).digest()[:8], "big", signed=True)
    session.execute(select(func.pg_advisory_xact_lock(key)))


def import_once(
    session: Session, data: Dataset, info: PipetuneInfo, source: str, now: Any
) -> tuple[int, bool]:
    """`import_dataset`, unless the same trials were imported already: (the task's id,
    whether this call wrote it)."""
    schedules, results = _trials(data, info)
    _one_import_at_a_time(session, info)
    found = _imported_task(session, info, schedules, results)
    if found is not None:
        return found, False
    return _write_task(session, info, source, now, schedules, results, _finished(data)), True


def import_dataset(
    session: Session, data: Dataset, info: PipetuneInfo, source: str, now: Any
) -> int:
    """Write `data` (checked by check_pipetune into `info`) as a finished task; its id.
    `now`: the database's time (Database.now())."""
    return _write_task(session, info, source, now, *_trials(data, info), _finished(data))


def _finished(data: Dataset) -> list[Any]:
    """When each record was measured, from its own timestamp (None where it has none): the
    trial's finished_at, which an export writes back as the record's timestamp."""
    return [parse_t4_timestamp(r.timestamp) for r in data.records]


def _device_name(info: PipetuneInfo) -> str | None:
    """The device the dataset's records were measured on, as its file names it."""
    name = info.device_name
    # (Replaced where no text column holds it: a NUL was blamed on PostgreSQL, exit 1.)
    return storable_text(name)[:256] if isinstance(name, str) and name else None


def storable_source_name(source: str) -> str:
    """The file's name as a text column holds it: a name that is not UTF-8 keeps its bytes as
    backslash escapes, lat\\xe9.t4.json (its import failed with UnicodeEncodeError, exit 1)."""
    return readable_os_text(source)[:512]


def _settings(info: PipetuneInfo) -> dict[str, Any] | None:
    """The dataset's measurement settings (a sweep's warm-up and repeats; an exported task's
    strategy and seed), as its file states them."""
    settings = info.metadata.get("settings")
    # ({} is kept as {}: taken for none, an export of the task wrote the task's own strategy,
    # seed and budget, a tuning run that never happened.)
    return dict(settings) if isinstance(settings, dict) else None


def _write_task(
    session: Session,
    info: PipetuneInfo,
    source: str,
    now: Any,
    schedules: list[Any],
    results: list[Any],
    finished: list[Any],
) -> int:
    if not schedules:
        raise ValueError(f"{source}: the dataset holds no configuration")
    fam, gpu = info.family, get_gpu(info.gpu)
    knobs = {
        k: np.array([getattr(s, k) for s in schedules], dtype=np.int64) for k in fam.knob_names
    }
    predicted = fam.evaluate(fam.space_of(info.workload, gpu, knobs)).latency_us
    ok = [(r.latency_us, i) for i, r in enumerate(results) if r.ok and r.latency_us is not None]
    best = min(ok) if ok else None
    task = TaskRow(
        workload_id=workload_id(session, info.workload),
        gpu=info.gpu,
        arch=gpu.arch,
        strategy=IMPORTED_STRATEGY,
        budget=len(results),
        seed=0,
        batch_size=len(results),
        imported_from=storable_source_name(source),
        # What the file said of its measurement, for an export to write back.
        imported_device_name=_device_name(info),
        imported_settings=_settings(info),
        # (The floor its records were judged by: set here, the insert's hook keeps it.)
        latency_floor_us=task_latency_floor(info),
        state=TaskState.DONE,
        batches=1,
        trials_target=len(results),
        trials_enqueued=len(results),
        trials_done=len(results),
        trials_failed=sum(not r.ok for r in results),
        best_trial=None if best is None else best[1],
        best_latency_us=None if best is None else best[0],
        curve=None,  # not a tuning run: kept out of the per-strategy curves
        finished_at=now,
    )
    session.add(task)
    session.flush()
    rows = zip(schedules, results, predicted, finished, strict=True)
    # The database's time as a value: a row of an executemany cannot hold an expression.
    stamp = session.execute(select(now)).scalar_one()
    session.execute(insert(JobRow), [_job(task, i, *row, stamp) for i, row in enumerate(rows)])
    return task.id


def _job(
    task: TaskRow,
    trial: int,
    schedule: Any,
    result: Any,
    predicted_us: Any,
    finished_at: Any,
    now: Any,
) -> dict:
    predicted_us = float(predicted_us)
    return {
        **result_columns(result),
        "task_id": task.id,
        "workload_id": task.workload_id,
        "gpu": task.gpu,
        "arch": task.arch,
        "trial": trial,
        "batch": 0,
        "schedule": schedule.as_dict(),
        "schedule_id": schedule.id,
        "predicted_us": predicted_us if np.isfinite(predicted_us) else None,
        "attempts": 0,
        "finished_at": finished_at,
        # Created no later than it finished: a measured record's own time (the import's
        # time came after it), else now.
        "created_at": finished_at if finished_at is not None else now,
    }
