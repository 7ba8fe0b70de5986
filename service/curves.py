"""Best-so-far curves: one task's, and best-in-k-trials aggregated over tasks (ALCOP Fig. 13).

A task's curve covers the prefix of its trials that are all final (a trial still running
would change the points after it); failed and lost trials count as trials that found
nothing, and a cancelled job is no trial: it is left out, and the trials after it are counted
on (a cancelled task's jobs that were measured before the cancel are its trials, as its
`trials_done` and best count them; its curve stopped at the first cancelled job, its best
trial left out). A point's `trial` is its place among the counted trials (0-based): the
trial's number wherever no job was cancelled before it.

The aggregate reads each task's stored curve (written at every batch boundary, and when the
task ends), not its trials, so it costs O(tasks) rows however many trials the database
holds. best-in-k of a task = best-known latency of the workload / best latency of the task's
first k trials (a throughput ratio, 0 before a success); the best known latency is the
exhaustive sweep's (reference_optima) where one was imported, else the best any task
measured. Mean over the tasks of a workload (seeds), geometric mean over workloads, per
strategy. A task done before k trials (its budget, its whole space, its target) counts at
k as it ended, as `pipetune bench tuner` counts a shorter run; a running, cancelled or
failed task counts up to the trials it has. (Counting only the tasks that reached k, the
curve fell where a task with a smaller budget stopped counting, though nobody's best got
worse.)
Simulated and measured tasks are normalised apart, each to the best known of its own kind
(`_best_known`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased

from pipetune.model.family import family_for_op
from pipetune.model.states import JobState, TaskState
from pipetune.model.trials import RunnerKind, is_simulated, runner_kind_shown
from pipetune.model.wire import TFLOPS, AggregatePoint, Curve, CurvePoint
from pipetune.service.best_curve import best_latencies, counted_trials
from pipetune.service.orm import JobRow, ReferenceOptimumRow, TaskRow, WorkloadRow


def task_curve(session: Session, task_id: int, op: str, work: int, after: int) -> Curve:
    """The task's best-so-far latency and throughput (in the op's family's unit: ``work``
    is its workload row's) per trial index, over the trials that are final."""
    fam = family_for_op(op)
    rows = session.execute(
        select(JobRow.state, JobRow.latency_us, JobRow.runner)
        .where(JobRow.task_id == task_id)
        .order_by(JobRow.trial)
    ).all()
    points: list[CurvePoint] = []
    best: float | None = None
    runners: set[str] = set()
    # trial: the place among the counted trials
    for trial, (state, latency, runner) in enumerate(counted_trials(rows)):
        if (kind := runner_kind_shown(runner)) is not None:
            runners.add(kind)
        if state == JobState.DONE and latency is not None and (best is None or latency < best):
            best = latency
        if trial > after:
            rate = None if best is None else fam.rate(work, best)
            points.append(
                CurvePoint(
                    trial=trial,
                    best_latency_us=best,
                    best_throughput=rate,
                    best_tflops=rate if fam.throughput_unit == TFLOPS else None,
                )
            )
    return Curve(points=points, throughput_unit=fam.throughput_unit, runners=sorted(runners))


_BestJob = aliased(JobRow, name="best_job")


_StrategyTask = aliased(TaskRow, name="strategy_task")


def _best_known(
    session: Session, gpu: str | None = None, op: str | None = None, strategy: str | None = None
) -> dict[tuple[int, str, bool], float]:
    """The best latency known of each workload on each GPU, for simulated tasks and for
    measured ones apart (the key's last part: simulated): a simulated latency is the
    analytical model's, and as the yardstick of measured tasks it capped their curves at
    whatever the model's error made them (and the other way round). A task's kind is its
    best trial's runner's (`is_simulated`); an imported optimum's its sweep's runner's, and
    one whose runner was not recorded is every kind's.

    Only of the pairs an aggregate of `gpu`, `op` and `strategy` reads (the workloads that
    strategy's tasks tuned; a pair's yardstick is still every task's of it, whatever its
    strategy): a filtered aggregate read every task of the database for its yardsticks, 137
    ms at 10,000 tasks where its own tasks took 14."""
    best: dict[tuple[int, str, bool], float] = {}

    def offer(workload_id: int, gpu: str, simulated: bool, latency: float) -> None:
        key = (workload_id, gpu, simulated)
        best[key] = min(latency, best.get(key, latency))

    tasks = (
        select(TaskRow.workload_id, TaskRow.gpu, TaskRow.best_latency_us, _BestJob.runner)
        .outerjoin(
            _BestJob, and_(_BestJob.task_id == TaskRow.id, _BestJob.trial == TaskRow.best_trial)
        )
        .where(TaskRow.best_latency_us.is_not(None))
    )
    reference = select(
        ReferenceOptimumRow.workload_id,
        ReferenceOptimumRow.gpu,
        ReferenceOptimumRow.best_latency_us,
        ReferenceOptimumRow.runner,
    )
    if gpu is not None:
        tasks = tasks.where(TaskRow.gpu == gpu)
        reference = reference.where(ReferenceOptimumRow.gpu == gpu)
    workloads = []
    if op is not None:
        workloads.append(select(WorkloadRow.id).where(WorkloadRow.op == op))
    if strategy is not None:
        workloads.append(
            select(_StrategyTask.workload_id).where(_StrategyTask.strategy == strategy)
        )
    for ids in workloads:
        tasks = tasks.where(TaskRow.workload_id.in_(ids))
        reference = reference.where(ReferenceOptimumRow.workload_id.in_(ids))
    for workload_id, task_gpu, latency, runner in session.execute(tasks):
        offer(workload_id, task_gpu, is_simulated(runner), latency)
    for workload_id, sweep_gpu, latency, runner in session.execute(reference):
        kinds = (False, True) if runner is None else (is_simulated(runner),)
        for simulated in kinds:
            offer(workload_id, sweep_gpu, simulated, latency)
    return best


def _geomean_rows(matrix: np.ndarray) -> np.ndarray:
    """Geometric mean of each column over the rows that are not NaN (0 if any is 0)."""
    # (Imported here: scipy.stats is half a second of every service start, and only the
    # aggregate curves use it.)
    from scipy.stats import gmean

    present = ~np.isnan(matrix)
    # A missing row weighs nothing; a 0 (no success yet) makes the mean 0, as it should.
    with np.errstate(divide="ignore"):
        return gmean(np.where(present, matrix, 1.0), axis=0, weights=present.astype(float))


def aggregate(
    session: Session, gpu: str | None, op: str | None, strategy: str | None, max_k: int
) -> tuple[dict[str, list[AggregatePoint]], list[str]]:
    """(strategy -> best-in-k points, the runner kinds of the tasks' best trials, and
    "simulated" where a simulated runner answered any trial of a task)."""
    query = (
        select(
            TaskRow.strategy,
            TaskRow.workload_id,
            TaskRow.gpu,
            TaskRow.curve,
            _BestJob.runner,
            TaskRow.state,
        )
        .join(WorkloadRow, WorkloadRow.id == TaskRow.workload_id)
        # One indexed row per task (jobs by task and trial): the aggregate stays O(tasks).
        .outerjoin(
            _BestJob, and_(_BestJob.task_id == TaskRow.id, _BestJob.trial == TaskRow.best_trial)
        )
        .where(TaskRow.curve.is_not(None))
    )
    if gpu is not None:
        query = query.where(TaskRow.gpu == gpu)
    if op is not None:
        query = query.where(WorkloadRow.op == op)
    if strategy is not None:
        query = query.where(TaskRow.strategy == strategy)
    best = _best_known(session, gpu, op, strategy)
    # strategy -> (workload, gpu) -> [(normalised best-in-k array, ended), one per task]
    groups: dict[str, dict[tuple[int, str], list[tuple[np.ndarray, bool]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    runners: set[str] = set()
    for name, workload_id, task_gpu, curve, runner, state in session.execute(query):
        optimum = best.get((workload_id, task_gpu, is_simulated(runner)))
        latency = best_latencies(curve, max_k)
        if optimum is None and not np.isfinite(latency).any():
            # No successful trial, so no best trial to say the task's kind (read as measured):
            # its best-in-k is 0 at every k against either kind's best known. Left out, a
            # simulated task whose every trial failed raised its strategy's curve.
            optimum = best.get((workload_id, task_gpu, not is_simulated(runner)))
        if not latency.size or optimum is None:
            continue
        kind = runner_kind_shown(runner)
        if kind is not None:
            runners.add(kind)
        if isinstance(curve, dict) and curve.get("simulated"):
            # Its best trial measured, earlier bests of its curve simulated: said too.
            runners.add(RunnerKind.SIMULATED.value)
        # A task done before k (its budget, its whole space, its target) ran as far as it
        # was to: it counts at k as it ended. Not a cancelled or failed one: a user's cancel
        # or a failure is no result of the strategy's past the trials it ran (a task
        # cancelled after one failed trial made its strategy's curve 0 at every k).
        ended = state == TaskState.DONE
        groups[name][(workload_id, task_gpu)].append((optimum / latency, ended))
    curves: dict[str, list[AggregatePoint]] = {}
    for name, by_workload in sorted(groups.items()):
        length = max(len(a) for arrays in by_workload.values() for a, _ in arrays)
        per_workload = np.full((len(by_workload), length), np.nan)
        tasks = np.zeros(length, dtype=int)
        for row, arrays in enumerate(by_workload.values()):
            padded = np.full((len(arrays), length), np.nan)
            for i, (a, ended) in enumerate(arrays):
                padded[i, : len(a)] = a
                if ended:  # as it ended, at every k past its last trial
                    padded[i, len(a) :] = a[-1]
            reached = (~np.isnan(padded)).sum(axis=0)
            tasks += reached
            mean = np.nansum(padded, axis=0) / np.maximum(reached, 1)
            per_workload[row] = np.where(reached > 0, mean, np.nan)
        values = _geomean_rows(per_workload)
        curves[name] = [
            AggregatePoint(k=k + 1, best_in_k=float(values[k]), tasks=int(tasks[k]))
            for k in range(length)
        ]
    return curves, sorted(runners)
