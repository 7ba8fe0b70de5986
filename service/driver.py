"""The task driver: a task's proposals, batch by batch, reproducible by any replica.

A task is (workload, GPU, strategy, seed, budget). Creating it proposes the first batch in
the same transaction that writes the task. When the batches it waits on are complete (each
job has its result or was lost), `advance` brings the TuningSession up to date, observes
those batches and enqueues the next, or marks the task done at its budget or when the space
is exhausted.

Proposing ahead: a strategy whose proposals do not depend on the measurements
(`PROPOSE_AHEAD`: grid, random, analytical) keeps two batches enqueued, so that its workers
never wait for the next proposal: batch b+1 is proposed when batch b-1 is complete, while
batch b is being measured. What it proposes is exactly what it would propose one batch
later (only the set of schedules already chosen matters to it, and that is the same), so
the tuning is the same.

Early proposals: a model-guided strategy that believes trials it has not seen measured at its
own predictions (tuner/bo.py; `StrategySpec.proposes_early`) may propose its next batch once
at most PIPETUNE_PROPOSE_EARLY of a batch (off by default; a quarter: two of eight) is still
being measured, so workers do not wait on a batch's slowest trials or on the proposal
itself. Which results a proposal saw depends on when it ran, so it is recorded where it
differs from the rule of whole batches (`first_seen_by`): a job left unmeasured by the
proposal its batch's results would have gone to is marked, and a result seen later names
the batch that saw it (written with that batch, in the same statement); a replay observes
every result exactly there. Without early proposals nothing is written. Offline, `pipetune
bench tuner --early 2` runs the same rule (benchmarks/RESULTS.md, "early proposals", has
what it costs and gains).

Nothing lives only in memory: every proposed schedule is a job row with its batch number
(and where it differs from the rule, the batch that first saw its result), so any replica
rebuilds the session by replaying the task's batches through the session's propose/observe
calls in the order they were made (each batch is checked to replay identically). Sessions
are cached per process: the usual advance observes one batch; a replica whose cached session
is behind (another replica advanced the task meanwhile) rolls it forward through the batches
it missed instead of rebuilding it, so a model is refit once per batch, not once per batch
of the whole history. Two replicas advancing the same task race on a compare-and-set of
`tasks.batches`: the loser's batch is never written. Each new batch is announced to the
waiting lease requests (service/wakeup.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import Connection, case, func, insert, literal, select, update
from sqlalchemy import exc as sa_exc

from pipetune.model.errors import PipetuneError
from pipetune.model.family import (
    FamilySpace,
    KernelFamily,
    family_of,
    generator_revision_of,
    parse_any_workload,
)
from pipetune.model.hardware import get_gpu
from pipetune.model.states import (
    ACTIVE_TASK_STATES,
    OUTSTANDING_JOB_STATES,
    JobState,
    LeaseOutcome,
    TaskState,
)
from pipetune.model.trials import MeasureResult, RunnerKind, is_simulated
from pipetune.model.wire import TaskCreate
from pipetune.service import fair_share
from pipetune.service.best_curve import BestCurve, counted_trials
from pipetune.service.db import Database, json_param, sql_names
from pipetune.service.errors import ConflictError, InputError, NotFoundError
from pipetune.service.metrics import Metrics
from pipetune.service.orm import JobRow, LeaseRow, TaskRow, WorkloadRow
from pipetune.service.priors import (
    LearnedPick,
    PriorError,
    TaskSummaries,
    check_prior_task,
    check_strategy,
    default_learned_tasks,
    learned_model_of_tasks,
    learned_pick,
    learned_tasks,
    prior_from_task,
    prior_from_tasks,
    prior_task_on,
)
from pipetune.service.records import workload_id
from pipetune.service.settings import Settings
from pipetune.service.wakeup import CHANNEL, Wakeup, notify_replicas
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.learned_prior import LearnedModel
from pipetune.tuner.offline import late_trials
from pipetune.tuner.session import SessionError, TuningSession
from pipetune.tuner.strategies import STRATEGY_MAP

log = logging.getLogger(__name__)

MAX_LIVE_SESSIONS = 512
# Parsed workloads by id, cleared when full (one parse and one read each to refill), as the
# queue's (service/queue.WORKLOAD_CACHE_SIZE).
MAX_WORKLOADS = 10_000
MAX_SPACES = 128
LOOKUP_TTL_S = 30.0  # how long a schedule lookup's learned pick is kept (Driver.learned_pick)
MAX_PARSED = 1 << 14  # about 10 MB at most; a replica's live batches need far fewer
JOBS, TASKS = JobRow.__table__, TaskRow.__table__

# Strategies whose next batch depends only on which schedules were already chosen, never on
# their measurements (tests/test_service_pipeline.py checks it of each): they propose ahead.
PROPOSE_AHEAD = frozenset({"grid", "random", "analytical"})
# A cancel that meets a result on a job enqueued while it started starts over (Driver.cancel):
# each such meeting needs a batch committed in that instant, so a second try all but always
# does; the last try waits for its locks like any transaction.
CANCEL_ATTEMPTS = 3
# Errors of a plan that say nothing of the task: the advance is left to be tried again.
UNLIKE_THE_SESSION = (sa_exc.SQLAlchemyError, psycopg.Error, MemoryError)
NOT_SEEN = -1  # jobs.seen_at of a job that the proposal the rule gives it did not see


# A new batch on PostgreSQL, in one statement: the compare-and-set on `batches` (no row when
# another replica advanced the task first: then nothing is inserted), the task's fair-queue
# key moved on and the jobs with theirs (service/fair_share.py), the results
# its proposal saw first (jobs.seen_at), and the NOTIFY that wakes the other replicas'
# waiting lease requests when this commits.
COMMIT_BATCH_SQL = """
WITH {held}cas AS (
    UPDATE tasks SET batches = %(version)s + 1, trials_enqueued = %(enqueued)s,
        curve = CAST(%(curve)s AS json), updated_at = statement_timestamp(),
        fair_key = {fair_key}
    {after_held}WHERE id = %(task)s AND batches = %(version)s AND state IN ({active})
    RETURNING id, workload_id, gpu, arch, only_runner,
        fair_key - %(count)s * {fair_step} AS fair_base, {fair_step} AS fair_step
), added AS (
    INSERT INTO jobs (task_id, workload_id, gpu, arch, trial, batch, schedule, schedule_id,
        predicted_us, only_runner, state, attempts, fair_key)
    SELECT cas.id, cas.workload_id, cas.gpu, cas.arch, j.trial, %(version)s, j.schedule,
        j.schedule_id, j.predicted_us, cas.only_runner, %(queued)s, 0,
        cas.fair_base + (j.trial - %(first)s) * cas.fair_step
    FROM cas, jsonb_to_recordset(CAST(%(jobs)s AS jsonb))
        AS j(trial int, schedule json, schedule_id text, predicted_us float8)
){seen}
SELECT cas.arch, cas.gpu, cas.only_runner, pg_notify(%(channel)s, json_build_object(
    'origin', CAST(%(origin)s AS text), 'arch', cas.arch, 'gpu', cas.gpu,
    'count', CAST(%(count)s AS int), 'runner', cas.only_runner)::text)
FROM cas
"""
# With early proposals, the same and jobs.seen_at: the results this batch saw out of turn,
# and the jobs it left late (NOT_SEEN). Those jobs are locked first, in id order, and the task
# only once they are held (the join with their count makes the task's update wait for it):
# a late job may be getting its result, whose statement holds the job and then locks the task
# (service/queue_pg.py); the other order was a deadlock (tests/test_service_lock_order.py).
COMMIT_SEEN_BATCH_SQL = COMMIT_BATCH_SQL.replace(
    "{held}",
    """held AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE task_id = %(task)s AND trial = ANY(%(seen)s::int[] || %(late)s::int[])
    ORDER BY id FOR UPDATE
), """,
).replace("{after_held}", "FROM (SELECT count(*) FROM held) AS held_first\n    ")
COMMIT_SEEN_BATCH_SQL = COMMIT_SEEN_BATCH_SQL.replace(
    "{seen}",
    """, seen AS (
    UPDATE jobs SET seen_at = CASE WHEN jobs.trial = ANY(%(late)s::int[])
        THEN """
    + str(NOT_SEEN)
    + """ ELSE %(version)s END
    FROM cas WHERE jobs.task_id = cas.id
        AND jobs.trial = ANY(%(seen)s::int[] || %(late)s::int[])
)""",
)
COMMIT_BATCH_SQL = (
    COMMIT_BATCH_SQL.replace("{held}", "").replace("{after_held}", "").replace("{seen}", "")
)
COMMIT_BATCH_SQL, COMMIT_SEEN_BATCH_SQL = (
    sql.replace("{active}", sql_names(ACTIVE_TASK_STATES))
    .replace("{fair_key}", fair_share.key_after_sql("count"))
    .replace("{fair_step}", fair_share.step_sql())
    for sql in (COMMIT_BATCH_SQL, COMMIT_SEEN_BATCH_SQL)
)


READ_TASK_SQL = """
SELECT t.state, t.workload_id, t.gpu, t.strategy, t.seed, t.budget, t.batches,
    t.trials_enqueued, t.trials_target, t.batch_size, t.prior_task, t.learned_from,
    (SELECT count(*) FROM jobs j WHERE j.task_id = t.id AND j.state IN ({outstanding})
        AND j.batch < t.batches - CASE WHEN t.strategy IN ({ahead}) THEN 1 ELSE 0 END
    ) AS older,
    (SELECT count(*) FROM jobs j WHERE j.task_id = t.id AND j.state IN ({outstanding})
    ) AS outstanding
FROM tasks t WHERE t.id = %(task)s
""".replace("{outstanding}", sql_names(OUTSTANDING_JOB_STATES)).replace(
    "{ahead}", sql_names(PROPOSE_AHEAD)
)
# The schedule as its stored text: an advance reads rows it has read before, whose schedule
# it finds by that text (Driver._schedule), and decoding the JSON of each would cost more.
READ_JOBS_SQL = """
SELECT trial, batch, schedule::text AS schedule, state, status, latency_us, error, seen_at,
    runner
FROM jobs
WHERE task_id = %(task)s AND batch >= %(first)s AND batch < %(before)s
ORDER BY trial
"""


def batches_ahead(strategy: str) -> int:
    """Batches a task of this strategy keeps enqueued beyond the one being completed."""
    return 1 if strategy in PROPOSE_AHEAD else 0


def all_enqueued_some_out(enqueued: int, target: int, done: int) -> bool:
    """Whether a task has every trial enqueued and some still out: it has nothing to propose,
    and its last result finishes it. Neither a result's hint (queue.may_advance) nor the
    sweep (Driver.advance_ready) asks to advance it: with a thousand workers holding three
    jobs each, most of 400 tasks were in this state, and each result of them and each sweep
    planned them to find nothing."""
    return enqueued >= target and done < enqueued


def outstanding_allowed(strategy: str, batch_size: int, share: float, batches: int) -> int:
    """Jobs of a task's batches it waits on that may still be outstanding when it proposes
    its next batch (it has `batches`): `share` of a batch for a strategy that believes trials
    it has not seen measured (early proposals), none for the others, and none while the
    first batch is the only one (its results are the model's first data, where each missing
    one weighs most: proposing early there cost 0.009 of best-in-k at k = 20 on the measured
    ALCOP spaces, from the second batch on 0.003; benchmarks/RESULTS.md, "early proposals").
    The rule is tuner/offline.py's `late_trials`, which the offline benchmark runs."""
    spec = STRATEGY_MAP.get(strategy)
    if spec is None or not spec.proposes_early:
        return 0
    return late_trials(batch_size, int(share * batch_size), first=batches < 2, last=False)


@dataclass
class _Live:
    """A session and where it stands in its task's record."""

    session: TuningSession
    predicted_us: np.ndarray  # the model's latency per space row
    sizes: list[int]  # the sizes of the batches it proposed: the task's batches 0..k-1
    observed: int  # batches it observed whole: 0..observed-1
    curve: BestCurve = field(default_factory=BestCurve)  # best so far, in trial order
    # Trial -> the batch before whose proposal the session observed it, for the trials of
    # batches `observed` and later that it observed (a batch proposed early leaves some).
    seen: dict[int, int] = field(default_factory=dict)

    @property
    def trials(self) -> int:
        return sum(self.sizes)


@dataclass
class _Plan:
    """What an advance will write, computed outside any write transaction."""

    task_id: int
    version: int  # tasks.batches when the plan was made
    first_trial: int
    batch: list[Any]  # the family's schedules
    predicted: list[float]
    curve: dict[str, Any]  # the task row's (BestCurve.doc)
    live: _Live | None = None
    error: str | None = None
    # Trials whose results this plan saw out of turn, and the jobs it left late (jobs.seen_at).
    seen: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)


# What _plan returns, instead of a plan, when asked not to adopt a task this replica is
# behind on, and for a task that has ended or does not exist (compared by identity).
BEHIND = _Plan(task_id=-1, version=-1, first_trial=-1, batch=[], predicted=[], curve={})
ENDED = _Plan(task_id=-1, version=-1, first_trial=-1, batch=[], predicted=[], curve={})


@dataclass(frozen=True)
class _JobView:
    """A job as the tuner sees it."""

    trial: int
    batch: int
    schedule: Any  # the family's schedule
    result: MeasureResult | None  # None while it is outstanding
    seen_at: int | None  # jobs.seen_at (first_seen_by reads it)
    runner: str | None = None  # the result's runner (None: none recorded)


def first_seen_by(batch: int, seen_at: int | None, strategy: str) -> int | None:
    """The batch whose proposal first saw a job's result (None: none has yet). By the rule of
    whole batches, the next one (after the batches its strategy proposes ahead); jobs.seen_at
    records where it was otherwise (early proposals): NOT_SEEN for a job that proposal left
    unmeasured, and later the batch that saw it."""
    if seen_at is None:
        return batch + 1 + batches_ahead(strategy)
    return None if seen_at == NOT_SEEN else seen_at


@dataclass(frozen=True)
class _TaskView:
    workload_id: int
    gpu: str
    strategy: str
    seed: int
    budget: int
    version: int
    enqueued: int
    target: int
    batch_size: int
    prior_task: int | None
    learned_from: tuple[int, ...] | None


def _measured_only(body: TaskCreate) -> bool:
    """Whether the task takes GPU measurements only (its runner cupy): its prior must be
    measured too."""
    return body.runner == RunnerKind.CUPY


def _ids(learned_from: list[int] | None) -> tuple[int, ...] | None:
    """The learned_from column (a JSON array) as a cache key."""
    return None if learned_from is None else tuple(learned_from)


def _has_seen(live: _Live, view: _JobView) -> bool:
    """Whether the session observed the job."""
    return view.batch < live.observed or view.trial in live.seen


def _is_current(live: _Live | None, task: _TaskView) -> bool:
    """Whether the session proposed every batch the task has (no other replica advanced it
    since)."""
    return live is not None and len(live.sizes) == task.version and live.trials == task.enqueued


def _observed(job: Any) -> MeasureResult | None:
    """A final job as the tuner sees it: lost and failed jobs are failures (None for a job
    still queued or leased: a batch proposed ahead, not observed yet)."""
    if job.state in OUTSTANDING_JOB_STATES:  # (a StrEnum: its members equal their values)
        return None
    # Validated, not model_construct(): in this pydantic, model_construct() inspects the
    # signature of `samples_us`'s default factory on every call, fifty times the cost.
    if job.state == JobState.LOST:
        return MeasureResult(status="timeout", error=job.error or "lost")
    return MeasureResult(
        status=job.status,
        latency_us=job.latency_us if job.status == "ok" else None,
        error=job.error,
    )


def _by_batch(views: list[_JobView]) -> dict[int, list[_JobView]]:
    batches: dict[int, list[_JobView]] = defaultdict(list)
    for v in views:
        batches[v.batch].append(v)
    return batches


class Driver:
    def __init__(
        self, db: Database, settings: Settings, metrics: Metrics, wakeup: Wakeup | None = None
    ):
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.wakeup = wakeup
        # Bounded: a replica that stops driving a task (another one finished it) must not
        # keep its session forever.
        self._live: OrderedDict[int, _Live] = OrderedDict()
        self._live_lock = threading.Lock()
        self._advancing: set[int] = set()  # tasks an advance of this replica is planning
        # Tasks that ended (a cancel) while an advance of them was out with their session:
        # that advance must not put the session back (_keep_live). It did, and a cancelled
        # task's session (0.6 MB) stayed until MAX_LIVE_SESSIONS pushed it out.
        self._ended: set[int] = set()
        self._task_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)
        # Spaces and the model's predictions over them, by (workload hash, GPU): computed
        # once per space, shared by every session of that workload on that GPU.
        self._spaces: OrderedDict[tuple[str, str], tuple[FamilySpace, np.ndarray]] = OrderedDict()
        self._spaces_lock = threading.Lock()  # guards _priors too (Driver._cached)
        # One build at a time of each missing entry (Driver._cached): the proposer's threads
        # starting tasks of one workload on one GPU at once each enumerated the space (up to
        # about 0.8 GB for the largest), and kept one copy.
        self._building: dict[tuple[int, Any], threading.Lock] = {}
        # Priors by (where from, workload hash, GPU): a task id, or the learned-from ids.
        self._priors: OrderedDict[tuple[Any, str, str], PriorMean] = OrderedDict()
        # A learned prior's cost model by the tasks it learned from: the tasks created while
        # none of those changes (a network's shapes, queued at once) share one fit.
        self._learned_models: OrderedDict[tuple[tuple[int, ...], str], LearnedModel] = OrderedDict()
        # POST /v1/schedules' learned picks, each with when it expires (learned_pick).
        self._picks: OrderedDict[tuple[str, str], tuple[float, LearnedPick | None]] = OrderedDict()
        # What finding the tasks to learn from reads of each finished task (priors.py).
        self._summaries = TaskSummaries()
        self._workloads: dict[int, Any] = {}
        # Schedules read back from job rows, by (family, document): frozen, so shareable.
        self._parsed: dict[tuple[str, Any], Any] = {}  # (family, document) -> schedule
        # The tasks the last advance_ready found ready, and at which batch (tasks.batches).
        self._ready_seen: dict[int, int] = {}

    # ---- sessions ------------------------------------------------------------------

    def _cached(self, cache: OrderedDict, key: Any, build: Callable[[], Any]) -> Any:
        """cache[key], built outside the lock when missing, once however many threads ask
        for it meanwhile (they wait for that build); the cache keeps the MAX_SPACES most
        recently used entries."""
        with self._spaces_lock:
            found = cache.get(key)
            if found is not None:
                cache.move_to_end(key)
                return found
            building = self._building.setdefault((id(cache), key), threading.Lock())
        with building:
            with self._spaces_lock:
                found = cache.get(key)  # (built while this thread waited)
                if found is not None:
                    cache.move_to_end(key)
                    return found
            try:
                found = build()
            except BaseException:
                with self._spaces_lock:
                    self._building.pop((id(cache), key), None)
                raise
            with self._spaces_lock:  # (cached before its lock goes: no second build)
                cache[key] = found
                while len(cache) > MAX_SPACES:
                    cache.popitem(last=False)
                self._building.pop((id(cache), key), None)
        return found

    def _space(self, workload: Any, gpu: str) -> tuple[FamilySpace, np.ndarray]:
        def build() -> tuple[FamilySpace, np.ndarray]:
            fam = family_of(workload)
            space = fam.enumerate(workload, get_gpu(gpu))
            return space, fam.evaluate(space).latency_us

        return self._cached(self._spaces, (workload.workload_hash, gpu), build)

    def _new_live(
        self,
        workload: Any,
        gpu: str,
        strategy: str,
        seed: int,
        budget: int,
        prior_task: int | None = None,
        learned_from: tuple[int, ...] | None = None,
    ) -> _Live:
        space, predicted = self._space(workload, gpu)
        prior = None
        if prior_task is not None:
            prior = self._prior(prior_task, workload, gpu, space)
        elif learned_from is not None:
            prior = self._learned_prior(learned_from, workload, gpu, space)
        session = TuningSession(
            workload, space.gpu, strategy, seed, budget, space=space, prior=prior
        )
        return _Live(session, predicted, [], 0)

    def _prior(self, prior_task: int, workload: Any, gpu: str, space: FamilySpace) -> PriorMean:
        """The prior a finished task's trials give this space; cached (a finished task's
        trials do not change)."""

        def build() -> PriorMean:
            with self.db.read_conn() as conn:
                return prior_from_task(conn, prior_task, space)

        return self._cached(self._priors, (prior_task, workload.workload_hash, gpu), build)

    def learned_pick(
        self, workload: Any, gpu: str, excluding: frozenset[str] = frozenset()
    ) -> LearnedPick | None:
        """The schedule a learned prior picks for a workload nothing measured yet, where its
        family learns by default (priors.learned_pick), with the tasks' cached cost model,
        other than the schedules of `excluding` (seen to fail on the GPU).
        The answer is kept for LOOKUP_TTL_S: finding the tasks to learn from reads the jobs
        of the tasks finished since the last time (priors.TaskSummaries) and the pick predicts
        a whole space, several times the cost of the rest of a lookup, and a lookup may lag a
        newly finished task by that long."""
        key = (workload.workload_hash, gpu, excluding)
        now = time.monotonic()
        with self._spaces_lock:
            kept = self._picks.get(key)
            if kept is not None and kept[0] > now:
                return kept[1]
        with self.db.read_conn() as conn:
            pick = learned_pick(
                conn,
                workload,
                gpu,
                lambda: self._space(workload, gpu)[0],
                lambda ids, space: self._learned_prior(ids, workload, gpu, space),
                excluding,
                self._summaries,
            )
        with self._spaces_lock:
            self._picks[key] = (now + LOOKUP_TTL_S, pick)
            self._picks.move_to_end(key)
            while len(self._picks) > MAX_SPACES:
                self._picks.popitem(last=False)
        return pick

    def _learned_prior(
        self, learned_from: tuple[int, ...], workload: Any, gpu: str, space: FamilySpace
    ) -> PriorMean:
        """The prior a cost model of those finished tasks' trials gives this space; cached
        (finished tasks' trials do not change)."""

        line = generator_revision_of(workload).line

        def fit() -> LearnedModel:  # the slow part, the same for every space of the line
            with self.db.read_conn() as conn:
                return learned_model_of_tasks(conn, list(learned_from), line)

        def build() -> PriorMean:
            learned = self._cached(self._learned_models, (learned_from, line), fit)
            return prior_from_tasks(list(learned_from), learned, space)

        key = (learned_from, workload.workload_hash, gpu)
        return self._cached(self._priors, key, build)

    def _propose(self, live: _Live, n: int) -> tuple[list[Any], list[float]]:
        session = live.session
        began = time.thread_time()  # (a proposal runs on the calling thread, BLAS on one)
        # The whole batch asked for: the session cuts it to the budget (a replay asks the same).
        batch = session.propose(n) if n > 0 and session.remaining > 0 else []
        self.metrics.proposal_cpu.labels(session.strategy_name).inc(time.thread_time() - began)
        if not batch:
            return [], []
        live.sizes.append(len(batch))
        rows = session.pending[-len(batch) :]  # the rows propose() just added
        return batch, [float(p) for p in live.predicted_us[rows]]

    def _forget(self, task_id: int) -> None:
        """Drop what this replica keeps for a task that has ended: its session and its lock
        (one per task ever advanced here, kept for good, was a replica's memory growing with
        every task a fleet ran). An advance waiting on the lock meanwhile finds the task
        ended too."""
        with self._live_lock:
            if task_id in self._advancing:
                self._ended.add(task_id)
        self._keep_live(task_id, None)
        self._task_locks.pop(task_id, None)

    def _take_live(self, task_id: int) -> _Live | None:
        """The task's session, out of the cache for an advance; the task counts as held here
        until the advance ends (_advance)."""
        with self._live_lock:
            self._advancing.add(task_id)
            return self._live.pop(task_id, None)

    def _keep_live(self, task_id: int, live: _Live | None) -> None:
        with self._live_lock:
            self._live.pop(task_id, None)
            if live is not None and task_id not in self._ended:
                self._live[task_id] = live
                while len(self._live) > MAX_LIVE_SESSIONS:
                    self._live.popitem(last=False)

    # ---- create --------------------------------------------------------------------

    def prior_for(
        self, body: TaskCreate, where: tuple[str, ...] = ("body",)
    ) -> tuple[int | None, tuple[int, ...] | None]:
        """The prior a task of `body` starts from, as (prior_task, learned_from): another
        GPU's task (prior_gpu resolved to it), the tasks a learned prior reads, or neither
        (the strategy's own prior). What cannot be one raises the 422 creating the task
        would (`where`: the request's path to the task's fields). The prior is built here:
        only building it shows a prior with no schedule in common with this space (a 422, or
        a default learned prior dropped); it stays in the cache, and the creation that
        follows (`create`, or one after POST /v1/tasks/prior) builds nothing again."""
        # The field a prior's 422 names: the one the request gave (prior_gpu resolves to a
        # prior_task here, which the user never named).
        prior_field = "prior_task" if body.prior_gpu is None else "prior_gpu"
        # A workload with no valid schedule on the GPU first: a prior for it had "no
        # configuration in common", a 422 that sent the user to fix the prior.
        space = self._space(body.workload, body.gpu)[0]
        if len(space) == 0:
            reason = family_of(body.workload).no_schedule_reason(body.workload, get_gpu(body.gpu))
            raise InputError([*where[:1], "workload"], reason)
        if body.prior_gpu is not None:
            body = self._resolve_prior_gpu(body, where)
        if body.prior_task is not None:
            self._check_prior(body, where)
        learned_from: tuple[int, ...] | None = None
        if body.learned_prior:
            learned_from = self._learned_from(body, where)
        elif body.learned_prior is None and body.prior_task is None:
            learned_from = self._learned_by_default(body)
        try:
            if body.prior_task is not None:
                self._prior(body.prior_task, body.workload, body.gpu, space)
            elif learned_from is not None:
                self._learned_prior(learned_from, body.workload, body.gpu, space)
        except PriorError as exc:  # no schedule in common with the prior's
            if learned_from is not None and not body.learned_prior:
                # A default that cannot be: the task starts from the analytical model.
                return None, None
            field = prior_field if learned_from is None else "learned_prior"
            raise InputError([*where, field], str(exc)) from None
        return body.prior_task, learned_from

    def create(self, body: TaskCreate, where: tuple[str, ...] = ("body",)) -> int:
        """Write the task and its first batch (two, proposing ahead) in one transaction;
        returns the task id. `where`: the request's path to the task's fields (for a 422)."""
        prior_task, learned_from = self.prior_for(body, where)
        # (The prior prior_for built comes from the cache.)
        live = self._new_live(
            body.workload, body.gpu, body.strategy, body.seed, body.budget, prior_task, learned_from
        )
        batch_size = self.settings.batch_size if body.batch_size is None else body.batch_size
        batches = []
        for _ in range(1 + batches_ahead(body.strategy)):
            batch, predicted = self._propose(live, batch_size)
            if batch:
                batches.append((batch, predicted))
        enqueued = live.trials
        with self.db.write() as s:
            task = TaskRow(
                workload_id=workload_id(s, body.workload),
                gpu=body.gpu,
                arch=live.session.gpu.arch,
                strategy=body.strategy,
                budget=body.budget,
                seed=body.seed,
                prior_task=prior_task,
                learned_from=None if learned_from is None else list(learned_from),
                only_runner=None if body.runner is None else body.runner.value,
                priority=body.priority,
                batch_size=batch_size,
                state=TaskState.QUEUED,
                # On PostgreSQL each batch's statement counts its batch in (as an advance's).
                batches=len(batches) if self.db.is_sqlite else 0,
                trials_target=min(body.budget, len(live.session.space)),
                trials_enqueued=enqueued if self.db.is_sqlite else 0,
                trials_done=0,
                trials_failed=0,
                curve=BestCurve().doc(),
            )
            s.add(task)
            s.flush()
            first = 0
            for number, (batch, predicted) in enumerate(batches):
                if self.db.is_sqlite:
                    self._insert_jobs(s.connection(), task, number, first, batch, predicted)
                else:
                    # The advance's one statement, in this transaction: building and
                    # compiling the ORM's statements (the fair key's above all) cost three
                    # times as much (benchmarks/RESULTS.md, "a task's creation in one
                    # statement per batch").
                    plan = _Plan(task.id, number, first, batch, predicted, task.curve)
                    with self.db.session_cursor(s) as cur:
                        written = self._batch_statement(cur, plan)
                    if written is None:  # never: the task is new, its state queued
                        raise RuntimeError(f"task {task.id}: batch {number} not written")
                first += len(batch)
            task_id, arch, runner = task.id, task.arch, task.only_runner
        self._announce(arch, body.gpu, enqueued, runner)
        self.metrics.batches.inc(len(batches))
        self._keep_live(task_id, live)
        return task_id

    def _resolve_prior_gpu(self, body: TaskCreate, where: tuple[str, ...]) -> TaskCreate:
        """The body with prior_gpu resolved to the task it names (recorded as prior_task:
        a replay must read the same prior whatever was tuned on that GPU since)."""
        assert body.prior_gpu is not None
        prior_gpu = body.prior_gpu

        measured_only = _measured_only(body)

        def find(conn: Connection, workload: Any, gpu: str) -> int:
            return prior_task_on(conn, workload.workload_hash, prior_gpu, gpu, measured_only)

        # Through _read_prior, which refuses a strategy that takes no prior first: the 422
        # named `prior_gpu` or `strategy` by whether the other GPU had a task.
        task = self._read_prior(body, where, "prior_gpu", find)
        return body.model_copy(update={"prior_task": task, "prior_gpu": None})

    def _learned_from(self, body: TaskCreate, where: tuple[str, ...]) -> tuple[int, ...]:
        """The tasks a learned prior reads (recorded on the task: replicas rebuild from them)."""
        return tuple(
            self._read_prior(
                body,
                where,
                "learned_prior",
                lambda conn, workload, gpu: learned_tasks(conn, workload, gpu, self._summaries),
            )
        )

    def _learned_by_default(self, body: TaskCreate) -> tuple[int, ...] | None:
        """A task that says nothing of a learned prior gets one where its family learns by
        default, its strategy's prior is the analytical model (which the learned prior
        refines; `bo` stays knob-only) and measured tasks of enough shapes to learn from
        exist (priors.MIN_DEFAULT_SHAPES); else none (nothing to refuse: it was not asked
        for)."""
        if not family_of(body.workload).learns_by_default:
            return None
        if not STRATEGY_MAP[body.strategy].model_prior:
            return None
        try:
            with self.db.read_conn() as conn:
                return tuple(default_learned_tasks(conn, body.workload, body.gpu, self._summaries))
        except PriorError:
            return None

    def _check_prior(self, body: TaskCreate, where: tuple[str, ...]) -> None:
        assert body.prior_task is not None
        prior_task = body.prior_task

        measured_only = _measured_only(body)

        def check(conn: Connection, workload: Any, gpu: str) -> None:
            check_prior_task(conn, prior_task, workload, gpu, measured_only)

        self._read_prior(body, where, "prior_task", check)

    def _read_prior(
        self,
        body: TaskCreate,
        where: tuple[str, ...],
        field: str,
        read: Callable[[Connection, Any, str], Any],
    ) -> Any:
        """read(conn, workload, gpu) for a task that takes a prior; a PriorError is a 422
        naming `field` (or `strategy`, for a strategy that takes no prior)."""
        try:
            check_strategy(body.strategy)
        except PriorError as exc:
            raise InputError([*where, "strategy"], str(exc)) from None
        try:
            with self.db.read_conn() as conn:
                return read(conn, body.workload, body.gpu)
        except PriorError as exc:
            raise InputError([*where, field], str(exc)) from None

    def _insert_jobs(
        self,
        conn: Connection,
        task: Any,
        batch_no: int,
        first_trial: int,
        batch: list[Any],
        predicted: list[float],
    ) -> None:
        """A batch's jobs through the ORM's connection: SQLite's path (PostgreSQL's is one
        statement, COMMIT_BATCH_SQL, which sends the NOTIFY too)."""
        # The task's fair-queue key moved on by the batch; its jobs take the keys it passed.
        step = fair_share.step(task.priority)
        after = conn.execute(
            update(TASKS)
            .where(TASKS.c.id == task.id)
            .values(
                fair_key=fair_share.key_after(
                    len(batch), TASKS.c.fair_key, task.arch, task.gpu, task.priority
                )
            )
            .returning(TASKS.c.fair_key)
        ).scalar_one()
        base = after - len(batch) * step
        conn.execute(
            insert(JOBS),
            [
                {
                    "task_id": task.id,
                    "workload_id": task.workload_id,
                    "gpu": task.gpu,
                    "arch": task.arch,
                    "trial": first_trial + i,
                    "batch": batch_no,
                    "schedule": schedule.as_dict(),
                    "schedule_id": schedule.id,
                    "predicted_us": p,
                    "only_runner": task.only_runner,
                    "state": JobState.QUEUED,
                    "attempts": 0,
                    "fair_key": base + i * step,
                }
                for i, (schedule, p) in enumerate(zip(batch, predicted, strict=True))
            ],
        )

    def _announce(self, arch: str, gpu: str, count: int, runner: str | None) -> None:
        """Wake this replica's lease requests waiting for such jobs (committed by now): for
        workers of `runner` only, where the task is for one."""
        if self.wakeup is not None and count:
            self.wakeup.signal(arch, gpu, count, runner)

    # ---- advance -------------------------------------------------------------------

    def advance(self, task_id: int) -> bool:
        """Enqueue the task's next batch (or finish it) if the batches it waits on are
        complete. True when this call changed the task."""
        return bool(self._advance(task_id, adopt=True))

    def advance_if_current(self, task_id: int) -> bool | None:
        """As `advance`, but only where this replica holds the task's session as it stands
        (it made the newest batch): None, and nothing done, where it would have to replay
        batches another replica made, for a model-guided strategy (those outside
        PROPOSE_AHEAD). Replaying re-runs every missed proposal (a GP fit and acquisition
        per batch), so with several replicas sharing the tasks each proposal would be made
        by each of them; the replica that holds the session is asked instead, and another
        adopts the task only when no replica answers that it holds it (service/proposer.py)."""
        return self._advance(task_id, adopt=False)

    def holds(self, task_id: int) -> bool:
        """Whether this replica keeps a session of the task (it may be the one to advance),
        or is advancing the task now. (An advance takes the session out of the cache while
        it plans: a replica asked for the holder at that moment must still answer, or the
        asker adopts the task a second later and replays every batch it missed.)"""
        with self._live_lock:
            return task_id in self._live or task_id in self._advancing

    def notify_replicas(self, payload: str) -> None:
        """Send a message to the other replicas (PostgreSQL NOTIFY; with one process on
        SQLite there is nobody to tell)."""
        if self.wakeup is not None:
            notify_replicas(self.db, self.wakeup.channel, payload)

    def _advance(self, task_id: int, adopt: bool) -> bool | None:
        with self._task_locks[task_id]:
            try:
                plan = self._plan(task_id, adopt)
                if plan is BEHIND:
                    return None
                if plan is ENDED:  # (finished by another replica, cancelled, failed)
                    self._forget(task_id)
                    return False
                if plan is None:
                    return False
                changed = self._commit(plan)
                # A lost compare-and-set keeps the session too: the batch another replica
                # wrote is the one this session proposed (a session is a function of its
                # seed and its history), and the next advance checks that before using it
                # (_completed); dropping it made that advance replay the whole record.
                self._keep_live(task_id, plan.live if plan.batch else None)
                if changed and not plan.batch:
                    self._forget(task_id)
                return changed
            finally:
                with self._live_lock:
                    self._advancing.discard(task_id)
                    self._ended.discard(task_id)

    # ---- reads (PostgreSQL: plain SQL through the driver, as the queue's hot paths) -----

    def _read_task(self, task_id: int) -> tuple[_TaskView, str, int, int] | None:
        """The task, its state, and its outstanding jobs: those in batches it waits on
        before it can propose (`older`), and all of them."""
        if not self.db.is_sqlite:
            params = {"task": task_id}
            with self.db.driver_statement() as cur:
                cur.execute(READ_TASK_SQL, params)
                row = cur.fetchone()
        else:
            with self.db.read_conn() as conn:
                row = conn.execute(
                    select(
                        TASKS.c.state,
                        TASKS.c.workload_id,
                        TASKS.c.gpu,
                        TASKS.c.strategy,
                        TASKS.c.seed,
                        TASKS.c.budget,
                        TASKS.c.batches,
                        TASKS.c.trials_enqueued,
                        TASKS.c.trials_target,
                        TASKS.c.batch_size,
                        TASKS.c.prior_task,
                        TASKS.c.learned_from,
                    ).where(TASKS.c.id == task_id)
                ).first()
                if row is not None:
                    waits_on = row.batches - batches_ahead(row.strategy)
                    older, outstanding = conn.execute(
                        select(func.count().filter(JOBS.c.batch < waits_on), func.count()).where(
                            JOBS.c.task_id == task_id, JOBS.c.state.in_(OUTSTANDING_JOB_STATES)
                        )
                    ).one()
        if row is None:
            return None
        if not self.db.is_sqlite:
            older, outstanding = row.older, row.outstanding
        task = _TaskView(
            row.workload_id, row.gpu, row.strategy, row.seed, row.budget, row.batches,
            row.trials_enqueued, row.trials_target, row.batch_size, row.prior_task,
            _ids(row.learned_from),
        )  # fmt: skip
        return task, row.state, older, outstanding

    def _read_jobs(
        self, task_id: int, first_batch: int, before: int, fam: KernelFamily
    ) -> list[_JobView]:
        """The task's jobs of batches first_batch..before-1, in trial order (schedules as
        the task's family's)."""
        if not self.db.is_sqlite:
            params = {"task": task_id, "first": first_batch, "before": before}
            with self.db.driver_statement() as cur:
                cur.execute(READ_JOBS_SQL, params)
                rows = cur.fetchall()
        else:
            with self.db.read_conn() as conn:
                rows = conn.execute(
                    select(
                        JOBS.c.trial,
                        JOBS.c.batch,
                        JOBS.c.schedule,
                        JOBS.c.state,
                        JOBS.c.status,
                        JOBS.c.latency_us,
                        JOBS.c.error,
                        JOBS.c.seen_at,
                        JOBS.c.runner,
                    )
                    .where(
                        JOBS.c.task_id == task_id,
                        JOBS.c.batch >= first_batch,
                        JOBS.c.batch < before,
                    )
                    .order_by(JOBS.c.trial)
                ).all()
        return [
            _JobView(
                r.trial, r.batch, self._schedule(fam, r.schedule), _observed(r), r.seen_at, r.runner
            )
            for r in rows
        ]

    def _schedule(self, fam: KernelFamily, doc: Any) -> Any:
        """A job's schedule document (its JSON text on PostgreSQL, the decoded object on
        SQLite) as the family's schedule, parsed (and validated) once per distinct document:
        every advance reads its batches back, and the parsing costs more than the read."""
        try:
            # The text itself is the key; an object's names and values (flat, small).
            key = (fam.name, doc if isinstance(doc, str) else (tuple(doc), tuple(doc.values())))
            found = self._parsed.get(key)
        except (AttributeError, TypeError):  # not an object of plain values: let it say why
            return fam.parse_schedule(doc)
        if found is None:
            found = fam.parse_schedule(json.loads(doc) if isinstance(doc, str) else doc)
            if len(self._parsed) >= MAX_PARSED:
                self._parsed.clear()
            self._parsed[key] = found
        return found

    def _workload(self, workload_id: int) -> Any:
        workload = self._workloads.get(workload_id)
        if workload is None:
            with self.db.read_conn() as conn:
                canonical = conn.scalar(
                    select(WorkloadRow.canonical).where(WorkloadRow.id == workload_id)
                )
            if len(self._workloads) >= MAX_WORKLOADS:  # (it grew with every workload tuned)
                self._workloads.clear()
            workload = self._workloads[workload_id] = parse_any_workload(canonical)
        return workload

    def _plan(self, task_id: int, adopt: bool = True) -> _Plan | None:
        found = self._read_task(task_id)
        if found is None or TaskState(found[1]).is_final():
            return ENDED
        task, _, older, outstanding = found
        early = outstanding_allowed(
            task.strategy, task.batch_size, self.settings.propose_early, task.version
        )
        if older > early:  # a batch it waits on is not complete (enough)
            return None
        # A task proposing ahead waits only for the batches before its newest.
        waits_on = task.version - batches_ahead(task.strategy)
        workload = self._workload(task.workload_id)
        fam = family_of(workload)
        live = self._take_live(task_id)
        if not adopt and task.strategy not in PROPOSE_AHEAD and not _is_current(live, task):
            # (A strategy that proposes ahead replays without measurements or models: cheaper
            # than asking another replica.) An out-of-date session is dropped, not kept: kept,
            # it made this replica answer that it holds the task (`holds`), which cancels an
            # asker's adoption; two replicas with such sessions, the current holder gone,
            # answered each other's questions for ever and the task never advanced. Whoever
            # adopts the task replays the batches anyway.
            self._keep_live(task_id, None)
            return BEHIND
        views, rebuild = self._completed(task_id, task, live, waits_on, fam)
        doing = "rebuild the tuning session"  # what a failure names (_cannot)
        try:
            if rebuild:
                live = self._new_live(
                    workload,
                    task.gpu,
                    task.strategy,
                    task.seed,
                    task.budget,
                    task.prior_task,
                    task.learned_from,
                )
            assert live is not None
            self._roll_forward(task_id, live, views, task)
            doing = "propose the next batch"
            if live.session.remaining == 0:
                if outstanding:  # nothing more to propose: finish once every batch is in
                    self._keep_live(task_id, live)
                    return None
                # Every batch is complete: observe the ones still pending, then finish.
                rest = self._read_jobs(task_id, live.observed, task.version, fam)
                self._observe(live, rest, task.version)
                return _Plan(task_id, task.version, live.trials, [], [], live.curve.doc())
            plan = _Plan(task_id, task.version, live.trials, [], [], {}, live=live)
            # What is measured by now (of a task proposing ahead: its batches before the
            # newest), recorded as seen by this batch's proposal, where a replay observes it;
            # what is still measured is believed (tuner/bo.py).
            fresh = [v for v in views if v.result is not None and v.batch < waits_on]
            observed = set(self._observe(live, fresh, task.version))
            by_rule = {
                v.trial: first_seen_by(v.batch, None, task.strategy) == task.version for v in views
            }
            plan.seen = sorted(t for t in observed if not by_rule[t])
            plan.late = [v.trial for v in views if by_rule[v.trial] and not _has_seen(live, v)]
            plan.batch, plan.predicted = self._propose(live, task.batch_size)
            if not plan.batch:  # the strategy has nothing left to propose
                if outstanding:
                    return None  # (the session saw what no batch records: not kept)
                rest = self._read_jobs(task_id, live.observed, task.version, fam)
                self._observe(live, rest, task.version)
        except Exception as exc:
            if isinstance(exc, UNLIKE_THE_SESSION):
                raise  # the database's or the process's: the next advance tries again
            # Whatever the session raised (a strategy's bug as much as a record that does not
            # replay) fails the task: let through, it left the task running with nothing
            # queued, and every sweep planned it again and raised again.
            log.exception("task %s cannot advance", task_id)
            return _Plan(task_id, task.version, 0, [], [], {}, error=_cannot(doing, exc))
        plan.curve = live.curve.doc()
        return plan

    def _completed(
        self,
        task_id: int,
        task: _TaskView,
        live: _Live | None,
        waits_on: int,
        fam: KernelFamily,
    ) -> tuple[list[_JobView], bool]:
        """The jobs the session must see (observe, or replay and observe) to plan the next
        batch, and whether it must be rebuilt from the first batch."""
        if _is_current(live, task):
            assert live is not None
            # The usual case: this replica made the newest batch; read what completed since
            # (a task proposing ahead: the batches before its newest; any other: all of them,
            # its newest may be complete enough to propose early).
            views = self._read_jobs(task_id, live.observed, waits_on, fam)
            if self._record_matches(live, views, waits_on, task.strategy):
                return views, False
        # Behind (another replica advanced the task) or none. Only the batches this plan
        # saw: another replica may have queued the next one since (its jobs unmeasured);
        # this plan then loses the compare-and-set on `batches` in _commit, as it should,
        # quietly. A session that is behind is rolled forward from the batches it has not
        # observed: the ones it observed are the task's (it made or replayed each batch it
        # holds, and a session whose batch lost the compare-and-set is dropped), so with two
        # replicas taking turns an advance reads two batches, not the whole history.
        if live is not None and live.observed <= len(live.sizes) <= task.version:
            views = self._read_jobs(task_id, live.observed, task.version, fam)
            if self._record_matches(live, views, task.version, task.strategy):
                return views, False
        views = self._read_jobs(task_id, 0, task.version, fam)
        return views, True

    @staticmethod
    def _record_matches(live: _Live, views: list[_JobView], before: int, strategy: str) -> bool:
        """Whether the session is the task's record so far (views: its jobs of batches
        live.observed .. before - 1): its proposed, unobserved trials begin with the record's
        of those batches, in order, and it observed each trial where the record says (a
        session that observed more, or less, than the proposal the task recorded would
        propose differently)."""
        made = len(live.sizes)
        unseen = [v.schedule for v in views if v.batch < made and v.trial not in live.seen]
        session = live.session
        # (Only the first pending rows are made schedules: they are what is compared.)
        first_pending = [session.space[r] for r in session.pending[: len(unseen)]]
        if first_pending != unseen:
            return False
        if len(session.pending) - len(unseen) != sum(live.sizes[min(before, made) :]):
            return False  # it holds unobserved trials of batches the views cover
        for v in views:
            at = live.seen.get(v.trial)
            recorded = first_seen_by(v.batch, v.seen_at, strategy)
            if at is not None and recorded != at:
                return False
            if at is None and recorded is not None and recorded < made:
                return False
        return True

    def _roll_forward(
        self, task_id: int, live: _Live, views: list[_JobView], task: _TaskView
    ) -> None:
        """Replay the recorded batches the session has not proposed yet, in the order they
        were made: before batch b, the jobs the record says b's proposal saw first, then b's
        proposal. A batch the session would not have proposed is adopted
        (TuningSession.adopt)."""
        batches = _by_batch(views)
        for b in range(len(live.sizes), task.version):
            due = [v for v in views if first_seen_by(v.batch, v.seen_at, task.strategy) == b]
            self._observe(live, due, b)
            recorded = [v.schedule for v in batches.get(b, [])]
            # As it was proposed: a whole batch asked for, cut to the budget (propose).
            proposed = live.session.propose(task.batch_size) if recorded else []
            if proposed != recorded:
                # Made by another version of the tuner (an upgrade while the task ran), or
                # edited: the measurements stand, so the session takes the record as its
                # own and proposes on from it rather than failing the task.
                log.warning(
                    "task %s: batch %s does not replay (another tuner version made it?); "
                    "continuing from the recorded trials",
                    task_id,
                    b,
                )
                live.session.adopt(proposed, recorded)
                self.metrics.batches_adopted.inc()
            live.sizes.append(len(recorded))

    @staticmethod
    def _observe(live: _Live, views: list[_JobView], at: int) -> list[int]:
        """Observe, in trial order, the jobs among `views` the session has not observed (each
        must be complete), as seen by the proposal of batch `at`; returns their trials."""
        new = sorted(
            (v for v in views if v.batch >= live.observed and v.trial not in live.seen),
            key=lambda v: v.trial,
        )
        if not new:
            return []
        if any(v.result is None for v in new):  # the caller checked: never expected
            missing = next(v.trial for v in new if v.result is None)
            raise SessionError(f"trial {missing} is not complete")
        live.session.observe([(v.schedule, v.result) for v in new])
        live.curve.observe((v.trial, v.result.ok_latency_us) for v in new)  # (each complete)
        if any(is_simulated(v.runner) for v in new):
            live.curve.simulated = True
        for v in new:
            live.seen[v.trial] = at
        # Batches observed whole leave `seen` (what later reads compare) for `observed`.
        first = sum(live.sizes[: live.observed])
        while live.observed < len(live.sizes):
            size = live.sizes[live.observed]
            trials = range(first, first + size)
            if not all(t in live.seen for t in trials):
                break
            for t in trials:
                del live.seen[t]
            first += size
            live.observed += 1
        return [v.trial for v in new]

    def _commit(self, plan: _Plan) -> bool:
        if plan.batch and plan.error is None and not self.db.is_sqlite:
            return self._commit_batch_pg(plan)  # the database's clock, in the statement
        now = self.db.now()
        if plan.error is not None:
            values = {"state": TaskState.FAILED, "error": plan.error, "finished_at": now}
        elif not plan.batch:
            values = {"state": TaskState.DONE, "finished_at": now}
        else:
            values = {
                "batches": plan.version + 1,
                "trials_enqueued": plan.first_trial + len(plan.batch),
            }
        if plan.error is None:
            values["curve"] = plan.curve
        with self.db.write_conn() as conn:
            if plan.error is not None:
                _lock_outstanding(conn, plan.task_id)  # jobs before the task (_lock_outstanding)
            # The compare-and-set: only the replica that still sees `version` writes.
            task = conn.execute(
                update(TASKS)
                .where(
                    TASKS.c.id == plan.task_id,
                    TASKS.c.batches == plan.version,
                    TASKS.c.state.in_(ACTIVE_TASK_STATES),
                )
                .values(**values, updated_at=now)
                .returning(
                    TASKS.c.id,
                    TASKS.c.workload_id,
                    TASKS.c.gpu,
                    TASKS.c.arch,
                    TASKS.c.only_runner,
                    TASKS.c.priority,
                )
            ).first()
            if task is None:
                return False
            if plan.error is not None:
                # A batch proposed ahead may be outstanding: nobody is to measure it now.
                self._cancel_outstanding(conn, plan.task_id, now)
                # Its curve over every trial it ran, as a cancelled task's: the stored one
                # was the last batch boundary's, and the aggregate left out what came after.
                conn.execute(
                    update(TASKS)
                    .where(TASKS.c.id == plan.task_id)
                    .values(curve=_final_curve(conn, plan.task_id))
                )
            if plan.batch:
                for trials, seen_at in ((plan.seen, plan.version), (plan.late, NOT_SEEN)):
                    if trials:
                        conn.execute(
                            update(JOBS)
                            .where(JOBS.c.task_id == plan.task_id, JOBS.c.trial.in_(trials))
                            .values(seen_at=seen_at)
                        )
                self._insert_jobs(
                    conn, task, plan.version, plan.first_trial, plan.batch, plan.predicted
                )
        if plan.batch:
            self._announce(task.arch, task.gpu, len(plan.batch), task.only_runner)
            self.metrics.batches.inc()
        else:
            self.metrics.tasks_finished.labels(values["state"]).inc()
            log.info("task %d %s", plan.task_id, values["state"])
        return True

    def _commit_batch_pg(self, plan: _Plan) -> bool:
        """A new batch on PostgreSQL: the compare-and-set, the jobs and the NOTIFY in one
        statement, through the driver (an advance per batch is the driver's hot path)."""
        with self.db.driver_statement() as cur:
            task = self._batch_statement(cur, plan)
        if task is None:
            return False
        self._announce(task.arch, task.gpu, len(plan.batch), task.only_runner)
        self.metrics.batches.inc()
        return True

    def _batch_statement(self, cur: psycopg.Cursor, plan: _Plan) -> Any:
        """Run the batch's statement (COMMIT_BATCH_SQL) on `cur`; the task's arch, gpu and
        only_runner, or None where the compare-and-set found the task moved on or ended."""
        jobs = [
            {
                "trial": plan.first_trial + i,
                "schedule": schedule.as_dict(),
                "schedule_id": schedule.id,
                "predicted_us": p,
            }
            for i, (schedule, p) in enumerate(zip(plan.batch, plan.predicted, strict=True))
        ]
        params = {
            "task": plan.task_id,
            "version": plan.version,
            "enqueued": plan.first_trial + len(plan.batch),
            "curve": json_param(plan.curve),
            "jobs": json_param(jobs),
            "queued": JobState.QUEUED.value,
            "channel": self.wakeup.channel if self.wakeup is not None else CHANNEL,
            "origin": self.wakeup.origin if self.wakeup is not None else "",
            "count": len(jobs),
            "first": plan.first_trial,
            "seen": plan.seen,
            "late": plan.late,
        }
        cur.execute(COMMIT_SEEN_BATCH_SQL if plan.seen or plan.late else COMMIT_BATCH_SQL, params)
        return cur.fetchone()

    def advance_ready(
        self,
        held_elsewhere: Callable[[int], None] | None = None,
        in_hand: Callable[[int], bool] | None = None,
        patient: bool = False,
    ) -> int:
        """Advance every active task whose awaited batches are complete (the safety net
        for a replica that stopped between a result and its advance). With
        `held_elsewhere`, a task whose session another replica may hold is handed to it
        (the proposer's request: ask the holder, adopt if none answers) instead of being
        replayed here. Tasks `in_hand` says the proposer will see to are left to it; with
        `patient`, so are the tasks the call before did not find ready at the same batch
        (the proposer of another replica may be about to advance them: at 400 tasks on two
        replicas each sweep advanced such tasks too, each advance made twice)."""
        ahead = case((TASKS.c.strategy.in_(sorted(PROPOSE_AHEAD)), literal(1)), else_=literal(0))
        older = (
            select(func.count())
            .where(
                JOBS.c.task_id == TASKS.c.id,
                JOBS.c.state.in_(OUTSTANDING_JOB_STATES),
                JOBS.c.batch < TASKS.c.batches - ahead,
            )
            .scalar_subquery()
        )
        with self.db.read_conn() as conn:
            rows = conn.execute(
                select(
                    TASKS.c.id,
                    TASKS.c.strategy,
                    TASKS.c.batch_size,
                    TASKS.c.batches,
                    older.label("waiting"),
                    TASKS.c.trials_enqueued,
                    TASKS.c.trials_target,
                    TASKS.c.trials_done,
                ).where(TASKS.c.state.in_(ACTIVE_TASK_STATES))
            ).all()
        share = self.settings.propose_early
        found = {
            r.id: r.batches
            for r in rows
            if r.waiting <= outstanding_allowed(r.strategy, r.batch_size, share, r.batches)
            and not all_enqueued_some_out(r.trials_enqueued, r.trials_target, r.trials_done)
        }
        seen_before, self._ready_seen = self._ready_seen, found
        ready = [
            task_id
            for task_id, batches in found.items()
            if not (in_hand is not None and in_hand(task_id))
            and not (patient and seen_before.get(task_id) != batches)
        ]
        changed = 0
        for task_id in ready:
            if held_elsewhere is None or self.db.is_sqlite:
                changed += self.advance(task_id)
                continue
            outcome = self.advance_if_current(task_id)
            if outcome is None:
                held_elsewhere(task_id)
            changed += bool(outcome)
        return changed

    # ---- cancel --------------------------------------------------------------------

    @staticmethod
    def _cancel_outstanding(conn: Connection, task_id: int, now: Any) -> None:
        """Cancel the task's queued and leased jobs, and end their leases as cancelled."""
        jobs = conn.scalars(
            update(JOBS)
            .where(JOBS.c.task_id == task_id, JOBS.c.state.in_(OUTSTANDING_JOB_STATES))
            .values(state=JobState.CANCELLED, lease_expires_at=None, finished_at=now)
            .returning(JOBS.c.id)
        ).all()
        if jobs:
            conn.execute(
                update(LeaseRow.__table__)
                .where(
                    LeaseRow.__table__.c.job_id.in_(jobs),
                    LeaseRow.__table__.c.outcome.is_(None),
                )
                .values(outcome=LeaseOutcome.CANCELLED, ended_at=now)
            )

    def cancel(self, task_id: int) -> None:
        # A batch enqueued between the jobs' lock and the task's is not held by the first
        # lock; once the task is held no further batch can commit, so those jobs are taken
        # without waiting, and if a result holds one (it waits for the task next) the cancel
        # lets go of everything and starts again, instead of deadlocking with that result.
        for _ in range(CANCEL_ATTEMPTS - 1):
            try:
                return self._cancel(task_id, wait=False)
            except sa_exc.OperationalError as exc:
                if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
                    raise
        return self._cancel(task_id, wait=True)

    def _cancel(self, task_id: int, wait: bool) -> None:
        now = self.db.now()
        with self.db.write() as s:
            _lock_outstanding(s.connection(), task_id)
            # Locked: an advance committing meanwhile would leave its new batch queued.
            state = s.scalar(select(TaskRow.state).where(TaskRow.id == task_id).with_for_update())
            if state is None:
                raise NotFoundError(f"task {task_id} does not exist")
            if state == TaskState.CANCELLED:
                return
            if TaskState(state).is_final():
                raise ConflictError(f"task {task_id} is already {state}")
            if not self.db.is_sqlite:
                _lock_outstanding(s.connection(), task_id, wait=wait)
            self._cancel_outstanding(s.connection(), task_id, now)
            s.execute(
                update(TaskRow)
                .where(TaskRow.id == task_id)
                .values(
                    state=TaskState.CANCELLED,
                    finished_at=now,
                    updated_at=now,
                    curve=_final_curve(s.connection(), task_id),
                )
                .execution_options(synchronize_session=False)
            )
        self._forget(task_id)
        self.metrics.tasks_finished.labels(TaskState.CANCELLED).inc()
        log.info("task %d cancelled", task_id)


def _final_curve(conn: Connection, task_id: int) -> dict[str, Any]:
    """The stored curve of a task that ends now: over its trials, its cancelled jobs left out
    (no trial), as its own curve reads (service/curves.task_curve). The driver writes the
    curve at batch boundaries only, and a cancelled task's last partial batch was left out of
    the aggregate (79 trials shown, 72 counted)."""
    curve = BestCurve()
    rows = conn.execute(
        select(JOBS.c.state, JOBS.c.latency_us, JOBS.c.runner)
        .where(JOBS.c.task_id == task_id)
        .order_by(JOBS.c.trial)
    )
    for state, latency, runner in counted_trials(rows):
        curve.extend([latency if state == JobState.DONE else None])
        curve.simulated = curve.simulated or is_simulated(runner)
    return curve.doc()


def _lock_outstanding(conn: Connection, task_id: int, wait: bool = True) -> None:
    """Lock the task's queued and leased jobs, in id order, before anything locks the task.

    The queue's statements lock jobs first and tasks second (service/queue_pg.py): a result
    holds its job and then updates its task's counters. A transaction that locked the task
    first and then updated a job with a result in flight deadlocked with it (PostgreSQL
    aborts one after a second: a 503 for the worker, or a cancel that fails). A job enqueued
    after this lock (an advance that committed just before the task's lock) is not held
    here: a caller that then updates every outstanding job locks them again with `wait`
    False once it holds the task (PostgreSQL raises LockNotAvailable at once if a result
    holds one) and starts over (`Driver.cancel`). On SQLite the lock is the database's own."""
    conn.execute(
        select(JOBS.c.id)
        .where(JOBS.c.task_id == task_id, JOBS.c.state.in_(OUTSTANDING_JOB_STATES))
        .order_by(JOBS.c.id)
        .with_for_update(nowait=not wait)
    ).all()


def _cannot(doing: str, exc: Exception) -> str:
    """A failed task's error: what the advance could not do, and why (an error pipetune did
    not raise on purpose with its class: "list index out of range" alone says little)."""
    why = str(exc) if isinstance(exc, PipetuneError) else f"{type(exc).__name__}: {exc}"
    return f"cannot {doing}: {why}"
