"""The load benchmark's driver: tasks created on the replicas, simulated HTTP workers
leasing and answering their jobs, and the tally of what each worker held (the audit's
input). See benchmarks/bench_load.py for what a run is and what it measures.

Workers are simulated HTTP clients in this process (httpx, asyncio), spread round-robin
over the replicas: each registers, long-polls for one job at a time (`max_jobs` in
LoadConfig), optionally sleeps `measure_ms`, and posts a made-up result; it always posts the
job it holds before it stops, so at the end no job may be left leased. With `batched` (the
batched worker protocol) a worker leases up to `max_jobs` jobs per request, measures them
one after another and posts all their results in one `POST /v1/jobs/results`, which leases
its next jobs too (`max_jobs`, as the worker daemon's reporter does; `lease_with_results`
False: a lease request of their own, as before); it long-polls the lease route only when a
report found no job. With `report_each` too, a worker reports each job as soon as it is
measured, and the report tops its jobs in hand back up to `max_jobs`: the worker daemon with
one GPU, whose reporter posts what was measured since its last post (one result a trial).

With `idle_s`, once every task is done the workers go on polling the empty queue for that
long (lease requests waiting `idle_wait_s`, the worker daemon's default): what an idle fleet
costs the service (a run that ended at its time limit, tasks unfinished, has no idle phase:
its queue is not empty). While it holds a job longer than `heartbeat_s` a worker heartbeats every
`heartbeat_s`; with `daemon_heartbeat_s`, instead, each worker heartbeats the whole run long as
the worker daemon given that `--heartbeat` does (workers/daemon/heartbeats.py). With churn, a worker dies on receiving a job with
probability `churn` (one seeded RNG, drawn once per job received in arrival order) and a
replacement registers in its place.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import HEADERS, register_worker, result_maker, service_process
from pipetune.model.states import TaskState
from pipetune.model.wire import new_request_id
from pipetune.workers.daemon.heartbeats import HeldTerm, heartbeat_due

POST_TRIES = 3
KEEPALIVE_S = 2.0
CHURN_TTL_S = 5.0  # the lease TTL of churn runs (main's default; 2 s lets live leases expire)
CHURN_SWEEP_S = 0.5  # upkeep sweep of churn runs: expired leases are requeued promptly
CHURN_MAX_ATTEMPTS = 50  # expiries before a job is given up: never, by design


@dataclass
class LoadConfig:
    """One run's settings (what the command line gives, one combination at a time)."""

    replicas: int = 1
    workers: int = 64
    tasks: int = 20
    budget: int = 120
    # The most a run lasts. Runs end when every task is done: 2,400 results take seconds
    # without churn, but with churn 0.05 a model-guided task waits out a 5 s TTL for most of
    # its batches (a third of the batched leases are abandoned), about 95 s on 2 cores.
    seconds: float = 300.0
    batch_size: int = 8
    strategy: str = "random"
    measure_ms: float = 0.0
    # The log-normal spread of each measurement's duration around measure_ms (its mean):
    # real trials differ (compile times, a timeout, GPUs of several speeds). 0: all equal.
    measure_spread: float = 0.0
    # The replicas' PIPETUNE_PROPOSE_EARLY (None: the service's default).
    propose_early: float | None = None
    # The replicas' PIPETUNE_PROPOSER_THREADS (None: the service's default).
    proposer_threads: int | None = None
    wait_s: float = 1.0
    lease_ttl_s: float = 120.0
    keep_logs: bool = True
    # Jobs a worker asks for per lease request (it answers each before the next request).
    max_jobs: int = 1
    # The batched protocol: all the jobs of a lease answered in one POST /v1/jobs/results.
    batched: bool = False
    # With it, the results request leases the worker's next jobs (the daemon's reporter).
    lease_with_results: bool = True
    # With it, each job is reported as soon as it is measured, and the report tops the jobs in
    # hand back up to max_jobs: the worker daemon with one GPU (its reporter posts what was
    # measured since its last post, one result a trial; max_jobs = 1 + its lease-ahead).
    report_each: bool = False
    # After the tasks: seconds of polling an empty queue, and each poll's wait.
    idle_s: float = 0.0
    idle_wait_s: float = 10.0
    # Each worker heartbeats as the worker daemon given this --heartbeat does, the whole run
    # long, idle phase included (workers/daemon/heartbeats.py), instead of only in holds
    # longer than heartbeat_s; None: the latter.
    daemon_heartbeat_s: float | None = None
    # Each job received kills its worker with this probability (a replacement registers).
    churn: float = 0.0
    seed: int = 0  # of the churn draws
    # Each answer that leased jobs (a lease, or a report that leased) is lost on the way back
    # with this probability: the worker sees a failed request, and sends it again with its
    # request_id and retry (as the worker daemon does), which must give it the same jobs.
    lose_answers: float = 0.0
    # While a worker holds a job it heartbeats this often (None: a quarter of the TTL).
    heartbeat_s: float | None = None
    # The replicas' PIPETUNE_SWEEP_INTERVAL_S and PIPETUNE_MAX_ATTEMPTS; None: the
    # service's defaults (2 s, 3) without churn, CHURN_SWEEP_S and CHURN_MAX_ATTEMPTS
    # with churn.
    sweep_interval_s: float | None = None
    max_attempts: int | None = None
    # What the workers answer: "made-up" results, or "simulated" ones that follow the model.
    results: str = "made-up"

    def __post_init__(self) -> None:
        if self.report_each and not (self.batched and self.lease_with_results):
            raise ValueError("report_each: the batched protocol with leases in reports only")
        if not 0 <= self.churn < 1:
            raise ValueError(f"churn must be in [0, 1), got {self.churn}")
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {self.max_jobs}")
        if not 0 <= self.lose_answers < 1:
            raise ValueError(f"lose_answers must be in [0, 1), got {self.lose_answers}")
        if self.churn > 0:
            if self.sweep_interval_s is None:
                self.sweep_interval_s = CHURN_SWEEP_S
            if self.max_attempts is None:
                self.max_attempts = CHURN_MAX_ATTEMPTS
        if self.heartbeat_s is None:
            self.heartbeat_s = self.lease_ttl_s / 4


# The name under which `drive`'s `cpu()` may give the CPU seconds of this process's own
# measuring threads (benchmarks/harness.PostgresCpu's sampler): taken out of the load
# generator's CPU, which is this process's.
MEASURING = "measuring"


def _generator_cpu_s(since: float, before: dict[str, float], after: dict[str, float]) -> float:
    """This process's CPU seconds since `since` (time.process_time), less its measuring
    threads' between the `cpu()` readings `before` and `after`."""
    measuring = after.get(MEASURING, 0.0) - before.get(MEASURING, 0.0)
    return time.process_time() - since - measuring


# How often the run's watcher checks the workers' tally, and how often it reads the task
# list before every trial has an accepted result (LoadRun.watch).
WATCH_TICK_S = 0.1
WATCH_FALLBACK_S = 2.0


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
    """What the workers saw: every lease held, request latencies, errors."""

    held: list[Held] = field(default_factory=list)
    lease_granted_s: list[float] = field(default_factory=list)
    lease_empty_s: list[float] = field(default_factory=list)
    result_s: list[float] = field(default_factory=list)
    errors: collections.Counter = field(default_factory=collections.Counter)
    all_done_after_s: float | None = None
    registered: int = 0  # workers registered, replacements included
    heartbeats: int = 0  # answered 200
    result_posts: int = 0  # result requests answered 200 (one per job, or per batch)
    report_leases: int = 0  # results requests that leased jobs too
    accepted: int = 0  # results the service accepted (the watcher's cue)
    idle_polls: int = 0  # lease requests of the idle phase
    idle_heartbeats: int = 0  # of those, in the idle phase
    idle_phase: bool = False  # the idle phase has begun
    idle_jobs: int = 0  # jobs leased in the idle phase (there are none to lease)
    answers_lost: int = 0  # answers that leased jobs, lost on the way (lose_answers)
    # Why the idle phase asked for did not run (None: it ran, or none was asked for).
    idle_skipped: str | None = None


def workload(i: int) -> dict:
    """The i-th task's GEMM: distinct shapes, each with a 2840-schedule space on h100."""
    return {"op": "gemm", "m": 1024 + 256 * i, "n": 1024, "k": 2048}


def replica_settings(config: LoadConfig) -> dict[str, str]:
    """The PIPETUNE_* settings a run's replicas get (nothing else is inherited)."""
    settings = {
        "PIPETUNE_BATCH_SIZE": str(config.batch_size),
        "PIPETUNE_LEASE_TTL_S": str(config.lease_ttl_s),
        # Idle polls wait as long as they ask (the daemon's 10 s), not the harness's 2 s.
        "PIPETUNE_LEASE_WAIT_CAP_S": str(max(2.0, config.idle_wait_s, config.wait_s)),
    }
    if config.sweep_interval_s is not None:
        settings["PIPETUNE_SWEEP_INTERVAL_S"] = str(config.sweep_interval_s)
    if config.max_attempts is not None:
        settings["PIPETUNE_MAX_ATTEMPTS"] = str(config.max_attempts)
    if config.propose_early is not None:
        settings["PIPETUNE_PROPOSE_EARLY"] = str(config.propose_early)
    if config.proposer_threads is not None:
        settings["PIPETUNE_PROPOSER_THREADS"] = str(config.proposer_threads)
    return settings


@contextmanager
def serve(url: str, config: LoadConfig, log_dir: Path, index: int):
    """`pipetune serve` replica number `index`; yields (base URL, pid, log path)."""
    settings = replica_settings(config)
    log = log_dir / f"serve-{index}.log"
    with service_process(url, log, settings) as service:
        assert service.process is not None
        yield service.url, service.process.pid, log


class LoadRun:
    """One run's shared state: the replicas' clients, the tally, the churn RNG, the clock
    and the heartbeat tasks in flight."""

    def __init__(self, bases: list[str], config: LoadConfig):
        self.config = config
        self.tally = Tally()
        self.result_of = result_maker(config.results)
        # Idle connections are dropped after 2 s, before uvicorn's 5 s keep-alive closes
        # them: at equal timeouts a request sent on a connection idle ~5 s can meet the
        # server's close (ReadError / RemoteProtocolError), a client artefact rather than the
        # service's.
        self._limits = httpx.Limits(
            max_connections=8, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_S
        )
        self.bases = bases
        # The harness's own requests (tasks, the watcher) go through one client per replica;
        # each simulated worker has its own (`worker_client`), as a worker daemon does. One
        # client shared by hundreds of workers made the generator's CPU per request grow
        # with the workers (httpcore scans its pool's connections for every request: 21 ms
        # of CPU per result at 1,000 workers, RESULTS.md "a fleet of a thousand workers").
        self.clients = [self._new_client(b) for b in bases]
        self._worker_clients: list[httpx.AsyncClient] = []
        # One RNG, drawn once per job received, in the order jobs arrive (one event loop):
        # the deaths among the first N jobs are the same in every run with the same seed.
        self.rng = random.Random(config.seed)
        self.durations = random.Random(config.seed + 1)  # of the measurements: apart from it
        self.losses = random.Random(config.seed + 2)  # of the answers lost (lose_answers)
        self.run_id = uuid.uuid4().hex[:6]
        self.stop = asyncio.Event()
        self.began = time.monotonic()
        self.deadline = self.began + config.seconds
        self._beating: set[asyncio.Task] = set()

    def _new_client(self, base: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base, timeout=60, limits=self._limits)

    def client(self, slot: int) -> httpx.AsyncClient:
        """The harness's client of the replica that worker slot `slot` talks to."""
        return self.clients[slot % len(self.clients)]

    def worker_client(self, slot: int) -> httpx.AsyncClient:
        """A new client of worker slot `slot`'s replica (a lease or result request and a
        heartbeat at once: two connections at most)."""
        client = self._new_client(self.bases[slot % len(self.bases)])
        self._worker_clients.append(client)
        return client

    def measure_s(self, jobs: int = 1) -> float:
        """How long measuring `jobs` jobs one after another takes (seconds)."""
        sigma, mean_s = self.config.measure_spread, self.config.measure_ms / 1e3
        if sigma <= 0:
            return jobs * mean_s
        # Log-normal with mean mean_s: exp(N(-sigma^2 / 2, sigma^2)) has mean 1.
        return sum(
            mean_s * self.durations.lognormvariate(-(sigma**2) / 2, sigma) for _ in range(jobs)
        )

    def dies(self) -> bool:
        """Whether the worker that just received a job dies holding it (churn)."""
        return self.config.churn > 0 and self.rng.random() < self.config.churn

    def loses(self, jobs: list) -> bool:
        """Whether an answer that leased `jobs` is lost on the way back (lose_answers)."""
        lost = bool(jobs) and self.losses.random() < self.config.lose_answers
        self.tally.answers_lost += lost
        return lost

    def start_beating(self, beats: Callable[[], Coroutine[Any, Any, None]]) -> None:
        beat = asyncio.get_running_loop().create_task(beats())
        self._beating.add(beat)
        beat.add_done_callback(self._beating.discard)

    async def register(self, client: httpx.AsyncClient, name: str) -> int:
        """Register a worker, retrying transport errors and non-200 answers a few times."""
        for attempt in range(POST_TRIES):
            try:
                worker_id = await register_worker(client, name)
            except httpx.HTTPStatusError as exc:
                self.tally.errors[f"register: HTTP {exc.response.status_code}"] += 1
            except httpx.HTTPError as exc:
                self.tally.errors[f"register: {type(exc).__name__}"] += 1
            else:
                self.tally.registered += 1
                return worker_id
            await asyncio.sleep(0.2 * (attempt + 1))
        return await register_worker(client, name)  # the last try raises: the run cannot go on

    async def create_tasks(self) -> list[int]:
        """The run's tasks, created round-robin on the replicas."""
        task_ids = []
        for i in range(self.config.tasks):
            body = {"workload": workload(i), "gpu": "h100", "budget": self.config.budget}
            body.update(strategy=self.config.strategy, seed=i)
            response = await self.client(i).post("/v1/tasks", json=body)
            response.raise_for_status()
            task_ids.append(response.json()["id"])
        return task_ids

    async def watch(self, task_ids: list[int]) -> None:
        """Stop the run once every task is final (or at the deadline). The task list is read
        once every trial has an accepted result, and before that only every
        WATCH_FALLBACK_S (a task that gave up on a job ends short of its budget), and then
        only once no task is left active: read four times a second, the list was the
        harness's own load on the service whose CPU the run measures (benchmarks/RESULTS.md,
        "the load benchmark's watcher"), and read whole every 2 s, a fifth of a replica's
        CPU at 400 tasks ("a fleet of a thousand workers"). The run's database holds its
        tasks only, so one active task of any state says the run is not over."""
        wanted = set(task_ids)
        target = len(task_ids) * self.config.budget
        looked = time.monotonic()
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            await asyncio.sleep(WATCH_TICK_S)
            if self.tally.accepted < target:
                if time.monotonic() - looked < WATCH_FALLBACK_S:
                    continue
                looked = time.monotonic()
                if await self._any_task_active():
                    continue
            looked = time.monotonic()
            try:
                response = await self.clients[0].get("/v1/tasks", params={"limit": 1000})
                tasks = response.json()["tasks"] if response.status_code == 200 else []
            except httpx.HTTPError:
                continue
            if wanted <= {t["id"] for t in tasks if TaskState(t["state"]).is_final()}:
                self.tally.all_done_after_s = time.monotonic() - self.began
                self.stop.set()

    async def _any_task_active(self) -> bool:
        """Whether the service lists a task in an active state (one row per state asked);
        True when it cannot be told."""
        for state in TaskState:
            if state.is_final():
                continue
            try:
                response = await self.clients[0].get(
                    "/v1/tasks", params={"state": state.value, "limit": 1}
                )
                if response.status_code != 200 or response.json()["tasks"]:
                    return True
            except httpx.HTTPError:
                return True
        return False

    async def finish_heartbeats(self) -> None:
        # Each ends at once (its job is answered) or after the heartbeat it is sending.
        await asyncio.gather(*self._beating)

    async def close(self) -> None:
        for beat in list(self._beating):
            beat.cancel()
        for client in self.clients + self._worker_clients:
            await client.aclose()


class SimulatedWorker:
    """One worker's place in the run: a worker, then each replacement when it dies."""

    def __init__(self, run: LoadRun, slot: int, worker_id: int):
        self.run = run
        self.slot = slot
        self.worker_id = worker_id
        self.client = run.worker_client(slot)
        self.generation = 0
        self._next: list[dict] = []  # jobs the last results request leased
        # The leases received and their terms, for daemon-like heartbeats (pruned by them).
        self._in_hand: dict[int, tuple[Held, HeldTerm]] = {}

    @property
    def tally(self) -> Tally:
        return self.run.tally

    async def work(self) -> None:
        while not self.run.stop.is_set() or self._next:
            left = self.run.deadline - time.monotonic()
            if left <= 0 and not self._next:
                return
            # A worker answers the jobs it holds, even past the deadline.
            jobs = self._next or await self._lease(left)
            self._next = []
            if jobs is None:
                await asyncio.sleep(0.2)
                continue
            if self.run.config.batched:
                hold = self._hold_in_turn if self.run.config.report_each else self._hold_all
                if jobs and not await hold(jobs):
                    await self._replace()
                continue
            for i, job in enumerate(jobs):
                if not await self._hold(job):
                    for rest in jobs[i + 1 :]:  # a dead worker holds the rest unanswered too
                        self._held(rest).abandoned = True
                    await self._replace()
                    break

    async def daemon_heartbeats(self, every: float) -> None:
        """The worker daemon's heartbeat thread (until cancelled): it wakes every `every`
        seconds (each worker from its own phase: daemons start at different times) and sends
        what `heartbeat_due` says of the leases in hand."""
        last_active: bool | None = None
        wakeups = 0
        await asyncio.sleep(random.Random(self.slot).uniform(0, every))
        while True:
            await asyncio.sleep(every)
            wakeups += 1
            now = time.monotonic()
            self._in_hand = {
                job_id: (held, term)
                for job_id, (held, term) in self._in_hand.items()
                if held.answered is None and not held.abandoned
            }
            active = bool(self._in_hand)
            expiring = any(term.due(now, every) for _, term in self._in_hand.values())
            if not heartbeat_due(active, last_active, wakeups, expiring):
                continue
            leases = [
                {"job_id": job_id, "lease_token": term.token}
                for job_id, (_, term) in self._in_hand.items()
            ]
            try:
                response = await self.client.post(
                    f"/v1/workers/{self.worker_id}/heartbeat",
                    json={"busy_jobs": len(leases), "leases": leases},
                    headers=HEADERS,
                )
            except httpx.HTTPError as exc:
                self.tally.errors[f"heartbeat: {type(exc).__name__}"] += 1
                continue
            if response.status_code != 200:
                self.tally.errors[f"heartbeat: HTTP {response.status_code}"] += 1
                continue
            self.tally.heartbeats += 1
            self.tally.idle_heartbeats += self.tally.idle_phase
            last_active, wakeups = active, 0
            for _, term in self._in_hand.values():
                term.extended(now)

    async def idle(self, until: float) -> None:
        """Poll the empty queue until `until` (the idle phase)."""
        wait_s = self.run.config.idle_wait_s
        while (left := until - time.monotonic()) > 0:
            body = {"worker_id": self.worker_id, "max_jobs": self.run.config.max_jobs}
            body["wait_s"] = min(wait_s, left)
            try:
                response = await self.client.post("/v1/jobs/lease", json=body, headers=HEADERS)
            except httpx.HTTPError as exc:
                self.tally.errors[f"idle lease: {type(exc).__name__}"] += 1
                await asyncio.sleep(0.2)
                continue
            self.tally.idle_polls += 1
            if response.status_code != 200:
                self.tally.errors[f"idle lease: HTTP {response.status_code}"] += 1
                continue
            jobs = response.json()["jobs"]
            self.tally.idle_jobs += len(jobs)
            for job in jobs:  # none expected; answered all the same, so none is left leased
                await self._post_result(job, self._held(job))

    def _lease_request(self, left: float) -> dict:
        wait_s = min(self.run.config.wait_s, left)
        return {
            "worker_id": self.worker_id,
            "max_jobs": self.run.config.max_jobs,
            "wait_s": wait_s,
            "request_id": new_request_id(),  # as the worker daemon's (its retries' too)
        }

    async def _lease(self, left: float) -> list[dict] | None:
        """The jobs one lease request got (None: the request failed). An answer lost on the
        way (lose_answers) is asked for again, as a retry of the same request."""
        started = time.perf_counter()
        body = self._lease_request(left)
        while True:
            try:
                response = await self.client.post("/v1/jobs/lease", json=body, headers=HEADERS)
            except httpx.HTTPError as exc:
                self.tally.errors[f"lease: {type(exc).__name__}"] += 1
                return None
            if response.status_code != 200 or not self.run.loses(response.json()["jobs"]):
                break
            body = {**body, "wait_s": 0.0, "retry": True}
        took = time.perf_counter() - started
        if response.status_code != 200:
            self.tally.errors[f"lease: HTTP {response.status_code}"] += 1
            return None
        jobs = response.json()["jobs"]
        (self.tally.lease_granted_s if jobs else self.tally.lease_empty_s).append(took)
        return jobs

    def _held(self, job: dict) -> Held:
        held = Held(job["job_id"], job["lease_token"], self.worker_id, time.monotonic())
        self.tally.held.append(held)
        if self.run.config.daemon_heartbeat_s is not None:
            term = HeldTerm.granted(job["lease_token"], job.get("lease_ttl_s"), held.received)
            self._in_hand[held.job_id] = (held, term)
        return held

    async def _hold(self, job: dict) -> bool:
        """Measure (sleep) and answer one job; False when the worker died holding it."""
        held = self._held(job)
        if self._dies_receiving([job], [held]):  # no result, no heartbeat, no poll
            return False
        with self._heartbeating():
            if self.run.config.measure_ms > 0:
                await asyncio.sleep(self.run.measure_s())
            # Posted even past the deadline: a worker answers the job it holds.
            await self._post_result(job, held)
        return True

    async def _post_result(self, job: dict, held: Held) -> None:
        body = {
            "worker_id": self.worker_id,
            "lease_token": job["lease_token"],
            "result": self.run.result_of(job),
        }
        for attempt in range(POST_TRIES):
            started = time.perf_counter()
            try:
                response = await self.client.post(
                    f"/v1/jobs/{job['job_id']}/result", json=body, headers=HEADERS
                )
            except httpx.HTTPError as exc:
                self.tally.errors[f"result: {type(exc).__name__}"] += 1
            else:
                if response.status_code == 200:
                    self.tally.result_s.append(time.perf_counter() - started)
                    self.tally.result_posts += 1
                    ack = response.json()
                    held.answered, held.accepted = time.monotonic(), ack["accepted"]
                    self.tally.accepted += bool(held.accepted)
                    held.detail = ack["detail"]
                    return
                self.tally.errors[f"result: HTTP {response.status_code}"] += 1
            await asyncio.sleep(0.2 * (attempt + 1))  # a real worker retries: idempotent
        held.answered = time.monotonic()  # given up: the worker holds the job no longer

    async def _hold_all(self, jobs: list[dict]) -> bool:
        """Measure (sleep) the jobs one after another and answer them in one request; False
        when the worker died on receiving one (it then answers none of them)."""
        held = [self._held(job) for job in jobs]
        if self._dies_receiving(jobs, held):
            return False
        with self._heartbeating():
            if self.run.config.measure_ms > 0:
                await asyncio.sleep(self.run.measure_s(len(jobs)))
            await self._post_results(jobs, held)
        return True

    async def _post_results(
        self, jobs: list[dict], held: list[Held], ask: int | None = None
    ) -> None:
        """Report `jobs` in one request, which leases up to `ask` more (default max_jobs) into
        `_next` while the run lasts."""
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "results": [
                {
                    "job_id": j["job_id"],
                    "lease_token": j["lease_token"],
                    "result": self.run.result_of(j),
                }
                for j in jobs
            ],
        }
        run = self.run
        # Past the deadline (or stopped) the worker only answers what it holds.
        if run.config.lease_with_results and not run.stop.is_set():
            asked = run.config.max_jobs if ask is None else ask
            body["max_jobs"] = asked if time.monotonic() < run.deadline else 0
            if body["max_jobs"]:
                body["request_id"] = new_request_id()  # the same for the tries below
        for attempt in range(POST_TRIES):
            if attempt and "request_id" in body:
                body["retry"] = True
            started = time.perf_counter()
            try:
                response = await self.client.post("/v1/jobs/results", json=body, headers=HEADERS)
                # An answer lost on the way back is sent again at once, as a retry (not one
                # of the tries, which are for failed requests).
                while response.status_code == 200 and run.loses(response.json()["jobs"]):
                    body["retry"] = True
                    response = await self.client.post(
                        "/v1/jobs/results", json=body, headers=HEADERS
                    )
            except httpx.HTTPError as exc:
                self.tally.errors[f"results: {type(exc).__name__}"] += 1
            else:
                if response.status_code == 200:
                    self.tally.result_s.append(time.perf_counter() - started)
                    self.tally.result_posts += 1
                    now = time.monotonic()
                    answer = response.json()
                    self._next = answer.get("jobs", [])
                    self.tally.report_leases += bool(self._next)
                    for h, ack in zip(held, answer["acks"], strict=True):
                        h.answered, h.detail = now, ack["detail"]
                        h.accepted = ack["accepted"] if ack["status_code"] == 200 else False
                        self.tally.accepted += bool(h.accepted)
                        if ack["status_code"] != 200:
                            self.tally.errors[f"result: item {ack['status_code']}"] += 1
                    return
                self.tally.errors[f"results: HTTP {response.status_code}"] += 1
            await asyncio.sleep(0.2 * (attempt + 1))  # a real worker retries: idempotent
        now = time.monotonic()
        for h in held:
            h.answered = now  # given up: the worker holds the jobs no longer

    async def _hold_in_turn(self, jobs: list[dict]) -> bool:
        """The worker daemon's way with one GPU (report_each): measure the jobs in hand one at
        a time, report each as soon as it is measured, and let that report lease what tops the
        jobs in hand back up to max_jobs; False when the worker died on receiving a job (it
        then answers none of those it holds)."""
        in_hand = [(job, self._held(job)) for job in jobs]
        if self._dies_receiving(jobs, [h for _, h in in_hand]):
            return False
        with self._heartbeating():
            while in_hand:
                job, held = in_hand.pop(0)
                if self.run.config.measure_ms > 0:
                    await asyncio.sleep(self.run.measure_s())
                ask = self.run.config.max_jobs - len(in_hand)
                await self._post_results([job], [held], ask=ask)
                leased, self._next = self._next, []
                in_hand += [(j, self._held(j)) for j in leased]
                if self._dies_receiving(leased, [h for _, h in in_hand]):
                    return False
        return True

    def _dies_receiving(self, jobs: list[dict], holding: list[Held]) -> bool:
        """Whether the worker dies on receiving `jobs` (one draw per job, in the order they
        arrive); if so, every lease in `holding` is abandoned unanswered."""
        if not any([self.run.dies() for _ in jobs]):  # a list: every job draws
            return False
        for h in holding:
            h.abandoned = True
        return True

    @contextmanager
    def _heartbeating(self) -> Iterator[None]:
        """Heartbeats while the jobs in hand are measured and answered; they start only if
        the body still runs after heartbeat_s, and stop when it ends."""
        if self.run.config.daemon_heartbeat_s is not None:  # the daemon's rule instead
            yield
            return
        done = asyncio.Event()
        every = self.run.config.heartbeat_s
        assert every is not None
        timer = asyncio.get_running_loop().call_later(
            every, self.run.start_beating, lambda: self._heartbeats(every, done)
        )
        try:
            yield
        finally:
            done.set()
            timer.cancel()

    async def _heartbeats(self, every: float, done: asyncio.Event) -> None:
        """Heartbeat now, then every `every` seconds until `done` (the job's result is
        answered): a heartbeat extends the worker's unexpired leases by one TTL."""
        while not done.is_set():
            try:
                response = await self.client.post(
                    f"/v1/workers/{self.worker_id}/heartbeat",
                    json={"busy_jobs": 1},
                    headers=HEADERS,
                )
            except httpx.HTTPError as exc:
                self.tally.errors[f"heartbeat: {type(exc).__name__}"] += 1
            else:
                if response.status_code == 200:
                    self.tally.heartbeats += 1
                else:
                    self.tally.errors[f"heartbeat: HTTP {response.status_code}"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), every)

    async def _replace(self) -> None:
        """The worker died: a replacement registers under a new name and takes its place."""
        self.generation += 1
        name = f"load-{self.run.run_id}-{self.slot}-r{self.generation}"
        self.worker_id = await self.run.register(self.client, name)


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine (Linux /proc/stat)."""
    fields = [
        int(v) for v in Path("/proc/stat").read_text(encoding="utf-8").split("\n", 1)[0].split()[1:]
    ]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


async def drive(
    bases: list[str], config: LoadConfig, cpu: Callable[[], dict[str, float]]
) -> tuple[Tally, float, dict]:
    """Register the workers, create the tasks, run the workers (then, with idle_s, let them
    poll the empty queue); return (tally, window seconds, CPU figures). `cpu()` gives the
    cumulative CPU seconds of the parts measured (the replicas, PostgreSQL) by name; the
    load's are counted from the tasks' creation on, the window from the workers' start."""
    run = LoadRun(bases, config)
    figures: dict[str, float] = {}
    beating: list[asyncio.Future] = []  # the daemon-like heartbeat loops
    try:
        workers = [
            SimulatedWorker(
                run, slot, await run.register(run.client(slot), f"load-{run.run_id}-{slot}")
            )
            for slot in range(config.workers)
        ]
        # The CPU counted from before the tasks are created: creating one builds its session
        # and proposes its first batches (about 11 ms of a replica's CPU per task), work
        # its results cost as much as the later proposals do.
        before, mine = cpu(), time.process_time()
        task_ids = await run.create_tasks()
        run.began = time.monotonic()
        run.deadline = run.began + config.seconds
        machine = machine_cpu()
        if (every := config.daemon_heartbeat_s) is not None:
            beating = [asyncio.ensure_future(w.daemon_heartbeats(every)) for w in workers]
        await asyncio.gather(run.watch(task_ids), *(w.work() for w in workers))
        after, busy = cpu(), machine_cpu()
        # The window ends with the last answered job: the idle tail of the last long polls
        # (after every task finished) is not load.
        answered = [h.answered for h in run.tally.held if h.answered is not None]
        window = (max(answered) if answered else time.monotonic()) - run.began
        figures["generator_cpu_s"] = _generator_cpu_s(mine, before, after)
        figures["machine_busy"] = (busy[0] - machine[0]) / max(1, busy[1] - machine[1])
        for name, value in after.items():
            figures[f"{name}_cpu_s"] = value - before.get(name, 0.0)
        await run.finish_heartbeats()
        if config.idle_s > 0:
            if run.tally.all_done_after_s is None and await run._any_task_active():
                # The queue is not empty: polling it would lease and answer the rest of the
                # tasks' jobs, neither an idle fleet's cost nor results of the load's window.
                run.tally.idle_skipped = "not every task was done when the run ended"
            else:
                figures.update(await _idle_phase(run, workers, cpu))
    finally:
        for task in beating:
            task.cancel()
        await asyncio.gather(*beating, return_exceptions=True)
        await run.close()
    return run.tally, window, figures


async def _idle_phase(
    run: LoadRun, workers: list[SimulatedWorker], cpu: Callable[[], dict[str, float]]
) -> dict[str, float]:
    """Every worker polls the empty queue for idle_s; the CPU that costs."""
    await asyncio.sleep(1.0)  # the last batches' proposals and requests are over
    run.tally.idle_phase = True
    before, mine, began = cpu(), time.process_time(), time.monotonic()
    until = began + run.config.idle_s
    await asyncio.gather(*(w.idle(until) for w in workers))
    after, seconds = cpu(), time.monotonic() - began
    figures = {"idle_s": seconds, "idle_generator_cpu_s": _generator_cpu_s(mine, before, after)}
    for name, value in after.items():
        figures[f"idle_{name}_cpu_s"] = value - before.get(name, 0.0)
    return figures
