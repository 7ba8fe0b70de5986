"""A small run of the load benchmark (python -m benchmarks.bench_load) as a correctness check:
two `pipetune serve` replicas on one fresh PostgreSQL database, simulated HTTP workers
spread over both, three tasks run to their budget. No job may be leased twice at once or
lost, and every result must be counted exactly once. No timing is asserted.

With worker churn: workers die holding a job (never answering it), replacements register,
the abandoned leases expire (lease TTL 2 s) and their jobs are leased again and finished
exactly once.

Also: the benchmark's audit itself tells an overlapping lease from a re-lease after expiry,
and an abandoned job finished by a later lease from one never finished (otherwise a clean
run would prove nothing)."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
import time
from types import SimpleNamespace

import pytest
from service_support import require_pg

from benchmarks.bench_load import as_json, run_load
from benchmarks.harness import PostgresCpu
from benchmarks.load_audit import find_churn, find_duplicates, find_lost
from benchmarks.load_driver import Held, LoadConfig

TASKS, BUDGET, BATCH = 3, 24, 8


@pytest.fixture
def pg_admin_url() -> str:
    return require_pg()


def _assert_every_trial_counted_once(report: dict, details: dict) -> None:
    """No duplicate, nothing lost, nothing gone wrong quietly, every task at its budget."""
    assert report["duplicate_leases"] == 0, details
    assert report["lost_jobs"] == 0, details
    assert report["http_errors"] == {}, details
    # Two replicas racing to advance a task once logged a traceback here (service/driver.py).
    assert report["service_tracebacks"] == 0, details
    assert report["tasks_done"] == TASKS, details
    assert report["results_accepted"] == TASKS * BUDGET, details
    assert report["results_db"] == report["trials_done_db"] == TASKS * BUDGET, details
    assert report["results_counted_once"], details


@pytest.mark.parametrize("replicas", [2, 1])
def test_small_load_leases_each_job_once_and_loses_none(replicas: int, pg_admin_url: str) -> None:
    # A generous time cap: the run ends as soon as every task is done (a few seconds).
    config = LoadConfig(
        replicas=replicas,
        workers=8,
        tasks=TASKS,
        budget=BUDGET,
        batch_size=BATCH,
        seconds=90,
        wait_s=0.5,
    )
    report = run_load(pg_admin_url, config)
    keys = ("duplicates", "lost", "job_states", "http_errors", "service_errors")
    details = {k: report[k] for k in keys}

    _assert_every_trial_counted_once(report, details)
    # No lease expired in the run (TTL 120 s): one lease per trial, each answered.
    assert report["leases"] == report["lease_rows"] == TASKS * BUDGET
    assert report["results_refused"] == report["results_unanswered"] == 0
    assert report["abandoned"] == report["leases_expired"] == report["re_leases"] == 0


def test_small_load_with_churn_re_leases_abandoned_jobs_once(pg_admin_url: str) -> None:
    # Each job received kills its worker with probability 0.1 (seeded: 3 deaths among the
    # first 72 jobs received, whatever the timing); a replacement takes its place.
    config = LoadConfig(
        replicas=2,
        workers=8,
        tasks=TASKS,
        budget=BUDGET,
        batch_size=BATCH,
        seconds=40,
        wait_s=0.5,
        lease_ttl_s=2.0,
        churn=0.1,
        seed=0,
    )
    assert config.sweep_interval_s == 0.5 and config.max_attempts == 50
    report = run_load(pg_admin_url, config)
    keys = (
        "duplicates",
        "lost",
        "job_states",
        "http_errors",
        "service_errors",
        "abandoned",
        "abandoned_expired",
        "leases_expired",
        "live_leases_expired",
        "re_leases",
        "re_leased_jobs",
        "re_leased_one_result",
        "lease_rows",
        "leases",
    )
    details = {k: report[k] for k in keys}

    _assert_every_trial_counted_once(report, details)
    # Churn happened (not vacuous), every abandoned lease expired, and each expiry was
    # followed by a re-lease: one lease per trial plus one per re-lease, all received.
    assert report["abandoned"] >= 3, details
    assert report["workers_registered"] == config.workers + report["abandoned"], details
    assert report["abandoned_expired"] == report["abandoned"], details
    assert report["leases_expired"] >= report["abandoned"], details
    assert report["re_leases"] == report["leases_expired"], details
    assert report["lease_rows"] == report["leases"] == TASKS * BUDGET + report["re_leases"]
    assert report["re_leased_jobs"] > 0, details
    assert report["re_leased_one_result"] == report["re_leased_jobs"], details
    assert report["results_unanswered"] == 0, details


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _job(
    id: int,
    trial: int,
    state: str,
    result_token: str | None = None,
    task_id: int = 1,
    lease_token: str | None = None,
    lease_expires_at: float | None = None,
):
    return SimpleNamespace(
        id=id,
        task_id=task_id,
        trial=trial,
        state=state,
        lease_token=lease_token,
        lease_expires_at=None if lease_expires_at is None else _at(lease_expires_at),
        result_token=result_token,
    )


def _lease(id: int, job_id: int, token: str, start: float, outcome: str | None, end=None):
    ended = None if end is None else _at(end)
    return SimpleNamespace(
        id=id, job_id=job_id, token=token, leased_at=_at(start), outcome=outcome, ended_at=ended
    )


def _task(trials_done: int, enqueued: int, state: str = "done", target: int = 3):
    return SimpleNamespace(
        id=1,
        state=state,
        trials_target=target,
        trials_enqueued=enqueued,
        trials_done=trials_done,
    )


def test_audit_counts_overlapping_leases_not_re_leases_after_expiry() -> None:
    jobs = [_job(1, 0, "done", "b"), _job(2, 1, "done", "d"), _job(3, 2, "done", "e")]
    clean = [
        _lease(1, 1, "a", 0, "expired", 10),  # expired, reclaimed at 10 s ...
        _lease(2, 1, "b", 11, "result", 12),  # ... and leased again: not a duplicate
        _lease(3, 2, "d", 1, "result", 2),
        _lease(4, 3, "e", 1, "result", 3),
    ]
    duplicates = find_duplicates(clean, [])
    assert duplicates.count == 0, duplicates
    lost = find_lost(jobs, clean, [_task(3, 3)], [])
    assert lost.count == 0, lost

    overlapping = [*clean[:3], _lease(4, 3, "e", 1, "result", 3), _lease(5, 3, "f", 2, None)]
    duplicates = find_duplicates(overlapping, [])
    assert duplicates.overlapping == {3}
    assert duplicates.count == 1

    twice = [*clean[:3], _lease(4, 3, "e", 1, "result", 3), _lease(5, 3, "f", 4, "result", 5)]
    assert find_duplicates(twice, []).count == 1

    held = [Held(3, "e", 7, 1.0, 3.0, True), Held(3, "f", 8, 2.0, 4.0, False)]
    assert find_duplicates(clean, held).held_twice == {3}


def test_audit_counts_every_overlap_of_lease_intervals() -> None:
    # A re-lease stamped before its predecessor ended is an overlap, whatever the outcome
    # (the service stamps statement times, so a legitimate re-lease never looks like it).
    jobs = [_job(1, 0, "done", "b")]
    early = [_lease(1, 1, "a", 0, "expired", 10.0), _lease(2, 1, "b", 9.9, "result", 12)]
    assert find_duplicates(early, []).overlapping == {1}
    after = [_lease(1, 1, "a", 0, "expired", 10.0), _lease(2, 1, "b", 10.0, "result", 12)]
    assert find_duplicates(after, []).count == 0 and find_churn(jobs, after, []).re_leases == 1
    # A lease granted while its predecessor was live: the reclaim ends both at once.
    both = [_lease(1, 1, "a", 0, "expired", 10.0), _lease(2, 1, "b", 5, "expired", 10.0)]
    assert find_duplicates(both, []).overlapping == {1}
    # ... or the predecessor is never ended (its result was refused).
    open_ = [_lease(1, 1, "a", 0, None), _lease(2, 1, "b", 5, "result", 6)]
    assert find_duplicates(open_, []).overlapping == {1}
    # A predecessor that ended with a result: the job leased again is a duplicate.
    after_result = [_lease(1, 1, "a", 0, "result", 10.0), _lease(2, 1, "b", 9.9, "result", 12)]
    assert find_duplicates(after_result, []).count == 1


def test_audit_accounts_for_abandoned_leases() -> None:
    # Worker 7 died holding job 1 (lease "a"); the lease expired and worker 8 finished it.
    jobs = [_job(1, 0, "done", "b"), _job(2, 1, "done", "c")]
    leases = [
        _lease(1, 1, "a", 0, "expired", 5),
        _lease(2, 1, "b", 6, "result", 7),
        _lease(3, 2, "c", 1, "result", 2),
    ]
    held = [
        Held(1, "a", 7, 0.0, abandoned=True),
        Held(1, "b", 8, 6.0, 7.0, True),
        Held(2, "c", 9, 1.0, 2.0, True),
    ]
    duplicates = find_duplicates(leases, held)
    assert duplicates.count == 0, duplicates  # a dead worker holds nothing
    lost = find_lost(jobs, leases, [_task(2, 2, target=2)], held)
    assert lost.count == 0, lost
    churn = find_churn(jobs, leases, held)
    assert churn.abandoned == churn.abandoned_expired == 1
    assert churn.leases_expired == churn.re_leases == 1
    assert churn.live_leases_expired == 0
    assert churn.re_leased_jobs == churn.re_leased_one_result == 1

    # The same abandoned lease, its job never finished (requeued) though its task ended:
    # lost.
    jobs = [_job(1, 0, "queued"), _job(2, 1, "done", "c")]
    leases = [_lease(1, 1, "a", 0, "expired", 5), _lease(3, 2, "c", 1, "result", 2)]
    held = [Held(1, "a", 7, 0.0, abandoned=True), Held(2, "c", 9, 1.0, 2.0, True)]
    lost = find_lost(jobs, leases, [_task(1, 2, "failed", 2)], held)
    assert lost.abandoned_unfinished == {1}
    assert lost.unanswered == set()
    assert lost.count == 1 and lost.unfinished == set()

    # ... or still leased to the dead worker (its lease never expired): lost twice over.
    jobs = [_job(1, 0, "leased", lease_token="a"), _job(2, 1, "done", "c")]
    leases = [_lease(1, 1, "a", 0, None), _lease(3, 2, "c", 1, "result", 2)]
    lost = find_lost(jobs, leases, [_task(1, 2, "failed", 2)], held)
    assert lost.still_leased == {1}
    assert lost.abandoned_unfinished == {1}
    assert find_churn(jobs, leases, held).abandoned_expired == 0
    assert lost.count == 1


def test_a_dead_workers_job_of_a_task_the_run_ended_before_is_unfinished_not_lost() -> None:
    """The run's time limit came before the task's end: the job a dead worker abandoned was
    waiting for its lease to expire, or, expired and queued again, for a worker. The service
    would have leased it again; the run did not wait. A model-guided task with churn waits
    out a TTL for each abandoned lease of each batch, so the default run of
    `--strategy analytical+xgb --churn 0.05 --batched` ended with 8 such jobs counted lost.
    Only near the run's end, within `grace` (the TTL): a dead worker's lease long expired
    and still held, or a job queued long before and never leased again, is lost."""
    ttl = dt.timedelta(seconds=5)
    held = [Held(1, "a", 7, 0.0, abandoned=True), Held(2, "c", 9, 1.0, 2.0, True)]
    running = [_task(1, 2, "running", 2)]
    for state, token, expires, outcome in (
        ("leased", "a", 5.0, None),  # still held by the dead worker's lease at the end
        ("queued", None, None, "expired"),  # expired at 5 s and queued again
    ):
        jobs = [
            _job(1, 0, state, lease_token=token, lease_expires_at=expires),
            _job(2, 1, "done", "c"),
        ]
        for last, unfinished in ((2, True), (100, False)):  # the run's last lease activity
            leases = [
                _lease(1, 1, "a", 0, outcome, 5 if outcome else None),
                _lease(3, 2, "c", 1, "result", last),
            ]
            lost = find_lost(jobs, leases, running, held, grace=ttl)
            assert lost.unfinished == ({1} if unfinished else set()), (state, last, lost)
            assert lost.count == (0 if unfinished else 1), (state, last, lost)
    # Leased at the end under a live worker's lease: that worker's answer is missing, lost.
    held = [Held(1, "a", 7, 0.0, abandoned=True), Held(1, "b", 8, 6.0)]
    jobs = [_job(1, 0, "leased", lease_token="b", lease_expires_at=11)]
    leases = [_lease(1, 1, "a", 0, "expired", 5), _lease(2, 1, "b", 6, None)]
    lost = find_lost(jobs, leases, [_task(0, 1, "running", 1)], held, grace=ttl)
    assert lost.still_leased == {1} and lost.unanswered == {1}
    assert lost.unfinished == set() and lost.count == 1


def test_audit_counts_lost_and_stranded_jobs_and_short_tasks() -> None:
    leases = [_lease(1, 1, "a", 0, "result", 1), _lease(2, 2, "b", 0, None)]
    jobs = [_job(1, 0, "done", "a"), _job(2, 1, "leased"), _job(3, 2, "lost")]
    lost = find_lost(jobs, leases, [_task(2, 3, state="running")], [])
    assert lost.state_lost == {3}
    assert lost.still_leased == {2}
    assert lost.count == 2

    # A task marked done with fewer trials than its target.
    jobs = [_job(1, 0, "done", "a")]
    assert find_lost(jobs, leases[:1], [_task(1, 1)], []).bad_tasks == (1,)

    # A worker's accepted result the database does not hold.
    held = [Held(1, "z", 7, 0.0, 1.0, True)]
    lost = find_lost([_job(1, 0, "done", "a")], leases[:1], [_task(1, 1, target=1)], held)
    assert lost.not_in_db == {1}


def test_measurements_spread_log_normally_around_their_mean_and_replay_by_seed() -> None:
    """--measure-spread: each simulated measurement's duration is log-normal with mean
    --measure-ms (a batch of trials then waits on its slowest); 0 keeps them all equal."""
    from benchmarks.load_driver import LoadRun

    equal = LoadRun(["http://127.0.0.1:9"], LoadConfig(measure_ms=100.0))
    assert equal.measure_s() == 0.1 and equal.measure_s(3) == pytest.approx(0.3)
    config = LoadConfig(measure_ms=100.0, measure_spread=1.0, seed=4)
    draws = [LoadRun(["http://127.0.0.1:9"], config) for _ in range(2)]
    first = [draws[0].measure_s() for _ in range(20_000)]
    assert first[:50] == [draws[1].measure_s() for _ in range(50)]
    assert sum(first) / len(first) == pytest.approx(0.1, rel=0.05)
    assert max(first) > 1.0 and min(first) < 0.01  # a spread of 1: tenfold either way


def test_a_run_sets_the_replicas_early_proposals_and_proposer_threads_only_when_asked() -> None:
    from benchmarks.load_driver import replica_settings

    assert "PIPETUNE_PROPOSE_EARLY" not in replica_settings(LoadConfig())
    assert "PIPETUNE_PROPOSER_THREADS" not in replica_settings(LoadConfig())
    assert replica_settings(LoadConfig(proposer_threads=2))["PIPETUNE_PROPOSER_THREADS"] == "2"
    early = replica_settings(LoadConfig(propose_early=0.25))
    assert early["PIPETUNE_PROPOSE_EARLY"] == "0.25"


def test_the_watcher_reads_the_task_list_once_every_result_is_in(monkeypatch) -> None:
    """The run's watcher reads GET /v1/tasks (a request the service's CPU figure would count)
    at once when every trial has an accepted result. Before that, every WATCH_FALLBACK_S
    (which ends a run whose tasks finished short of their budget), it asks only whether any
    task is active, one row per active state, and reads the whole list once none is."""
    import asyncio

    from benchmarks import load_driver
    from benchmarks.load_driver import LoadRun
    from pipetune.model.states import TaskState

    monkeypatch.setattr(load_driver, "WATCH_TICK_S", 0.01)
    monkeypatch.setattr(load_driver, "WATCH_FALLBACK_S", 1.5)

    class Tasks:
        status_code = 200

        def __init__(self, final: bool, params: dict):
            self.final, self.params = final, params

        def json(self) -> dict:
            state = TaskState.DONE if self.final else TaskState.RUNNING
            tasks = [{"id": 1, "state": state}, {"id": 2, "state": state}]
            if "state" in self.params:  # the service's filter and limit
                tasks = [t for t in tasks if t["state"] == self.params["state"]]
            return {"tasks": tasks[: self.params["limit"]]}

    async def scenario(all_in: bool, final_after_s: float) -> tuple[int, int, int, float]:
        run = LoadRun(["http://127.0.0.1:9"], LoadConfig(tasks=2, budget=4, seconds=30))
        whole: list[float] = []
        checks: list[str] = []
        began = time.monotonic()

        async def get(path: str, params: dict) -> Tasks:
            assert path == "/v1/tasks"
            if "state" in params:
                assert params["limit"] == 1 and not TaskState(params["state"]).is_final()
                checks.append(params["state"])
            else:
                whole.append(time.monotonic())
            return Tasks(time.monotonic() - began >= final_after_s, params)

        run.clients[0].get = get  # type: ignore[method-assign]
        watcher = asyncio.create_task(run.watch([1, 2]))
        await asyncio.sleep(0.5)  # results still coming in
        early = len(whole) + len(checks)
        if all_in:
            run.tally.accepted = 8  # every trial's result accepted
        # (else a task gave up on a job and finished short: the fallback read finds it)
        await asyncio.wait_for(watcher, 6)
        await run.close()
        return early, len(whole), len(checks), time.monotonic() - began

    early, whole, checks, took = asyncio.run(scenario(all_in=True, final_after_s=0.5))
    assert early == 0 and whole == 1 and checks == 0 and took < 1.3  # at once
    early, whole, checks, took = asyncio.run(scenario(all_in=False, final_after_s=0.5))
    # At the fallback (1.5 s): no task active (queued, running), then the list, once.
    assert early == 0 and whole == 1 and checks == 2 and 1.4 <= took < 3.0
    early, whole, checks, took = asyncio.run(scenario(all_in=False, final_after_s=2.0))
    # At 1.5 s a task is still running: no list; at 3.0 s none is: the list, once.
    assert early == 0 and whole == 1 and 3 <= checks <= 4 and 2.9 <= took < 4.5


def test_each_simulated_worker_has_a_client_of_its_own_on_its_replica() -> None:
    """A worker daemon holds its own HTTP client; so does each simulated worker. One client
    shared by every worker of a replica cost the load generator CPU per request in proportion
    to the workers (its connection pool is scanned for each request): at 1,000 workers the
    generator, not the service, set the pace."""
    import asyncio

    from benchmarks.load_driver import LoadRun, SimulatedWorker

    async def scenario() -> None:
        bases = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
        run = LoadRun(bases, LoadConfig(workers=4))
        workers = [SimulatedWorker(run, slot, worker_id=slot + 1) for slot in range(4)]
        clients = [w.client for w in workers]
        assert len({id(c) for c in clients}) == 4
        assert not any(c is h for c in clients for h in run.clients)
        assert [str(c.base_url).rstrip("/") for c in clients] == bases * 2
        await run.close()
        assert all(c.is_closed for c in clients)

    asyncio.run(scenario())


def test_the_replicas_let_a_lease_request_wait_as_long_as_the_run_asks() -> None:
    from benchmarks.load_driver import replica_settings

    assert float(replica_settings(LoadConfig())["PIPETUNE_LEASE_WAIT_CAP_S"]) == 10.0
    longer = replica_settings(LoadConfig(wait_s=30.0))
    assert float(longer["PIPETUNE_LEASE_WAIT_CAP_S"]) == 30.0


def test_postgres_cpu_of_a_server_out_of_sight_is_not_measured(monkeypatch) -> None:
    # A database whose server's processes /proc does not show (another host, another
    # container): nothing is measured, and the figure must not read 0 ms per result.
    with PostgresCpu("no_such_database_here") as unseen:
        assert math.isnan(unseen.seconds())
    # A backend in sight (this process standing in for one) is counted from the start.
    monkeypatch.setattr(PostgresCpu, "_backends", lambda self: [str(os.getpid())])
    with PostgresCpu("any") as seen:
        spent = time.process_time()
        while time.process_time() - spent < 0.05:
            pass
        assert seen.seconds() >= 0.0


def test_the_cpu_counted_includes_creating_the_tasks(monkeypatch) -> None:
    """Creating a task builds its session and proposes its first batches (about 11 ms of a
    replica's CPU per task): the replicas' CPU per result counts it, as it counts the later
    proposals; the workers' registration (once per worker daemon) stays out."""
    import asyncio

    from benchmarks.load_driver import LoadRun, SimulatedWorker, drive

    events: list[str] = []

    async def create_tasks(self) -> list[int]:
        events.append("create tasks")
        return [1]

    async def register(self, client, name: str) -> int:
        events.append("register")
        return len(events)

    async def watch(self, task_ids: list[int]) -> None:
        self.tally.all_done_after_s = 0.0
        self.stop.set()

    async def work(self) -> None:
        events.append("work")

    monkeypatch.setattr(LoadRun, "create_tasks", create_tasks)
    monkeypatch.setattr(LoadRun, "register", register)
    monkeypatch.setattr(LoadRun, "watch", watch)
    monkeypatch.setattr(SimulatedWorker, "work", work)

    def cpu() -> dict[str, float]:
        events.append("cpu")
        return {"service": float(len(events))}

    config = LoadConfig(workers=2, tasks=1)
    asyncio.run(drive(["http://127.0.0.1:9"], config, cpu))
    first_cpu = events.index("cpu")
    assert (
        events.index("create tasks")
        > first_cpu
        > max(i for i, e in enumerate(events) if e == "register")
    )


def test_the_load_generators_cpu_leaves_out_its_measuring_thread(monkeypatch) -> None:
    """PostgresCpu walks /proc every 0.2 s in a thread of the load generator's process (about
    7 ms of CPU a second at 100 processes: most of an idle fleet's generator figure); the
    generator's CPU is the process's less that thread's."""
    import asyncio
    import threading

    from benchmarks.load_driver import LoadRun, SimulatedWorker, drive

    burnt: list[float] = [0.0]

    def measure() -> None:  # a measuring thread that spends 0.3 s of CPU
        began = time.thread_time()
        while time.thread_time() - began < 0.3:
            pass
        burnt[0] = time.thread_time()

    async def create_tasks(self) -> list[int]:
        return [1]

    async def register(self, client, name: str) -> int:
        return 1

    async def watch(self, task_ids: list[int]) -> None:
        thread = threading.Thread(target=measure)
        thread.start()
        await asyncio.to_thread(thread.join)
        self.tally.all_done_after_s = 0.0
        self.stop.set()

    async def work(self) -> None:
        pass

    monkeypatch.setattr(LoadRun, "create_tasks", create_tasks)
    monkeypatch.setattr(LoadRun, "register", register)
    monkeypatch.setattr(LoadRun, "watch", watch)
    monkeypatch.setattr(SimulatedWorker, "work", work)

    def cpu() -> dict[str, float]:
        return {"service": 0.0, "measuring": burnt[0]}  # as bench_load's cpu() names it

    _, _, figures = asyncio.run(drive(["http://127.0.0.1:9"], LoadConfig(workers=1, tasks=1), cpu))
    assert figures["generator_cpu_s"] < 0.15
    # PostgresCpu says how much its sampling thread used.
    with PostgresCpu("no_such_database_here", every_s=0.01) as sampler:
        time.sleep(0.3)
        assert sampler.own_seconds() > 0


def test_a_run_without_results_gives_no_figure_per_result(pg_admin_url: str) -> None:
    # No worker leased anything: the replicas' CPU over the run is not a cost per result
    # (it read as 50 ms "per result", the run's whole CPU divided by 1).
    config = LoadConfig(replicas=1, workers=0, tasks=1, budget=8, seconds=1.0)
    report = run_load(pg_admin_url, config)
    assert report["results_accepted"] == report["results_db"] == 0
    for key in ("service_cpu_ms_per_result", "proposal_cpu_ms_per_result"):
        assert math.isnan(report[key]), key
    assert math.isnan(report["generator_cpu_ms_per_result"])
    assert all(math.isnan(v) for v in report["service_cpu_ms_per_result_by_thread"].values())
    figures = json.loads(json.dumps(as_json(report), allow_nan=False))
    assert figures["service_cpu_ms_per_result"] is None
    assert set(figures["service_cpu_ms_per_result_by_thread"].values()) == {None}


@pytest.mark.parametrize(
    "argv",
    [
        ["--replicas", "0"],
        ["--workers", "0"],
        ["--tasks", "0"],
        ["--budget", "0"],
        ["--batched", "--max-jobs", "0"],
        ["--churn", "1"],
        ["--churn", "-0.1"],
        ["--seconds", "0"],
        ["--idle-seconds", "-1"],
        ["--measure-ms", "nan"],
    ],
)
def test_the_command_refuses_settings_a_run_cannot_have(argv, monkeypatch, capsys) -> None:
    # Refused by name before any run, where --replicas 0 divided by zero, --churn 1 and
    # --budget 0 ended in a traceback, and --max-jobs 0 ran with 8.
    from benchmarks import bench_load

    def no_run(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(bench_load, "run_load", no_run)
    monkeypatch.setattr(sys, "argv", ["bench_load", "--json", *argv])
    with pytest.raises(SystemExit) as exc:
        bench_load.main()
    assert exc.value.code == 2
    assert argv[-2] in capsys.readouterr().err
