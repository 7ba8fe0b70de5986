"""What the service benchmarks share: `pipetune serve` in a child process, a fresh
PostgreSQL database per run, simulated workers' requests, and a few measurement helpers."""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from pipetune.clients.local_service import LocalService
from pipetune.model.family import parse_any_workload
from pipetune.model.wire import ScheduleDoc
from pipetune.service.thread_cpu import stat_cpu_s
from pipetune.workers.runners.simulated import SimulatedRunner

TOKEN = "bench-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text(encoding="utf-8"))


def service_cpu_counters(base_url: str) -> dict[str, float]:
    """A running service's CPU counters so far, in seconds, from its /metrics: `proposal`
    (the tuner's proposals, every strategy: pipetune_proposal_cpu_seconds_total) and, per
    thread role, `thread:<role>` (pipetune_thread_cpu_seconds_total: event_loop, proposer,
    listener, thread_pool, other)."""
    return cpu_counters(httpx.get(f"{base_url}/metrics", timeout=10).text)


def cpu_counters(metrics_text: str) -> dict[str, float]:
    """`service_cpu_counters` from a /metrics exposition's text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"proposal": 0.0}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "pipetune_proposal_cpu_seconds_total":
                out["proposal"] += sample.value
            elif sample.name == "pipetune_thread_cpu_seconds_total":
                key = f"thread:{sample.labels['role']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank below) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def service_process(url: str, log: Path, settings: dict[str, str]) -> Iterator[LocalService]:
    """`pipetune serve` on a free loopback port (clients.local_service), with the
    benchmarks' settings and no PIPETUNE_* variable inherited from this shell."""
    env = {
        "PIPETUNE_WORKER_TOKENS": TOKEN,
        "PIPETUNE_DB_POOL_SIZE": "40",
        "PIPETUNE_LEASE_WAIT_CAP_S": "2",
        **settings,
    }
    service = LocalService(
        url, log, extra_args=["--log-level", "warning"], env=env, inherit_settings=False
    ).start(timeout_s=60)
    try:
        yield service
    finally:
        service.stop()


@contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database (its URL), dropped afterwards."""
    name = f"pipetune_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


async def register_worker(client: httpx.AsyncClient, name: str) -> int:
    """Register a simulated h100 worker; its id (raises on a non-2xx answer)."""
    body = {"name": name, "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    response = await client.post("/v1/workers", json=body, headers=HEADERS)
    response.raise_for_status()
    return int(response.json()["id"])


def fake_result(job: dict) -> dict:
    """A made-up, deterministic result for a leased job (distinct per schedule)."""
    s = job["schedule"]
    latency = 20.0 + sum((i + 1) * v for i, v in enumerate(s.values())) % 53
    return {"status": "ok", "latency_us": latency, "samples_us": [latency], "spread": 0.0}


class SimulatedResults:
    """The simulated runner's answer for a leased job, at once (the analytical model plus its
    stated noise; SIMULATED, never a measurement).

    Made-up results (`fake_result`) contradict the analytical model, so a model-guided
    strategy soon drops its prior and searches without it; these follow the model, so a run
    measures the service as it works when the model ranks the space well."""

    def __init__(self) -> None:
        self._runners: dict[str, SimulatedRunner] = {}

    def __call__(self, job: dict) -> dict:
        runner = self._runners.get(job["gpu"])
        if runner is None:
            runner = self._runners[job["gpu"]] = SimulatedRunner(job["gpu"], time_scale=0)
        workload = parse_any_workload(job["workload"])
        schedule = ScheduleDoc.model_validate(job["schedule"]).to_schedule()
        return runner.measure(workload, [schedule])[0].model_dump(mode="json")


# What the load benchmark's workers may answer, as its report describes each kind.
RESULT_KINDS = {
    "made-up": "made-up results",
    "simulated": "SIMULATED results (the simulated runner's: the analytical model plus its "
    "noise, not measurements)",
}


def result_maker(kind: str) -> Callable[[dict], dict]:
    """What the load benchmark's workers answer, by kind (one of RESULT_KINDS)."""
    if kind == "made-up":
        return fake_result
    if kind == "simulated":
        return SimulatedResults()
    raise ValueError(f"results must be {' or '.join(RESULT_KINDS)}, got {kind!r}")


def _proc_cmdline(pid: str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


class PostgresCpu:
    """CPU seconds spent by the PostgreSQL backends of one database (on this machine): the
    processes whose title is `postgres: ... <user> <database> ...`, sampled every
    `every_s` by a thread, so a backend that exits between samples loses at most that much.
    The server's shared processes (checkpointer, WAL writer) serve every database on the
    server, other people's included, and are not counted. A server whose processes this
    machine's /proc does not show (another host, another container) is not measured: NaN,
    not 0."""

    def __init__(self, database: str, every_s: float = 0.2):
        self.database = database
        self.every_s = every_s
        self._seen: dict[str, tuple[float, float]] = {}  # pid -> (cpu at first sight, last)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-cpu", daemon=True)
        self._started = False
        self._own_s = 0.0  # CPU seconds the sampling thread has used (this process's)

    def _backends(self) -> list[str]:
        marker = f" {self.database} "
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                title = _proc_cmdline(entry)
                if title.startswith("postgres: ") and marker in title:
                    pids.append(entry)
        return pids

    def _sample(self) -> None:
        for pid in self._backends():
            try:
                now = cpu_s(int(pid))
            except (OSError, IndexError, ValueError):
                continue
            with self._lock:
                # A backend already running at start counts from then; a later one whole.
                first = self._seen.get(pid, (now if not self._started else 0.0, now))[0]
                self._seen[pid] = (first, now)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()
            with self._lock:
                self._own_s = time.thread_time()

    def own_seconds(self) -> float:
        """CPU seconds the sampling thread has used so far: the measurement's, in the process
        that measures (walking /proc every `every_s`), not the work it measures."""
        with self._lock:
            return self._own_s

    def __enter__(self) -> PostgresCpu:
        self._sample()
        self._started = True
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def seconds(self) -> float:
        """CPU seconds of the database's backends since the start; NaN while no backend of
        it has been seen (the run's services hold connections to it, so none seen means its
        server's processes are out of sight: nothing measured)."""
        self._sample()
        with self._lock:
            if not self._seen:
                return math.nan
            return sum(last - first for first, last in self._seen.values())
