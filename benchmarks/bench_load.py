"""Load benchmark: many simulated workers against many concurrent tasks on PostgreSQL, with
one service replica or several sharing the database; leases/s, results/s, lease latency,
and a correctness audit (duplicate leases and lost jobs, both must be 0).

Each run gets a fresh PostgreSQL database. The replicas are `pipetune serve` child
processes on loopback ports (the first builds the empty schema; the next starts once it is
healthy). Tasks are created round-robin on the replicas, with a finite budget: the run
ends when every task is done or after --seconds, whichever comes first. Workers are
simulated HTTP clients in this process (httpx, asyncio), spread round-robin over the
replicas: each registers, long-polls for one job at a time, optionally sleeps
--measure-ms, and posts a made-up result; it always posts the job it holds before it
stops, so at the end no job may be left leased. While it holds a job a worker heartbeats
every TTL/4 (the heartbeat extends its leases by a TTL; with the default 120 s TTL no
heartbeat is ever due).

Churn (--churn FRACTION): each time a worker receives a job it dies with that probability
(one seeded RNG, drawn once per job received, in the order the jobs arrive: the number of
deaths among the first N jobs is the same in every run). A dead worker never reports its
job and never polls or heartbeats again; a replacement registers under a new name on the
same replica and takes its place, so the number of live workers stays constant. The
abandoned lease must expire by the database clock and the job be leased again by another
worker. Churn runs use a short lease TTL (--lease-ttl, default 5 s), a 0.5 s upkeep sweep
(PIPETUNE_SWEEP_INTERVAL_S) and PIPETUNE_MAX_ATTEMPTS=50, so that no job is given up as
`lost` by design (that would take 50 expiries of one job in a row): any lost job is a
fault. The TTL is 5 s rather than 2 s because at 64 closed-loop workers on 2 cores a
live worker's result can take more than 2 s from its lease's grant to the database (then
its lease expires while it holds the job, and heartbeats, which queue behind the same busy
replicas, do not save it); at light load (the small test) 2 s is safe.

After the run the services are stopped and the database is audited read-only:

* duplicate leases: jobs that two leases held at once (the lease audit table's intervals
  overlap; a lease that expired and was re-granted later is not one), jobs with two
  recorded results, and jobs two live workers held at once by their own clocks (a dead
  worker holds nothing);
* lost jobs: jobs given up as `lost`, jobs still leased (granted, never answered), leases
  a live worker received whose result was not recorded, abandoned leases whose job was
  not finished by a later lease, accepted results the database does not hold, and tasks
  whose trial counts disagree with their jobs (a finished task must have exactly its
  target number of trials, 0..target-1, each once);
* churn: leases abandoned, leases expired (audit table; abandoned ones must all end
  `expired`), re-leases (a lease granted after the job's previous lease expired), and
  whether every re-leased job holds exactly one result.

    python benchmarks/bench_load.py                    # no churn and churn 0.05, 1 and 2 replicas
    python benchmarks/bench_load.py --write            # and record in RESULTS.md
    python benchmarks/bench_load.py --replicas 2 --seconds 10
    python benchmarks/bench_load.py --churn 0.1 --lease-ttl 2 --replicas 2

Exits 1 when any run has a duplicate lease or a lost job.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import functools
import itertools
import math
import os
import random
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_service import (
    DEFAULT_PG,
    HEADERS,
    _cpu_s,
    _fake_result,
    _pct,
    _register,
    pg_database,
    service_process,
)
from benchmarks.results import write_section
from pipetune.service.orm import JobRow, LeaseRow, TaskRow

FINAL_TASK = ("done", "failed", "cancelled")
FINAL_JOB = ("done", "failed", "lost")
POST_TRIES = 3
KEEPALIVE_S = 2.0
FOREVER = dt.datetime.max.replace(tzinfo=dt.UTC)  # the end of a live lease
DEFAULT_CHURN = (0.0, 0.05)  # main's runs: without churn and with
CHURN_TTL_S = 5.0  # the lease TTL of churn runs (main's default; 2 s lets live leases expire)
CHURN_SWEEP_S = 0.5  # upkeep sweep of churn runs: expired leases are requeued promptly
CHURN_MAX_ATTEMPTS = 50  # expiries before a job is given up: never, by design


@dataclass
class LoadConfig:
    replicas: int = 1
    workers: int = 64
    tasks: int = 20
    budget: int = 120
    seconds: float = 90.0
    batch_size: int = 8
    strategy: str = "random"
    measure_ms: float = 0.0
    wait_s: float = 1.0
    lease_ttl_s: float = 120.0
    keep_logs: bool = True
    # Each job received kills its worker with this probability (a replacement registers).
    churn: float = 0.0
    seed: int = 0  # of the churn draws
    # While a worker holds a job it heartbeats this often (None: a quarter of the TTL).
    heartbeat_s: float | None = None
    # The replicas' PIPETUNE_SWEEP_INTERVAL_S and PIPETUNE_MAX_ATTEMPTS; None: the
    # service's defaults (2 s, 3) without churn, CHURN_SWEEP_S and CHURN_MAX_ATTEMPTS
    # with churn.
    sweep_interval_s: float | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.churn < 1:
            raise ValueError(f"churn must be in [0, 1), got {self.churn}")
        if self.churn > 0:
            if self.sweep_interval_s is None:
                self.sweep_interval_s = CHURN_SWEEP_S
            if self.max_attempts is None:
                self.max_attempts = CHURN_MAX_ATTEMPTS
        if self.heartbeat_s is None:
            self.heartbeat_s = self.lease_ttl_s / 4


@dataclass
class Held:
    """One lease a worker received, and what became of its result."""

    job_id: int
    token: str
    worker: int
    received: float
    answered: float | None = None
    accepted: bool | None = None
    detail: str | None = None
    abandoned: bool = False  # its worker died holding it (churn): never answered


@dataclass
class Tally:
    held: list[Held] = field(default_factory=list)
    lease_granted_s: list[float] = field(default_factory=list)
    lease_empty_s: list[float] = field(default_factory=list)
    result_s: list[float] = field(default_factory=list)
    errors: collections.Counter = field(default_factory=collections.Counter)
    all_done_after_s: float | None = None
    registered: int = 0  # workers registered, replacements included
    heartbeats: int = 0  # answered 200


def workload(i: int) -> dict:
    """The i-th task's GEMM: distinct shapes, each with a 2840-schedule space on h100."""
    return {"op": "gemm", "m": 1024 + 256 * i, "n": 1024, "k": 2048}


@contextmanager
def serve(url: str, config: LoadConfig, log_dir: Path, index: int):
    """`pipetune serve` replica number `index`; yields (base URL, pid, log path)."""
    settings = {
        "PIPETUNE_BATCH_SIZE": str(config.batch_size),
        "PIPETUNE_LEASE_TTL_S": str(config.lease_ttl_s),
    }
    if config.sweep_interval_s is not None:
        settings["PIPETUNE_SWEEP_INTERVAL_S"] = str(config.sweep_interval_s)
    if config.max_attempts is not None:
        settings["PIPETUNE_MAX_ATTEMPTS"] = str(config.max_attempts)
    log = log_dir / f"serve-{index}.log"
    with service_process(url, log, settings) as service:
        assert service.process is not None
        yield service.url, service.process.pid, log


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine (Linux /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


async def _post_result(client: httpx.AsyncClient, worker: int, job: dict, tally: Tally, h):
    body = {"worker_id": worker, "lease_token": job["lease_token"], "result": _fake_result(job)}
    for attempt in range(POST_TRIES):
        started = time.perf_counter()
        try:
            response = await client.post(
                f"/v1/jobs/{job['job_id']}/result", json=body, headers=HEADERS
            )
        except httpx.HTTPError as exc:
            tally.errors[f"result: {type(exc).__name__}"] += 1
        else:
            if response.status_code == 200:
                tally.result_s.append(time.perf_counter() - started)
                ack = response.json()
                h.answered, h.accepted, h.detail = time.monotonic(), ack["accepted"], ack["detail"]
                return
            tally.errors[f"result: HTTP {response.status_code}"] += 1
        await asyncio.sleep(0.2 * (attempt + 1))  # a real worker retries: results are idempotent
    h.answered = time.monotonic()  # given up: the worker holds the job no longer


async def _register_retrying(client: httpx.AsyncClient, name: str, tally: Tally) -> int:
    """Register a worker, retrying transport errors and non-200 answers a few times."""
    for attempt in range(POST_TRIES):
        try:
            worker_id = await _register(client, name)
        except httpx.HTTPStatusError as exc:
            tally.errors[f"register: HTTP {exc.response.status_code}"] += 1
        except httpx.HTTPError as exc:
            tally.errors[f"register: {type(exc).__name__}"] += 1
        else:
            tally.registered += 1
            return worker_id
        await asyncio.sleep(0.2 * (attempt + 1))
    return await _register(client, name)  # the last try raises: the run cannot go on


async def _heartbeats(
    client: httpx.AsyncClient, worker: int, every: float, done: asyncio.Event, tally: Tally
) -> None:
    """Heartbeat now, then every `every` seconds until `done` (the job's result is
    answered): a heartbeat extends the worker's unexpired leases by one TTL."""
    while not done.is_set():
        try:
            response = await client.post(
                f"/v1/workers/{worker}/heartbeat", json={"busy_jobs": 1}, headers=HEADERS
            )
        except httpx.HTTPError as exc:
            tally.errors[f"heartbeat: {type(exc).__name__}"] += 1
        else:
            if response.status_code == 200:
                tally.heartbeats += 1
            else:
                tally.errors[f"heartbeat: HTTP {response.status_code}"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), every)


async def _drive(bases: list[str], config: LoadConfig) -> tuple[Tally, float, dict]:
    """Create the tasks, run the workers, return (tally, window seconds, CPU figures)."""
    tally = Tally()
    # Idle connections are dropped after 2 s, before uvicorn's 5 s keep-alive closes them:
    # at equal timeouts a request sent on a connection idle ~5 s can meet the server's close
    # (ReadError / RemoteProtocolError), a client artefact rather than the service's.
    # Room for a heartbeat beside each worker's request.
    limits = httpx.Limits(
        max_connections=2 * config.workers + 8,
        max_keepalive_connections=None,
        keepalive_expiry=KEEPALIVE_S,
    )
    clients = [httpx.AsyncClient(base_url=b, timeout=60, limits=limits) for b in bases]
    # One RNG, drawn once per job received, in the order jobs arrive (one event loop): the
    # deaths among the first N jobs are the same in every run with the same seed.
    rng = random.Random(config.seed)
    beating: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()

    def start_beating(beats) -> None:
        beat = loop.create_task(beats())
        beating.add(beat)
        beat.add_done_callback(beating.discard)

    try:
        task_ids = []
        for i in range(config.tasks):
            body = {"workload": workload(i), "gpu": "h100", "budget": config.budget}
            body.update(strategy=config.strategy, seed=i)
            response = await clients[i % len(clients)].post("/v1/tasks", json=body)
            response.raise_for_status()
            task_ids.append(response.json()["id"])
        run = uuid.uuid4().hex[:6]
        workers = [
            await _register_retrying(clients[w % len(clients)], f"load-{run}-{w}", tally)
            for w in range(config.workers)
        ]
        stop = asyncio.Event()
        began = time.monotonic()
        deadline = began + config.seconds

        async def monitor() -> None:
            wanted = set(task_ids)
            while not stop.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                try:
                    response = await clients[0].get("/v1/tasks", params={"limit": 1000})
                    tasks = response.json()["tasks"] if response.status_code == 200 else []
                except httpx.HTTPError:
                    continue
                if wanted <= {t["id"] for t in tasks if t["state"] in FINAL_TASK}:
                    tally.all_done_after_s = time.monotonic() - began
                    stop.set()

        async def worker(slot: int) -> None:
            """One worker's place: a worker, then each replacement when it dies."""
            worker_id, client, generation = workers[slot], clients[slot % len(clients)], 0
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                lease = {"worker_id": worker_id, "max_jobs": 1, "wait_s": min(config.wait_s, left)}
                started = time.perf_counter()
                try:
                    response = await client.post("/v1/jobs/lease", json=lease, headers=HEADERS)
                except httpx.HTTPError as exc:
                    tally.errors[f"lease: {type(exc).__name__}"] += 1
                    await asyncio.sleep(0.2)
                    continue
                took = time.perf_counter() - started
                if response.status_code != 200:
                    tally.errors[f"lease: HTTP {response.status_code}"] += 1
                    await asyncio.sleep(0.2)
                    continue
                jobs = response.json()["jobs"]
                (tally.lease_granted_s if jobs else tally.lease_empty_s).append(took)
                for job in jobs:
                    h = Held(job["job_id"], job["lease_token"], worker_id, time.monotonic())
                    tally.held.append(h)
                    if config.churn > 0 and rng.random() < config.churn:
                        break  # dies holding it: no result, no heartbeat, no poll
                    # Heartbeats start only if the job is still held after heartbeat_s.
                    done = asyncio.Event()
                    beats = functools.partial(
                        _heartbeats, client, worker_id, config.heartbeat_s, done, tally
                    )
                    timer = loop.call_later(config.heartbeat_s, start_beating, beats)
                    try:
                        if config.measure_ms > 0:
                            await asyncio.sleep(config.measure_ms / 1e3)
                        # Posted even past the deadline: a worker answers the job it holds.
                        await _post_result(client, worker_id, job, tally, h)
                    finally:
                        done.set()
                        timer.cancel()
                else:
                    continue
                # The worker died: its job is abandoned (max_jobs is 1: it held only this
                # one); a replacement registers under a new name and takes its place.
                h.abandoned = True
                generation += 1
                name = f"load-{run}-{slot}-r{generation}"
                worker_id = await _register_retrying(client, name, tally)

        cpu_before = time.process_time(), _machine_cpu()
        await asyncio.gather(monitor(), *(worker(slot) for slot in range(config.workers)))
        # The window ends with the last answered job: the idle tail of the last long polls
        # (after every task finished) is not load.
        answered = [h.answered for h in tally.held if h.answered is not None]
        window = (max(answered) if answered else time.monotonic()) - began
        busy = _machine_cpu()
        cpu = {
            "generator_cpu_s": time.process_time() - cpu_before[0],
            "machine_busy": (busy[0] - cpu_before[1][0]) / max(1, busy[1] - cpu_before[1][1]),
        }
        await asyncio.gather(*beating)  # each ends at once (its job is answered) or after
        # the heartbeat it is sending
    finally:
        for beat in list(beating):
            beat.cancel()
        for client in clients:
            await client.aclose()
    return tally, window, cpu


def audit(url: str, tally: Tally) -> dict[str, Any]:
    """Read-only checks of the database after the run (the services are stopped)."""
    jobs, leases, tasks = read_tables(url)
    return audit_rows(jobs, leases, tasks, tally)


def read_tables(url: str) -> tuple[list, list, list]:
    """The jobs, leases and tasks columns the audit needs, in one read-only transaction."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            jobs = conn.execute(
                select(
                    JobRow.id,
                    JobRow.task_id,
                    JobRow.trial,
                    JobRow.state,
                    JobRow.lease_token,
                    JobRow.result_token,
                )
            ).all()
            leases = conn.execute(
                select(
                    LeaseRow.id,
                    LeaseRow.job_id,
                    LeaseRow.token,
                    LeaseRow.leased_at,
                    LeaseRow.outcome,
                    LeaseRow.ended_at,
                )
            ).all()
            tasks = conn.execute(
                select(
                    TaskRow.id,
                    TaskRow.state,
                    TaskRow.trials_target,
                    TaskRow.trials_enqueued,
                    TaskRow.trials_done,
                )
            ).all()
            conn.rollback()
    finally:
        engine.dispose()
    return jobs, leases, tasks


def audit_rows(jobs: list, leases: list, tasks: list, tally: Tally) -> dict[str, Any]:
    """The audit proper, over rows with the columns read_tables selects."""
    job_by_id = {j.id: j for j in jobs}
    states = collections.Counter(j.state for j in jobs)

    # Duplicates, by the lease audit table: two leases of a job whose intervals overlap
    # (a live lease has no end). An expired lease ends when it is reclaimed, before the job
    # can be leased again, so a re-lease after expiry never overlaps its predecessor: the
    # service stamps both with the statement's time (service.db.Database.now), and the
    # claim can only see the job once the reclaim committed.
    by_job: dict[int, list] = collections.defaultdict(list)
    for lease in sorted(leases, key=lambda r: r.id):
        by_job[lease.job_id].append(lease)
    overlapping: set[int] = set()
    double_result: set[int] = set()
    for job_id, rows in by_job.items():
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if b.leased_at < (a.ended_at or FOREVER) and a.leased_at < (b.ended_at or FOREVER):
                    overlapping.add(job_id)
        if sum(r.outcome == "result" for r in rows) > 1:
            double_result.add(job_id)

    # Duplicates, by the workers' clocks: one job held by two live workers at once. A worker
    # that died holding a job (churn) holds nothing: its lease must expire before the job
    # goes to another, which the audit table's intervals check.
    held_by_job: dict[int, list[Held]] = collections.defaultdict(list)
    for h in tally.held:
        if not h.abandoned:
            held_by_job[h.job_id].append(h)
    held_twice: set[int] = set()
    for job_id, hs in held_by_job.items():
        hs.sort(key=lambda h: h.received)
        for a, b in itertools.pairwise(hs):
            if a.answered is None or b.received < a.answered:
                held_twice.add(job_id)
    tokens_by_job: dict[int, set[str]] = collections.defaultdict(set)
    for h in tally.held:
        tokens_by_job[h.job_id].add(h.token)
    received_twice = sum(len(tokens) > 1 for tokens in tokens_by_job.values())

    # Churn: the abandoned leases, how they ended, and the leases granted after an expiry.
    lease_by_key = {(r.job_id, r.token): r for r in leases}
    abandoned = [h for h in tally.held if h.abandoned]
    abandoned_keys = {(h.job_id, h.token) for h in abandoned}
    abandoned_expired = sum(
        (r := lease_by_key.get(k)) is not None and r.outcome == "expired" for k in abandoned_keys
    )
    expired = [r for r in leases if r.outcome == "expired"]
    re_leases = 0  # leases granted after the job's previous lease expired
    re_leased = [rows for rows in by_job.values() if len(rows) > 1]
    for rows in re_leased:
        re_leases += sum(a.outcome == "expired" for a in rows[:-1])
    recorded = {j.id for j in jobs if j.state in ("done", "failed")}
    re_leased_one_result = sum(
        rows[0].job_id in recorded
        and sum(r.outcome == "result" for r in rows) == 1
        and any(r.outcome == "result" and r.token == job_by_id[r.job_id].result_token for r in rows)
        for rows in re_leased
        if rows[0].job_id in job_by_id
    )

    # Lost: given up, stranded, or answered without the result being recorded (unless a
    # later lease of the job recorded one: then the job is not lost, the lease expired).
    # An abandoned lease is no loss if a later lease (another token) recorded the job's
    # result; otherwise its job is lost, whatever state it was left in.
    lost_state = {j.id for j in jobs if j.state == "lost"}
    still_leased = {j.id for j in jobs if j.state == "leased"}
    live = [h for h in tally.held if not h.abandoned]
    unanswered = {h.job_id for h in live if h.accepted is None} - recorded
    refused = {h.job_id for h in live if h.accepted is False} - recorded
    abandoned_unfinished = {
        h.job_id
        for h in abandoned
        if h.job_id not in recorded or job_by_id[h.job_id].result_token == h.token
    }
    accepted = [h for h in tally.held if h.accepted]
    not_in_db = {
        h.job_id
        for h in accepted
        if (j := job_by_id.get(h.job_id)) is None
        or j.state not in ("done", "failed")
        or j.result_token != h.token
    }
    result_leases = {(r.job_id, r.token) for r in leases if r.outcome == "result"}
    unmatched = {
        j.id for j in jobs if j.id in recorded and (j.id, j.result_token) not in result_leases
    }
    by_task: dict[int, list] = collections.defaultdict(list)
    for j in jobs:
        by_task[j.task_id].append(j)
    bad_tasks = []
    for t in tasks:
        mine = by_task[t.id]
        final = sum(j.state in FINAL_JOB for j in mine)
        ok = t.trials_done == final and t.trials_enqueued == len(mine)
        if t.state == "done":
            ok = ok and t.trials_done == t.trials_target
            ok = ok and sorted(j.trial for j in mine) == list(range(t.trials_target))
        if not ok:
            bad_tasks.append(t.id)
    lost_jobs = (
        lost_state
        | still_leased
        | unanswered
        | refused
        | abandoned_unfinished
        | not_in_db
        | unmatched
    )
    accepted_once = len({(h.job_id, h.token) for h in accepted})
    return {
        "tasks_done": sum(t.state == "done" for t in tasks),
        "tasks_failed": sum(t.state == "failed" for t in tasks),
        "tasks": len(tasks),
        "trials_done_db": sum(t.trials_done for t in tasks),
        "results_db": len(recorded),
        "results_accepted": accepted_once,
        "job_states": dict(states),
        "lease_rows": len(leases),
        "jobs_leased": len(by_job),
        "duplicate_leases": len(overlapping | double_result | held_twice),
        "duplicates": {
            "overlapping leases (audit table)": len(overlapping),
            "jobs with two results": len(double_result),
            "held twice at once (live workers' clocks)": len(held_twice),
        },
        "jobs_received_twice": received_twice,
        "results_refused": sum(h.accepted is False for h in live),
        "results_unanswered": sum(h.accepted is None for h in live),
        "abandoned": len(abandoned_keys),
        "abandoned_expired": abandoned_expired,
        "leases_expired": len(expired),
        "live_leases_expired": sum((r.job_id, r.token) not in abandoned_keys for r in expired),
        "re_leases": re_leases,
        "re_leased_jobs": len(re_leased),
        "re_leased_one_result": re_leased_one_result,
        "lost_jobs": len(lost_jobs) + len(bad_tasks),
        "lost": {
            "state lost": len(lost_state),
            "still leased": len(still_leased),
            "answer never delivered": len(unanswered),
            "result refused, never recorded": len(refused),
            "abandoned, not finished by a later lease": len(abandoned_unfinished),
            "accepted, not in the database": len(not_in_db),
            "recorded without its lease's result": len(unmatched),
            "tasks whose counts disagree": len(bad_tasks),
        },
        "results_counted_once": accepted_once
        == len(accepted)
        == len(recorded)
        == sum(t.trials_done for t in tasks) - len(lost_state),
    }


def _errors_logged(log_text: str) -> list[str]:
    """The services' logged errors: each traceback's last line (the exception), with the
    log line that introduced it."""
    errors, lines = [], log_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = i + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end]):
                end += 1
            cause = lines[i - 1] if i > 0 else ""
            errors.append(f"{cause} -> {lines[end] if end < len(lines) else '?'}")
    return errors


def run_load(admin_url: str, config: LoadConfig) -> dict[str, Any]:
    """One run on a fresh database; returns throughput, latency and the audit."""
    load_before = os.getloadavg()[0]
    with (
        pg_database(admin_url) as url,
        tempfile.TemporaryDirectory(prefix="bench-load-") as tmp,
    ):
        with ExitStack() as stack:
            services = [
                # One at a time: the first builds the empty schema, which two at once would race.
                stack.enter_context(serve(url, config, Path(tmp), i))
                for i in range(config.replicas)
            ]
            pids = [pid for _, pid, _ in services]
            service_cpu = [_cpu_s(pid) for pid in pids]
            tally, window, cpu = asyncio.run(_drive([b for b, _, _ in services], config))
            cpu["service_cpu_s"] = sum(_cpu_s(pid) for pid in pids) - sum(service_cpu)
            logs = [log for _, _, log in services]
        # Stopped: the audit reads a quiescent database.
        log_text = "\n".join(log.read_text(errors="replace") for log in logs)
        if "Traceback" in log_text and config.keep_logs:
            kept = Path(tempfile.mkdtemp(prefix="bench-load-logs-"))
            for log in logs:
                (kept / log.name).write_bytes(log.read_bytes())
            print(f"service logs with errors kept in {kept}", flush=True)
        report = audit(url, tally)
    leases = len(tally.held)
    results = report["results_accepted"]
    all_lease = tally.lease_granted_s + tally.lease_empty_s
    nan = math.nan
    report.update(
        config=config,
        load_before=load_before,
        window_s=window,
        all_done_after_s=tally.all_done_after_s,
        leases=leases,
        leases_per_s=leases / window,
        results_per_s=results / window,
        lease_requests=len(all_lease),
        empty_polls=len(tally.lease_empty_s),
        lease_p50_ms=1e3 * _pct(tally.lease_granted_s, 0.5) if tally.lease_granted_s else nan,
        lease_p99_ms=1e3 * _pct(tally.lease_granted_s, 0.99) if tally.lease_granted_s else nan,
        lease_all_p99_ms=1e3 * _pct(all_lease, 0.99) if all_lease else nan,
        result_p50_ms=1e3 * _pct(tally.result_s, 0.5) if tally.result_s else nan,
        result_p99_ms=1e3 * _pct(tally.result_s, 0.99) if tally.result_s else nan,
        http_errors=dict(tally.errors),
        workers_registered=tally.registered,
        heartbeats=tally.heartbeats,
        service_tracebacks=log_text.count("Traceback"),
        service_errors=_errors_logged(log_text),
        service_cpu_ms_per_result=1e3 * cpu["service_cpu_s"] / max(1, results),
        generator_cpu_ms_per_result=1e3 * cpu["generator_cpu_s"] / max(1, results),
        machine_busy=cpu["machine_busy"],
    )
    return report


def _summary(r: dict) -> str:
    c = r["config"]
    return (
        f"churn {c.churn:g}, "
        f"{c.replicas} replica(s), {c.workers} workers, {r['tasks_done']}/{r['tasks']} tasks "
        f"done in {r['window_s']:.1f} s: {r['leases_per_s']:.1f} leases/s, "
        f"{r['results_per_s']:.1f} results/s, lease p50/p99 {r['lease_p50_ms']:.1f}/"
        f"{r['lease_p99_ms']:.1f} ms, result p50/p99 {r['result_p50_ms']:.1f}/"
        f"{r['result_p99_ms']:.1f} ms, empty polls {r['empty_polls']}, "
        f"HTTP errors {sum(r['http_errors'].values())}, service tracebacks "
        f"{r['service_tracebacks']}, duplicate leases {r['duplicate_leases']}, "
        f"lost jobs {r['lost_jobs']}, results DB/accepted {r['results_db']}/"
        f"{r['results_accepted']}"
        + (
            f"; churn {c.churn:g} (TTL {c.lease_ttl_s:g} s): abandoned {r['abandoned']} "
            f"({r['abandoned_expired']} expired), leases expired {r['leases_expired']} "
            f"(live {r['live_leases_expired']}), re-leases {r['re_leases']} over "
            f"{r['re_leased_jobs']} jobs ({r['re_leased_one_result']} with one result), "
            f"workers registered {r['workers_registered']}, heartbeats {r['heartbeats']}"
            if c.churn > 0
            else ""
        )
    )


def _churn_line(r: dict) -> str:
    c = r["config"]
    if c.churn == 0:
        return (
            f"No churn: no lease abandoned, {r['leases_expired']} expired, "
            f"{r['re_leases']} re-leases."
        )
    replacements = r["workers_registered"] - c.workers
    return (
        f"Churn {c.churn:g} (lease TTL {c.lease_ttl_s:g} s): {r['abandoned']} leases abandoned "
        f"by dying workers ({replacements} replacements registered), {r['abandoned_expired']} "
        f"of them ended `expired`; {r['leases_expired']} leases expired in all "
        f"({r['live_leases_expired']} of live workers); {r['re_leases']} re-leases of "
        f"{r['re_leased_jobs']} jobs, {r['re_leased_one_result']} of which hold exactly one "
        f"result; {r['heartbeats']} heartbeats."
    )


def _section(reports: list[dict], args: argparse.Namespace) -> str:
    c = reports[0]["config"]
    churned = [r["config"] for r in reports if r["config"].churn > 0]
    rows = []
    for r in reports:
        done = r["all_done_after_s"]
        ended = f"all done at {done:.1f} s" if done is not None else "time limit"
        rows.append(
            f"| {r['config'].churn:g} | {r['config'].replicas} | {r['config'].lease_ttl_s:g} "
            f"| {r['tasks_done']}/{r['tasks']} ({ended}) "
            f"| {r['window_s']:.1f} | {r['leases']} | {r['leases_per_s']:.1f} "
            f"| {r['results_per_s']:.1f} | {r['lease_p50_ms']:.1f} / {r['lease_p99_ms']:.1f} "
            f"| {r['result_p50_ms']:.1f} / {r['result_p99_ms']:.1f} | {r['empty_polls']} "
            f"| {sum(r['http_errors'].values())} | {len(r['service_errors'])} "
            f"| {r['service_cpu_ms_per_result']:.1f} "
            f"| {100 * r['machine_busy']:.0f}% | {r['abandoned']} | {r['leases_expired']} "
            f"| {r['re_leases']} | **{r['duplicate_leases']}** | **{r['lost_jobs']}** |"
        )
    audits = []
    for r in reports:
        dup = ", ".join(f"{k} {v}" for k, v in r["duplicates"].items())
        lost = ", ".join(f"{k} {v}" for k, v in r["lost"].items())
        audits.append(
            f"- churn {r['config'].churn:g}, {r['config'].replicas} replica(s): "
            f"{r['lease_rows']} lease rows, "
            f"{r['results_db']} results in the database = {r['results_accepted']} accepted "
            f"by the workers; job states {r['job_states']}. {_churn_line(r)} "
            f"Duplicates: {dup}. Lost: {lost}. "
            f"HTTP errors: {r['http_errors'] or 'none'}. Service errors logged: "
            f"{'; '.join(f'`{e}`' for e in r['service_errors']) or 'none'}. "
            f"Load average (1 min) before the run: {r['load_before']:.1f}."
        )
    churn_text = []
    if churned:
        k = churned[0]
        churn_text = [
            f"Churn (rows with churn {k.churn:g}): each time a worker receives a job it dies "
            f"with probability {k.churn:g} (one RNG, seed {k.seed}, drawn once per job "
            "received in arrival order, so the deaths among the first N jobs are the same in "
            "every run): it never answers that job and never polls or heartbeats again, and "
            "a replacement registers under a new name on the same replica, so "
            f"{k.workers} workers stay live. The abandoned lease must expire by the database "
            f"clock (lease TTL {k.lease_ttl_s:g} s); the replicas' upkeep (every "
            f"{k.sweep_interval_s:g} s) or their lease path (at most once a second each) "
            "requeues the job and ends the lease `expired` in the audit table, and another "
            "worker leases it again. `PIPETUNE_MAX_ATTEMPTS` is "
            f"{k.max_attempts} in these runs, so no job is given up as `lost` by design (that "
            "would take as many expiries of one job in a row): a lost job is a fault. What "
            "churn exercises: expiry by the database clock and reclaim while two replicas "
            "lease concurrently, re-leasing a job to another worker, and the audit's rule "
            "that a re-lease after an expiry is no duplicate, on real data. What it does "
            "not: a worker that comes back and posts a late result (the stale-lease refusal "
            "is tested in tests/test_service_queue.py), a worker dying in the middle of a "
            "request, replicas or the database failing. It has a cost the rates show: a "
            "task's next batch is proposed only when its batch is complete, so each "
            "abandoned job holds its task back by about a TTL; and jobs leased include the "
            "re-leases.",
            "",
            "Live workers heartbeat every TTL/4 while they hold a job (the heartbeat extends "
            "their leases by a TTL). The churn TTL is 5 s, not 2 s: with 64 closed-loop "
            "workers on 2 cores the time from a lease's grant (its TTL runs from the grant's "
            "transaction) to its result being applied exceeds 2 s in the tail, and trial "
            "runs with a 2 s TTL saw 1 to 13 live workers' leases per run expire (their "
            "results refused, the jobs leased again while they held them: duplicates by "
            "the workers' clocks), even with heartbeats every 0.5 s (a heartbeat queues "
            "behind the same busy replicas). With 5 s none expired. "
            "`tests/test_load_small.py` runs churn with a 2 s TTL at 8 workers, a light load.",
            "",
        ]
    ttls = " / ".join(
        f"{t:g} s" for t in sorted({r["config"].lease_ttl_s for r in reports}, reverse=True)
    )
    body = [
        f"{c.workers} simulated workers against {c.tasks} concurrent tuning tasks on "
        "PostgreSQL 15, with one `pipetune serve` replica and with two replicas sharing the "
        "database (workers and tasks spread round-robin over the replicas), without worker "
        "churn and with it. Workers are "
        "simulated HTTP clients (httpx, asyncio, one process): each leases one job at a "
        f"time (long poll, wait {c.wait_s:g} s), waits {c.measure_ms:g} ms and posts a "
        "made-up result, so the figures are the service's and the database's costs, no "
        f"GPU's. Everything shares one {os.cpu_count()}-core VM: the load generator, the "
        "replicas and PostgreSQL, so a second replica adds no hardware here, only a second "
        "Python process; the figures show that replicas share the queue correctly, not how "
        "they scale on more machines. The VM is also "
        "shared with other work (the load average before each run is given below): runs "
        "made while test suites ran beside them measured 45-55 results/s, so read the rates "
        "as +-40%.",
        "",
        f"Tasks: distinct GEMM shapes on h100, strategy `{c.strategy}`, budget {c.budget} "
        f"trials each, batch size {c.batch_size} (a task's next batch is proposed when its "
        f"current one is complete), lease TTL {ttls} (without / with churn). A run ends when "
        f"every task is done or after {c.seconds:g} s; rates are over that window.",
        "",
        *churn_text,
        "| churn | replicas | lease TTL (s) | tasks done | window (s) | jobs leased "
        "| leases/s | results/s "
        "| lease p50 / p99 (ms) | result p50 / p99 (ms) | empty polls | HTTP errors "
        "| service errors logged | service CPU per result (ms) | machine CPU busy "
        "| leases abandoned | leases expired | re-leases "
        "| duplicate leases | lost jobs |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "The loop is closed: a worker sends its next request as soon as the previous one "
        "returns, so the latencies are mostly queueing behind "
        f"{c.workers} concurrent clients on {os.cpu_count()} cores. Machine CPU busy is the "
        "whole VM's (/proc/stat) over the window: below 100% the service processes, not the "
        "cores, set the pace (one replica is one Python process: one event loop, one GIL), "
        "and a second replica can use the idle CPU. Lease latency is that of the requests "
        "that got a job (one may wait in its long poll while a task's next batch is "
        "proposed); empty polls are requests that waited out their poll with no job. HTTP "
        "errors are responses other than 200 and transport errors (a worker retries a "
        "result, so none loses a job); service errors logged are tracebacks in the "
        "replicas' logs.",
        "",
        "Audit, read-only from the database after the services stopped. Duplicate leases: "
        "jobs two leases held at once by the lease audit table (a re-lease after an expiry "
        "does not overlap), jobs with two recorded results, and jobs two live workers held "
        "at once by their own clocks (a dead worker holds nothing). Lost jobs: jobs given "
        "up as `lost`, jobs still leased, live workers' leases whose result was not "
        "recorded or was refused (unless a later lease recorded it), abandoned leases whose "
        "job no later lease finished, accepted results not in the database, and tasks "
        "whose trial counts disagree with their jobs (a finished task holds exactly trials "
        "0..budget-1). Re-leases are leases granted after the job's previous lease expired; "
        "with lease rows = budget x tasks + re-leases every other job was leased once. "
        "The audit table stamps a lease's start and end with the time of the statement "
        "that granted or ended it, so a re-lease after an expiry never overlaps its "
        "predecessor and any overlap counts as a duplicate (stamped with the transaction's "
        "start, as they once were, a claim whose transaction began before the reclaim of "
        "its job was stamped before that lease ended; the churn runs caught it). "
        "Without churn no lease expires within a run (the TTL is longer).",
        "",
        *audits,
        "",
        f"Command: `python benchmarks/bench_load.py --write` (--workers {args.workers} "
        f"--tasks {args.tasks} --seconds {args.seconds:g} --budget {args.budget}; churn "
        f"{' and '.join(f'{x:g}' for x in args.churn or DEFAULT_CHURN)}, seed {args.seed}). "
        "`tests/test_load_small.py` runs a small version (8 workers, 3 tasks; 2 and 1 "
        "replicas without churn, 2 replicas with churn 0.1 and a 2 s TTL) as a correctness "
        "test.",
    ]
    return "\n".join(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument(
        "--seconds", type=float, default=LoadConfig.seconds, help="the most a run lasts"
    )
    parser.add_argument("--budget", type=int, default=LoadConfig.budget, help="trials per task")
    parser.add_argument("--batch-size", type=int, default=LoadConfig.batch_size)
    parser.add_argument("--strategy", default=LoadConfig.strategy)
    parser.add_argument("--measure-ms", type=float, default=0.0, help="simulated measurement")
    parser.add_argument(
        "--replicas", type=int, action="append", help="replica counts (default: 1 and 2)"
    )
    parser.add_argument(
        "--churn",
        type=float,
        action="append",
        metavar="FRACTION",
        help="probability that a worker dies on receiving a job; repeatable "
        f"(default: {' and '.join(f'{c:g}' for c in DEFAULT_CHURN)})",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        metavar="SECONDS",
        help=f"the replicas' lease TTL (default: {LoadConfig.lease_ttl_s:g} s without churn, "
        f"{CHURN_TTL_S:g} s with)",
    )
    parser.add_argument("--seed", type=int, default=LoadConfig.seed, help="of the churn draws")
    parser.add_argument("--write", action="store_true", help="record in benchmarks/RESULTS.md")
    args = parser.parse_args()

    reports = []
    for churn in args.churn or DEFAULT_CHURN:
        for replicas in args.replicas or [1, 2]:
            if args.lease_ttl is not None:
                ttl = args.lease_ttl
            else:
                ttl = CHURN_TTL_S if churn > 0 else LoadConfig.lease_ttl_s
            config = LoadConfig(
                replicas=replicas,
                workers=args.workers,
                tasks=args.tasks,
                budget=args.budget,
                seconds=args.seconds,
                batch_size=args.batch_size,
                strategy=args.strategy,
                measure_ms=args.measure_ms,
                lease_ttl_s=ttl,
                churn=churn,
                seed=args.seed,
            )
            report = run_load(args.pg_url, config)
            print(_summary(report), flush=True)
            if report["http_errors"]:
                print("  HTTP errors:", report["http_errors"], flush=True)
            for error in report["service_errors"]:
                print("  service error:", error, flush=True)
            reports.append(report)
    text_body = _section(reports, args)
    print(text_body)
    failed = [r for r in reports if r["duplicate_leases"] or r["lost_jobs"]]
    if args.write:
        counts = " and ".join(sorted({str(r["config"].replicas) for r in reports}))
        churns = " and ".join(f"{c:g}" for c in sorted({r["config"].churn for r in reports}))
        title = (
            f"Service under load: {args.workers} workers, {args.tasks} tasks, {counts} "
            f"replicas, worker churn {churns}"
        )
        write_section("load", title, text_body)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
