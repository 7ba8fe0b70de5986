"""Fair shares of a GPU's workers between the tasks that wait for them: start-time fair
queueing (Goyal, Vin and Cheng, 1996) over trials.

Every job gets a key when it is enqueued, and a lease takes the queued jobs with the
smallest keys (ties: the older job). A task's jobs are numbered on from the larger of
  * the key after its own last job (`tasks.fair_key`), and
  * the GPU's virtual time: how far the queue of that GPU has got,
so while several tasks have jobs queued they take turns, one trial each (a task of
priority p: p trials to a priority-1 task's one: its keys advance by KEY_UNIT / p a job),
whatever their batch sizes; a task that waits (on its results, or a new task) starts level
with the tasks being served, not ahead of them by what it did not use, and not behind a
backlog that others queued before it. First come by job id, a batch-64 task that proposes
ahead took 272 trials to a batch-8 task's 16 in their first 10 s, and a new task waited 4.01 s
for its first trial, behind every job queued before it (benchmarks/RESULTS.md, "fair shares
between tasks, before and after").

The virtual time is the largest of the smallest key queued for any worker of the GPU (jobs
of one runner kind only are left out: with no such worker they would hold it back for ever)
and the largest keys leased, done and failed (how far service has got: jobs that no worker
takes, another workload's where every worker answers one, stay queued with their first
keys), or, with none of those, the furthest key of the GPU's active tasks. It is read when
a batch is enqueued and written nowhere: a lease changes nothing of it, so the hot path
gains no row that every lease would update. The rule is written once, here, as a
SQLAlchemy expression: the ORM paths use it as such, and PostgreSQL's one-statement batch
commit (service/driver.py) embeds its compiled text.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import ColumnElement, Integer, func, literal_column, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from pipetune.model.states import ACTIVE_TASK_STATES, JobState
from pipetune.model.wire import MAX_PRIORITY
from pipetune.service.orm import JobRow, TaskRow

JOBS, TASKS = JobRow.__table__, TaskRow.__table__
_BATCH = "__fair_batch__"  # where key_after_sql's parameter goes
# A job's key advances by KEY_UNIT / priority: a multiple of every priority (2520), so every
# step is a whole number and the keys stay exact integers.
KEY_UNIT = math.lcm(*range(1, MAX_PRIORITY + 1))


class greatest(FunctionElement):  # noqa: N801 (named as the SQL function it is)
    """The larger of its arguments: PostgreSQL's greatest(), SQLite's many-argument max()."""

    inherit_cache = True


@compiles(greatest)
def _greatest(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


def virtual_time(arch: Any, gpu: Any) -> ColumnElement[int]:
    """The GPU's virtual time, for the arch and gpu given (columns or values)."""
    on_gpu = (JOBS.c.arch == arch, JOBS.c.gpu == gpu)
    queued = select(func.min(JOBS.c.fair_key)).where(
        JOBS.c.state == JobState.QUEUED.value, JOBS.c.only_runner.is_(None), *on_gpu
    )
    # The furthest key in service and served: queued jobs no worker takes (another
    # workload's, where every worker answers one) keep their first keys, and taken alone
    # they held the time there, each new task that far back of those being served. One
    # probe each of the queue index. A failed trial was served as much as a done one: left
    # out, a task for GPU workers only (its queued jobs left out above) that failed every
    # trial (a schedule space that does not compile there, a broken runner) held the time
    # at the GPU's last done job, an earlier task's, and a task created then took every
    # trial until it caught up (32 of 32). Lost jobs are left out (one more probe for the
    # few keys that dying workers leave behind).
    started = [
        select(func.max(JOBS.c.fair_key)).where(JOBS.c.state == s.value, *on_gpu)
        for s in (JobState.LEASED, JobState.DONE, JobState.FAILED)
    ]
    # The larger of those known (-1: none), alike on both dialects: SQLite's max() of
    # several is null where any is, PostgreSQL's greatest() only where all are.
    known = func.nullif(
        greatest(*(func.coalesce(q.scalar_subquery(), -1) for q in (queued, *started))), -1
    )
    # With nothing queued or started, the furthest any task of the GPU has got. Only the
    # active tasks (a few, by their state's index): one probe, where the largest key over
    # the jobs' other states would take one each. Under an alias of its own: key_after_sql
    # passes the updated task's columns as the text `tasks.arch`, which inside `FROM tasks`
    # would name the inner row (every GPU's).
    others = TASKS.alias("others")
    furthest = select(func.max(others.c.fair_key)).where(
        others.c.state.in_([s.value for s in ACTIVE_TASK_STATES]),
        others.c.arch == arch,
        others.c.gpu == gpu,
    )
    return func.coalesce(known, furthest.scalar_subquery(), 0)


def step(priority: Any) -> Any:
    """How far a task's key advances a job, by its priority (a value or a SQL expression)."""
    return KEY_UNIT // priority


def key_after(batch: Any, task_key: Any, arch: Any, gpu: Any, priority: Any) -> ColumnElement[int]:
    """A task's key after it enqueues `batch` jobs (values or SQL expressions); its jobs
    take the keys from this minus `batch` steps on, a step each."""
    return greatest(task_key, virtual_time(arch, gpu)) + batch * step(priority)


def _postgres(expression: ColumnElement) -> str:
    dialect = postgresql.psycopg.dialect()
    return str(expression.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


_PRIORITY = literal_column("tasks.priority", Integer)


def key_after_sql(batch_param: str) -> str:
    """key_after for `UPDATE tasks ...` on PostgreSQL, as SQL text, with the batch's size
    the statement's parameter `batch_param` (pyformat)."""
    expression = key_after(
        literal_column(_BATCH, Integer),
        literal_column("tasks.fair_key"),
        literal_column("tasks.arch"),
        literal_column("tasks.gpu"),
        _PRIORITY,
    )
    return _postgres(expression).replace(_BATCH, f"%({batch_param})s")


def step_sql() -> str:
    """step() of a row of tasks on PostgreSQL, as SQL text (parenthesised)."""
    return f"({_postgres(step(_PRIORITY))})"
