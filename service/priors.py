"""A task's prior: the trials of a finished task of the same workload on another GPU, or a
cost model learned from every finished, measured task of the same kernel family.

A user who tuned a kernel on one GPU and tunes it on another names the first task
(`TaskCreate.prior_task`): its measurements warm-start the search (tuner/transfer.py), where
it measured; pipetune's analytical model guesses the rest of the space (a task measures a
few dozen of its schedules). Only a finished task qualifies: its trials no longer change, so
every replica that rebuilds the session from the task's record reads the same prior, and the
replay of its batches stays exact.

The learned prior (`TaskCreate.learned_prior`, tuner/learned_prior.py) reads many tasks: other
shapes of the family, on this GPU and others. Which ones is decided once, when the task is
created, and recorded on it (`TaskRow.learned_from`): a replica that rebuilds the session
fits the same model (XGBoost on one thread, bit-for-bit) on the same finished trials, however
many tasks have finished since.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, and_, case, func, not_, or_, select

from pipetune.model.errors import PipetuneError
from pipetune.model.family import (
    FIRST_REVISION,
    THROUGHPUT_UNITS,
    FamilySpace,
    family_of,
    parse_any_workload,
)
from pipetune.model.hardware import get_gpu
from pipetune.model.states import FINAL_TASK_STATES, TaskState
from pipetune.model.trials import LATENCY_US_RANGE, MEASURED_RUNNERS
from pipetune.service.orm import JobRow, TaskRow, WorkloadRow
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.learned_prior import (
    LearnedModel,
    LearnedPriorError,
    fit_learned_model,
    measured_shapes,
    prior_from,
)
from pipetune.tuner.offline import RecordedSpace
from pipetune.tuner.recorded import RecordedConfigs
from pipetune.tuner.strategies import STRATEGY_MAP
from pipetune.tuner.transfer import TransferError, recorded_prior


class PriorError(PipetuneError, ValueError):
    """A `prior_task` that cannot be this task's prior; the message says why."""


def strategies_with_prior() -> list[str]:
    return [name for name, spec in STRATEGY_MAP.items() if spec.uses_prior]


def check_strategy(strategy: str) -> None:
    if not STRATEGY_MAP[strategy].uses_prior:
        raise PriorError(
            f"strategy '{strategy}' takes no prior (these do: {', '.join(strategies_with_prior())})"
        )


def _not_measured() -> Any:
    """A job whose result was not measured on a GPU, in SQL (not model.trials.is_measured):
    simulated, several runners ("cupy,simulated" from an export of a mixed task), none or
    an unknown one ("unknown" after an export and import of a task without one)."""
    return or_(JobRow.runner.is_(None), JobRow.runner.not_in(MEASURED_RUNNERS))


def _simulated_results(task: Any) -> Any:
    """Whether task `task` (a task id or a correlated TaskRow.id) has a successful result
    that was not measured on a GPU."""
    return (
        select(JobRow.id)
        .where(JobRow.task_id == task, JobRow.status == "ok", _not_measured())
        .exists()
    )


def element_twins(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two workload documents are one operator shape in two element types (float16
    and bfloat16): their kernels are the same but for the type words, and run at one rate on
    the tensor cores and the memory system alike, so one's measurements are the other's best
    prior on the same GPU too."""

    def shape(doc: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in doc.items() if k != "dtype"}

    return shape(a) == shape(b) and a.get("dtype", "float16") != b.get("dtype", "float16")


def check_prior_task(
    conn: Connection,
    prior_task: int,
    workload: Any,
    gpu: str,
    measured_only: bool = False,
) -> None:
    """Raise PriorError unless `prior_task` is a finished task with at least one successful
    trial, of this workload on another GPU or of its element-type twin (element_twins) on any
    GPU; with `measured_only` (a task that takes GPU measurements only), all of them measured
    on a GPU: a prior of simulated trials would steer a measured search by the analytical
    model's own numbers, unsaid."""
    row = conn.execute(
        select(
            TaskRow.state, TaskRow.gpu, WorkloadRow.hash, WorkloadRow.label, WorkloadRow.canonical
        )
        .join(WorkloadRow, TaskRow.workload_id == WorkloadRow.id)
        .where(TaskRow.id == prior_task)
    ).first()
    if row is None:
        raise PriorError(f"task {prior_task} does not exist")
    if not TaskState(row.state).is_final():
        raise PriorError(
            f"task {prior_task} is {row.state}: a prior must be a finished task "
            "(its trials must not change while this one replays them)"
        )
    twin = element_twins(dict(row.canonical), workload.canonical())
    if row.hash != workload.workload_hash and not twin:
        raise PriorError(f"task {prior_task} tuned another workload ({row.label})")
    if row.gpu == gpu and not twin:
        raise PriorError(
            f"task {prior_task} ran on {gpu} too: a prior is the same workload measured on "
            "another GPU, or its twin in the other element type (to search further on this "
            "one, give a larger budget)"
        )
    succeeded = conn.scalar(
        select(JobRow.id).where(JobRow.task_id == prior_task, JobRow.status == "ok").limit(1)
    )
    if succeeded is None:
        raise PriorError(f"task {prior_task} has no successful trial to learn from")
    if measured_only and conn.scalar(select(_simulated_results(prior_task))):
        raise PriorError(
            f"task {prior_task}'s trials were not all measured on a GPU (simulated): a task "
            "of GPU measurements only (runner cupy) warm-starts from measurements only"
        )


def prior_task_on(
    conn: Connection, workload_hash: str, prior_gpu: str, gpu: str, measured_only: bool = False
) -> int:
    """The finished task of this workload on `prior_gpu` whose successful trials were
    measured on a GPU (with `measured_only`, only those: a task that takes GPU measurements
    only), then whose successful trials are of the newest generator revision, of those the one
    with the most successful trials, the newest of those (`TaskCreate.prior_gpu`); PriorError
    when none has one. Measured first: a simulated sweep holds the analytical model's own
    numbers, which the task's prior already is. The newest revision
    first: an older one's timings are of kernels that no longer exist (a sweep repeated
    after a change of the generator is the prior, not the sweep before it, whichever has
    more trials). Then the most measurements: a prior from more of the other GPU's trials
    warm-starts better (benchmarks/RESULTS.md, "a finished task's trials as the prior": 20
    < 50 < 100 trials < the whole recording), so an imported sweep is preferred to a short
    task."""
    if prior_gpu == gpu:
        raise PriorError(
            f"{gpu} is this task's GPU: a prior is the same workload measured on another GPU"
        )
    succeeded = TaskRow.trials_done - TaskRow.trials_failed  # (lost jobs count as failed)
    # (One workload: all its tasks' trials are of one generator line. 0 where no trial says
    # ok: NULL sorts first in PostgreSQL's descending order and last in SQLite's.)
    newest_revision = func.coalesce(
        select(func.max(func.coalesce(JobRow.generator_revision, FIRST_REVISION)))
        .where(JobRow.task_id == TaskRow.id, JobRow.status == "ok")
        .scalar_subquery(),
        0,
    )
    simulated = _simulated_results(TaskRow.id)
    query = (
        select(TaskRow.id)
        .join(WorkloadRow, TaskRow.workload_id == WorkloadRow.id)
        .where(
            WorkloadRow.hash == workload_hash,
            TaskRow.gpu == prior_gpu,
            TaskRow.state.in_(FINAL_TASK_STATES),
            succeeded > 0,
        )
        .order_by(
            case((simulated, 1), else_=0),
            newest_revision.desc(),
            succeeded.desc(),
            TaskRow.id.desc(),
        )
        .limit(1)
    )
    found = conn.scalar(query.where(not_(simulated)) if measured_only else query)
    if found is None:
        measured = " measured on a GPU" if measured_only else ""
        raise PriorError(
            f"no finished task of this workload on {prior_gpu} with a successful trial"
            f"{measured} (tune it there first, or import a dataset of it: pipetune db "
            "import-dataset)"
        )
    return found


def prior_from_task(conn: Connection, prior_task: int, space: FamilySpace) -> PriorMean:
    """The prior over `space`'s rows from the measured trials of `prior_task` (checked by
    check_prior_task when the task was created)."""
    gpu = conn.scalar(select(TaskRow.gpu).where(TaskRow.id == prior_task))
    if gpu is None:
        raise PriorError(f"task {prior_task} does not exist")
    schedules, latency_s, _ = _finished_trials(conn, prior_task)
    knobs = family_of(space.workload).knobs
    names = [k.name for k in knobs]
    recorded = RecordedConfigs(
        name=f"task {prior_task} on {gpu}",
        tune_params={k.name: list(k.values) for k in knobs},
        configs=[{k: s[k] for k in names} for s in schedules],
        objective_ms=latency_s * 1e3,
    )
    columns = [space.knobs[k].tolist() for k in names]
    rows_here = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    try:
        return recorded_prior(recorded, rows_here, names, sampled=True)
    except TransferError as exc:
        raise PriorError(str(exc)) from None


# The most tasks a learned prior reads: the ones with the most successful trials it can learn
# from (then the newest). An exhaustive sweep of a few thousand schedules is one task, and a
# hundred of them fit in about two seconds of one core (XGBoost, benchmarks/RESULTS.md); a
# fleet's thousands of short tasks would add little that the largest ones do not already teach.
MAX_LEARNED_TASKS = 100


@dataclass(frozen=True)
class _RevisionCount:
    revision: int
    ok: int  # successful trials of that generator revision
    simulated: bool  # a result of the task (of any status) not measured on a GPU


class TaskSummaries:
    """What `learned_tasks` reads of a finished task's jobs: per generator revision, its
    successes and whether a result was not measured on a GPU. Kept once read (a finished
    task's jobs never change): reading every job of every finished task took 1.0-1.2 s a call
    at 2.25 M jobs (PostgreSQL and SQLite alike), on every task created with a default
    strategy and every schedule lookup of a new shape; now a call reads only the tasks
    finished since the last. One per Driver (per database); bounded."""

    MAX_TASKS = 200_000
    CHUNK = 500  # more tasks to read than this: all finished tasks in one pass

    def __init__(self) -> None:
        self._by_task: dict[int, tuple[_RevisionCount, ...]] = {}
        self._lock = threading.Lock()

    def of(self, conn: Connection, task_ids: list[int]) -> dict[int, tuple[_RevisionCount, ...]]:
        """The summaries of finished tasks (a task without a result has none: left out)."""
        with self._lock:
            known = {t: self._by_task[t] for t in task_ids if t in self._by_task}
        missing = [t for t in task_ids if t not in known]
        if missing:
            known.update(self._read(conn, missing))
        return {t: known[t] for t in task_ids if known[t]}

    def _read(self, conn: Connection, missing: list[int]) -> dict[int, tuple[_RevisionCount, ...]]:
        """The summaries of `missing` (finished tasks), read and kept."""
        # Lost jobs (no status) measured nothing and are not asked.
        revision = func.coalesce(JobRow.generator_revision, FIRST_REVISION)
        read: dict[int, list[_RevisionCount]] = {t: [] for t in missing}
        summary = select(
            JobRow.task_id,
            revision.label("revision"),
            func.count().filter(JobRow.status == "ok").label("ok"),
            func.max(case((_not_measured(), 1), else_=0)).label("simulated"),
        ).where(JobRow.status.is_not(None))
        if len(missing) > self.CHUNK:
            # Many (the first call of a replica): one pass over every finished task's jobs
            # is cheaper than looking them up task by task (1.0 against 1.8 s at 2.25 M
            # jobs), and every finished task is kept (they never change).
            summary = summary.join(TaskRow, TaskRow.id == JobRow.task_id).where(
                TaskRow.state.in_(FINAL_TASK_STATES)
            )
        else:
            summary = summary.where(JobRow.task_id.in_(missing))
        for r in conn.execute(summary.group_by(JobRow.task_id, revision)):
            read.setdefault(r.task_id, []).append(
                _RevisionCount(r.revision, r.ok, bool(r.simulated))
            )
        kept = {task: tuple(counts) for task, counts in read.items()}
        with self._lock:
            if len(self._by_task) + len(kept) > self.MAX_TASKS:
                self._by_task.clear()
            self._by_task.update(kept)
        return kept


def learned_tasks(
    conn: Connection, workload: Any, gpu: str, summaries: TaskSummaries | None = None
) -> list[int]:
    """The tasks a learned prior for `workload` on `gpu` reads, in id order: finished tasks
    of the same kernel family with a successful trial, every result of which was measured on
    a GPU (no simulated or replayed-simulated runner, which would teach the analytical model
    back to itself), other than this workload on this GPU (its own record is its answer, not
    a prior). Of the workload's own generator line, only tasks with a successful trial of the
    newest revision measured count, and only those trials rank them: the prior leaves the
    older revisions out (tuner.learned_prior.current_measurements), and a task of kernels that
    no longer exist must not take a place of the MAX_LEARNED_TASKS from one it can learn
    from. PriorError when there is none. `summaries`: the finished tasks' summaries kept
    from earlier calls (none: read them all)."""
    fam = family_of(workload)
    target = fam.op_generator_revision(workload.op)
    line_ops = fam.line_ops(target.line)
    succeeded = TaskRow.trials_done - TaskRow.trials_failed
    candidates = conn.execute(
        select(TaskRow.id, WorkloadRow.op, succeeded.label("succeeded"))
        .join(WorkloadRow, TaskRow.workload_id == WorkloadRow.id)
        .where(
            WorkloadRow.op.in_(sorted(fam.ops)),
            TaskRow.state.in_(FINAL_TASK_STATES),
            succeeded > 0,
            not_(and_(WorkloadRow.hash == workload.workload_hash, TaskRow.gpu == gpu)),
        )
    ).all()
    counts = (summaries or TaskSummaries()).of(conn, [c.id for c in candidates])
    # Tasks with a result not measured on a GPU are left out whole.
    measured = [
        c for c in candidates if c.id in counts and not any(r.simulated for r in counts[c.id])
    ]
    newest = max(
        (r.revision for c in measured if c.op in line_ops for r in counts[c.id]), default=None
    )
    learnable: dict[int, int] = {}
    for c in measured:
        if c.op in line_ops:
            learnable[c.id] = sum(r.ok for r in counts[c.id] if r.revision == newest)
        else:
            learnable[c.id] = c.succeeded
    ranked = sorted(((n, task) for task, n in learnable.items() if n > 0), reverse=True)
    found = [task for _, task in ranked[:MAX_LEARNED_TASKS]]
    if not found:
        raise PriorError(
            f"no finished task of the {fam.name} family measured on a GPU to learn from (tune "
            "other shapes first, or import measured datasets: pipetune db import-dataset)"
        )
    return sorted(found)


# The fewest distinct measured shapes (workloads) a learned prior is taken from when nobody
# asked for one (`TaskCreate.learned_prior` left out, and POST /v1/schedules' pick). A model
# of one to four shapes learns those shapes' quirks, not how schedules rank in general:
# learned from k random H100 GEMM shapes and tried on the 23 H200 ones (`auto`, 3 seeds),
# best-in-8 fell from the analytical prior's 0.959 to 0.77-0.92 with k = 1, 2 or 4, was level
# with k = 8 (0.950-0.962; 0.986-0.992 against 0.983 at 32 trials) and ahead with all 23
# (0.967 / 0.985 / 0.994 at 8 / 16 / 32; benchmarks/RESULTS.md, "a learned prior of too few
# shapes"). Asked for, a learned prior is taken from any corpus.
MIN_DEFAULT_SHAPES = 8


def default_learned_tasks(
    conn: Connection, workload: Any, gpu: str, summaries: TaskSummaries | None = None
) -> list[int]:
    """`learned_tasks`, where they hold at least MIN_DEFAULT_SHAPES distinct workloads:
    what a task learns from when it said nothing of a learned prior. PriorError otherwise."""
    found = learned_tasks(conn, workload, gpu, summaries)
    shapes = conn.scalar(
        select(func.count(func.distinct(TaskRow.workload_id))).where(TaskRow.id.in_(found))
    )
    if (shapes or 0) < MIN_DEFAULT_SHAPES:
        raise PriorError(
            f"{measured_shapes(shapes or 0)} of the {family_of(workload).name} family to learn "
            f"from: a learned prior is taken by default from {MIN_DEFAULT_SHAPES} or more (ask "
            "for one to learn from fewer)"
        )
    return found


def measured_space(conn: Connection, task_id: int) -> RecordedSpace:
    """A finished task's trials as a recorded space: the schedules it measured (its own
    space's subset, in trial order) and their latencies (inf where a trial failed)."""
    head = conn.execute(
        select(TaskRow.gpu, WorkloadRow.canonical)
        .join(WorkloadRow, TaskRow.workload_id == WorkloadRow.id)
        .where(TaskRow.id == task_id)
    ).first()
    if head is None:
        raise PriorError(f"task {task_id} does not exist")
    workload = parse_any_workload(head.canonical)
    fam = family_of(workload)
    schedules, latency_s, revisions = _finished_trials(conn, task_id)
    knobs = {k: np.array([s[k] for s in schedules], dtype=np.int64) for k in fam.knob_names}
    return RecordedSpace(fam.space_of(workload, get_gpu(head.gpu), knobs), latency_s, revisions)


def _finished_trials(
    conn: Connection, task_id: int
) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """A task's trials with a result, in trial order: their schedules, latencies in seconds
    (inf where the trial failed) and generator revisions (FIRST_REVISION where not said)."""
    rows = conn.execute(
        select(JobRow.schedule, JobRow.status, JobRow.latency_us, JobRow.generator_revision)
        .where(JobRow.task_id == task_id, JobRow.status.is_not(None))
        .order_by(JobRow.trial)
    ).all()
    # (A time outside what a kernel can take, stored before results were checked for it,
    # counts as a failure: one such row made every cost model fitted to it fail.)
    low, high = LATENCY_US_RANGE
    ok = [
        r.status == "ok" and r.latency_us is not None and low <= r.latency_us <= high for r in rows
    ]
    latency_s = np.array(
        [r.latency_us / 1e6 if good else np.inf for r, good in zip(rows, ok, strict=True)],
        dtype=np.float64,
    )
    revisions = np.array(
        [FIRST_REVISION if r.generator_revision is None else r.generator_revision for r in rows],
        dtype=np.int64,
    )
    return [r.schedule for r in rows], latency_s, revisions


def learned_model_of_tasks(conn: Connection, task_ids: list[int], line: str) -> LearnedModel:
    """The cost model fitted to the finished trials of `task_ids` (chosen by learned_tasks
    when a task was created: of one family, without that task's own workload on its GPU) for
    the spaces of generator line `line` (without that line's older revisions)."""
    corpus = [measured_space(conn, t) for t in task_ids]
    try:
        return fit_learned_model(corpus, line=line)
    except LearnedPriorError as exc:
        raise PriorError(str(exc)) from None


def prior_from_tasks(task_ids: list[int], learned: LearnedModel, space: FamilySpace) -> PriorMean:
    """The learned prior over `space` from the model of `task_ids`' trials (as
    tuner.learned_prior.learned_prior gives it from the same trials)."""
    try:
        prior = prior_from(space, learned)
    except LearnedPriorError as exc:
        raise PriorError(str(exc)) from None
    return PriorMean(values=prior.values, source=f"{prior.source} (tasks {_ids(task_ids)})")


@dataclass(frozen=True)
class LearnedPick:
    """The best schedule of a space by a learned prior (its highest predicted throughput),
    for a workload nothing measured yet (POST /v1/schedules' `source: model`)."""

    schedule: Any
    predicted_us: float
    learned_from: tuple[int, ...]


def learned_pick(
    conn: Connection,
    workload: Any,
    gpu: str,
    space_of: Callable[[], FamilySpace],
    prior_of: Callable[[tuple[int, ...], FamilySpace], PriorMean],
    excluding: frozenset[str] = frozenset(),
    summaries: TaskSummaries | None = None,
) -> LearnedPick | None:
    """Where the workload's family learns by default and measured tasks to learn from exist,
    the pick of the prior they teach (`prior_of(task ids, space)` over the workload's space,
    `space_of()`, built only then: a lookup with nothing to learn from costs one query),
    other than the schedules of `excluding` (ids seen to fail on the GPU); else None (the
    analytical model's pick stands). On the campaigns' measured GEMM spaces, each shape
    unseen, its pick reaches 0.946 / 0.933 of the optimum (H100 / H200) where the analytical
    model's reaches 0.849 / 0.888 (benchmarks/RESULTS.md, "the learned prior ranks within a
    shape")."""
    fam = family_of(workload)
    if not fam.learns_by_default:
        return None
    try:
        task_ids = tuple(default_learned_tasks(conn, workload, gpu, summaries))
        space = space_of()
        if len(space) == 0:
            return None
        prior = prior_of(task_ids, space)
    except PriorError:
        return None
    values = prior.values
    if excluding:
        failed = np.isin(np.asarray(space.ids), list(excluding))
        if failed.all():
            return None  # the analytical model's pick says why there is none
        values = np.where(failed, -np.inf, values)
    best = int(np.argmax(values))  # ties: the first row, as the model's ranking
    scale = THROUGHPUT_UNITS[fam.work_unit][1]
    # The prior is log throughput in the family's unit: latency = work / throughput.
    predicted_us = float(space.work / (np.exp(prior.values[best]) * scale) * 1e6)
    low, high = LATENCY_US_RANGE
    if not low <= predicted_us <= high:
        # A prior fitted on implausible measurements (all accepted, at the range's ends)
        # predicted 7e-10 µs: a time no measurement may have is no answer; the analytical
        # model's pick stands.
        return None
    return LearnedPick(space[best], predicted_us, task_ids)


def _ids(task_ids: list[int]) -> str:
    shown = ", ".join(map(str, task_ids[:8]))
    return shown + (f" and {len(task_ids) - 8} more" if len(task_ids) > 8 else "")
