"""Prometheus metrics (prometheus_client), one registry per service app.

Counters and histograms live in this process (each replica exports its own, as Prometheus
expects); the queue gauges are read from the database at scrape time by a custom
collector, so every replica reports the same, true queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from pipetune.model.hardware import gpu_keys
from pipetune.model.states import OUTSTANDING_JOB_STATES, JobState, TaskState, WorkerState
from pipetune.model.trials import RunnerKind
from pipetune.service.db import is_unavailable
from pipetune.service.orm import JobRow, TaskRow, WorkerRow, in_state
from pipetune.service.thread_cpu import ThreadCpu

if TYPE_CHECKING:
    from pipetune.service.db import Database

# The exposition has no `*_created` series: scrapers of the families below never had them.
disable_created_metrics()

# What generate_latest writes: the classic text format (every Prometheus reads it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def gauge_family(
    name: str, help_text: str, labels: list[str], rows: Iterable[tuple]
) -> GaugeMetricFamily:
    """A gauge family from (label values..., value) rows."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for *values, value in rows:
        family.add_metric([str(v) for v in values], float(value))
    return family


class DatabaseGauges(Collector):
    """The queue, task and worker gauges, read from the database at every scrape (one read
    transaction), so that every replica reports the same, true figures (not to be summed
    over replicas, as their own counters are).

    Every GPU and every task state has a sample, 0 included: a series that vanished when its
    queue emptied read as "no data" rather than 0. While the database cannot be reached the
    scrape still answers, with `pipetune_database_up 0` and without these gauges (it failed
    whole, so a replica whose database was down looked down itself). While its disk is full
    or it is read-only (Database.write_problem) it reads 0 too, with these gauges: reads still
    answer then."""

    def __init__(self, db: Database, live_within_s: float = 120.0):
        """`live_within_s`: a worker whose last heartbeat is older is not live (the lease
        TTL: its leases would have expired); nor is one that said it exited since
        (orm.in_state)."""
        self.db = db
        self.live_within_s = live_within_s

    def collect(self) -> Iterator[Metric]:
        # SQLite: its file deleted or replaced; PostgreSQL: a statement missed its deadline and
        # no probe answered since (service/db.py; a scrape does not wait a deadline to say so).
        if self.db.file_problem() is not None or self.db.stalled:
            yield gauge_family("pipetune_database_up", DATABASE_UP_HELP, [], [(0,)])
            return
        try:
            with self.db.read() as s:
                jobs = s.execute(
                    select(JobRow.state, JobRow.gpu, func.count())
                    .where(JobRow.state.in_(OUTSTANDING_JOB_STATES))
                    .group_by(JobRow.state, JobRow.gpu)
                ).all()
                tasks = s.execute(select(TaskRow.state, func.count()).group_by(TaskRow.state)).all()
                workers = s.execute(
                    select(WorkerRow.gpu, WorkerRow.runner, func.count()).group_by(
                        WorkerRow.gpu, WorkerRow.runner
                    )
                ).all()
                since = self.db.now_plus(-self.live_within_s)
                live = s.execute(
                    select(WorkerRow.gpu, WorkerRow.runner, func.count())
                    .where(in_state(WorkerState.LIVE, since))
                    .group_by(WorkerRow.gpu, WorkerRow.runner)
                ).all()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            yield gauge_family("pipetune_database_up", DATABASE_UP_HELP, [], [(0,)])
            return
        # A full disk or a read-only database: reads (these gauges) still answer, but every
        # write fails, and /healthz says so (Database.write_problem); a database_up of 1
        # then contradicted /healthz and hid the outage from alerts on the gauge. The gauges
        # are still worth having.
        up = 0 if self.db.write_problem() is not None else 1
        yield gauge_family("pipetune_database_up", DATABASE_UP_HELP, [], [(up,)])
        gpus = [(gpu,) for gpu in gpu_keys()]
        queued = _every(gpus, [(gpu, n) for state, gpu, n in jobs if state == JobState.QUEUED])
        leased = _every(gpus, [(gpu, n) for state, gpu, n in jobs if state == JobState.LEASED])
        states = _every([(str(state),) for state in TaskState], tasks)
        gpus_and_runners = [(gpu, str(runner)) for gpu in gpu_keys() for runner in RunnerKind]
        yield gauge_family("pipetune_queue_depth", "Jobs waiting for a worker", ["gpu"], queued)
        yield gauge_family("pipetune_leases_active", "Jobs leased to a worker", ["gpu"], leased)
        yield gauge_family("pipetune_tasks", "Tasks by state", ["state"], states)
        # By runner as well as GPU: a simulated worker stands in for a GPU it does not have,
        # and counted with the real ones it made a fleet of simulations look like GPUs.
        yield gauge_family(
            "pipetune_workers_registered",
            "Workers ever registered (a restarted worker registers again under a new name), "
            "by the GPU they answer for and their runner (simulated: no GPU)",
            ["gpu", "runner"],
            _every(gpus_and_runners, workers),
        )
        yield gauge_family(
            "pipetune_workers_live",
            "Workers that sent a heartbeat within the lease TTL and have not exited since, "
            "by GPU and runner",
            ["gpu", "runner"],
            _every(gpus_and_runners, live),
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())  # registering the collector reads nothing from the database


DATABASE_UP_HELP = (
    "1 while this replica reads and writes its database, 0 while it cannot reach it, "
    "its disk is full, it is read-only or it is corrupt"
)


def _every(keys: Iterable[tuple[str, ...]], rows: Iterable[tuple]) -> list[tuple]:
    """(*key, value) for every key (a tuple of label values), 0 where `rows` (each a key's
    label values, then its count) has none; and the rows of other keys, sorted, after."""
    found = {tuple(str(part) for part in key): float(n) for *key, n in rows}
    every = list(keys)
    rest = sorted(set(found) - set(every))
    return [(*key, found.get(key, 0.0)) for key in every + rest]


class Metrics:
    """The service's own counters and request latency, and (given a database) its gauges."""

    def __init__(self, db: Database | None = None, live_within_s: float = 120.0) -> None:
        """`live_within_s`: how recent a worker's heartbeat must be for it to count as live
        (the service's lease TTL)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.leases = Counter(
            "pipetune_jobs_leased_total", "Jobs handed to workers", ["gpu"], registry=r
        )
        self.results = Counter(
            "pipetune_results_total",
            "Results posted by workers (recorded: this report wrote the trial; a repeat of "
            "one is accepted, not recorded; simulated: the analytical model's latency, no GPU)",
            ["status", "accepted", "recorded", "simulated"],
            registry=r,
        )
        # Reports refused whole (a batch's item answered 403 or 404 in a 200): a worker whose
        # every report is refused showed nowhere on the service's side.
        self.results_refused = Counter(
            "pipetune_results_refused_total",
            "Results refused without a look at their measurement (no_such_job: the job does "
            "not exist; not_its_lease: the reporting worker holds no lease of the job with "
            "that token)",
            ["reason"],
            registry=r,
        )
        # Results that are no honest measurement of their trial, apart from the stale ones
        # (both also counted in pipetune_results_total): a worker sending either is broken.
        self.results_conflicting = Counter(
            "pipetune_results_conflicting_total",
            "Results sent again for a lease whose result is recorded, but different from it "
            "(not recorded: the first one stays)",
            registry=r,
        )
        self.results_implausible = Counter(
            "pipetune_results_implausible_total",
            "Ok results faster than their task's workload can run on its GPU (below the task's "
            "latency floor), recorded as failed trials",
            registry=r,
        )
        self.lease_expiries = Counter(
            "pipetune_lease_expiries_total",
            "Leases that expired without a result",
            ["outcome"],
            registry=r,
        )
        self.batches = Counter(
            "pipetune_batches_enqueued_total", "Proposal batches enqueued", registry=r
        )
        self.batches_adopted = Counter(
            "pipetune_batches_adopted_total",
            "Recorded batches a rebuilt session took as its own (another tuner version made"
            " them: an upgrade while the task ran)",
            registry=r,
        )
        self.tasks_finished = Counter(
            "pipetune_tasks_finished_total",
            "Tasks that reached an end state",
            ["state"],
            registry=r,
        )
        # Thread CPU time of the tuner's proposals (model fits, acquisition): what a strategy
        # costs the service per batch, apart from serving requests.
        self.proposal_cpu = Counter(
            "pipetune_proposal_cpu_seconds_total",
            "CPU seconds spent proposing trials (the tuner's model fits and acquisition)",
            ["strategy"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "pipetune_http_request_duration_seconds",
            "HTTP request latency by route",
            ["method", "route", "status"],
            buckets=REQUEST_BUCKETS_S,
            registry=r,
        )
        # Where the replica's CPU goes, by thread (read at each scrape).
        self.thread_cpu = ThreadCpu()
        self.registry.register(self.thread_cpu)

        if db is not None:
            self.registry.register(DatabaseGauges(db, live_within_s))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
