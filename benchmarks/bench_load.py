"""Load benchmark: many simulated workers against many concurrent tasks on PostgreSQL, with
one service replica or several sharing the database; leases/s, results/s, lease latency,
and a correctness audit (duplicate leases and lost jobs, both must be 0).

Each run gets a fresh PostgreSQL database. The replicas are `pipetune serve` child
processes on loopback ports (the first builds the empty schema; the next starts once it is
healthy). Tasks are created round-robin on the replicas, with a finite budget: the run
ends when every task is done or after --seconds, whichever comes first. Workers are
simulated HTTP clients in this process (httpx, asyncio), spread round-robin over the
replicas: each registers, long-polls for one job at a time, optionally sleeps
--measure-ms, and posts a made-up result (with --results simulated, the simulated runner's:
the analytical model plus noise); it always posts the job it holds before it
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

Lost answers (--lose-answers FRACTION): each answer that leased jobs (a lease, or a report
that leased) is dropped by the worker with that probability, as if the connection had
reset on the way back (the service did the work). The worker sends the same request again
with its request_id as a retry, as the worker daemon does, and must get the same jobs: a
lease that expired meanwhile (`leases expired` on the terminal line) is a job that waited
out its TTL for nothing.

After the run the services are stopped and the database is audited read-only:

* duplicate leases: jobs that two leases held at once (the lease audit table's intervals
  overlap; a lease that expired and was re-granted later is not one), jobs with two
  recorded results, and jobs two live workers held at once by their own clocks (a dead
  worker holds nothing);
* lost jobs: jobs given up as `lost`, jobs still leased (granted, never answered), leases
  a live worker received whose result was not recorded, abandoned leases whose job was
  not finished by a later lease, accepted results the database does not hold, and tasks
  whose trial counts disagree with their jobs (a finished task must have exactly its
  target number of trials, 0..target-1, each once); not lost but `unfinished_jobs`: the
  jobs of a task the run ended before (--seconds ran out) whose last lease was a dead
  worker's, still running or expired and queued again: the service would have leased them
  again had the run gone on;
* churn: leases abandoned, leases expired (audit table; abandoned ones must all end
  `expired`), re-leases (a lease granted after the job's previous lease expired), and
  whether every re-leased job holds exactly one result.

    python -m benchmarks.bench_load                    # no churn and churn 0.05, 1 and 2 replicas
    python -m benchmarks.bench_load --write            # and record in RESULTS.md
    python -m benchmarks.bench_load --replicas 2 --seconds 10
    python -m benchmarks.bench_load --churn 0.1 --lease-ttl 2 --replicas 2
    python -m benchmarks.bench_load --batched --replicas 2 --churn 0 --json   # one JSON object
    python -m benchmarks.bench_load --batched --replicas 2 --churn 0 --workers 16 --tasks 4 \
        --max-jobs 2 --measure-ms 100 --measure-spread 1 --strategy analytical+xgb \
        --propose-early 0.25     # trials of varied durations; early proposals

`--batched`: the workers use the batched protocol (each lease request asks for up to
`--max-jobs` jobs, 8 by default, and their results go back in one POST /v1/jobs/results;
`--single --batched` runs both protocols). `--idle-seconds`:
after the tasks, every worker polls the empty queue that long (10 s long polls, the worker
daemon's default) and the run reports what that costs per second (a run that ended at
--seconds with tasks unfinished has no idle phase: `idle_skipped` says why). `--json` prints one JSON
object: the run's figures (with several runs, {"runs": [...]} and the totals of duplicate
leases and lost jobs).

CPU: the replicas' (each `pipetune serve` process: the proposer thread and the rest are
in it), the PostgreSQL backends' of the run's database (benchmarks/harness.PostgresCpu),
and the load generator's own (this process, less the thread that samples PostgreSQL's
backends: on this machine it shares the cores), each per
result accepted, counted from the tasks' creation (each builds its session and proposes its
first batches) to the workers' end; and for the idle phase, per second.

Exits 1 when any run has a duplicate lease or a lost job, and for nothing else: an option
out of range, a service that does not start and a PostgreSQL that cannot be reached exit 2
with the reason (each was a traceback and exit 1, the status of a correctness failure).

The pieces: benchmarks/load_driver.py (LoadConfig, the simulated workers), load_audit.py
(find_duplicates, find_lost, find_churn), load_report.py (the terminal line and the
RESULTS.md section); this module runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import math
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any, get_args

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from benchmarks.harness import (
    DEFAULT_PG,
    RESULT_KINDS,
    PostgresCpu,
    cpu_s,
    pct,
    pg_database,
    service_cpu_counters,
)
from benchmarks.load_audit import audit
from benchmarks.load_driver import CHURN_TTL_S, MEASURING, LoadConfig, drive, serve
from benchmarks.load_report import DEFAULT_CHURN, section, summary
from benchmarks.results import write_section
from pipetune.clients.local_service import ServiceStartError
from pipetune.model.wire import MAX_SECONDS, StrategyName
from pipetune.service.settings import MAX_PROPOSER_THREADS


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
    """One run on a fresh database; returns throughput, latency, CPU and the audit."""
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
            postgres = stack.enter_context(PostgresCpu(url.rsplit("/", 1)[1]))

            bases = [base for base, _, _ in services]

            def cpu() -> dict[str, float]:
                figures = {
                    "service": sum(cpu_s(pid) for pid in pids),
                    "postgres": postgres.seconds(),
                    # This process's measuring thread: not the load generator's CPU.
                    MEASURING: postgres.own_seconds(),
                }
                # Of the service's: the tuner's proposals, and each thread role's, as the
                # replicas count them (summed over the replicas).
                for base in bases:
                    for key, value in service_cpu_counters(base).items():
                        figures[key] = figures.get(key, 0.0) + value
                return figures

            tally, window, cpu_figures = asyncio.run(
                drive([b for b, _, _ in services], config, cpu)
            )
            logs = [log for _, _, log in services]
        # Stopped: the audit reads a quiescent database.
        log_text = "\n".join(log.read_text(errors="replace") for log in logs)
        if "Traceback" in log_text and config.keep_logs:
            kept = Path(tempfile.mkdtemp(prefix="bench-load-logs-"))
            for log in logs:
                (kept / log.name).write_bytes(log.read_bytes())
            print(f"service logs with errors kept in {kept}", flush=True)
        report = audit(url, tally, dt.timedelta(seconds=config.lease_ttl_s))
    leases = len(tally.held)
    results = report["results_accepted"]
    all_lease = tally.lease_granted_s + tally.lease_empty_s
    nan = math.nan
    idle_s = cpu_figures.get("idle_s", 0.0)

    def per_result(key: str) -> float:
        # No result: no figure per result (the run's whole CPU in ms is not one).
        return 1e3 * cpu_figures[key] / results if results else nan

    def per_idle_second(key: str) -> float:
        return 1e3 * cpu_figures[key] / idle_s if idle_s else nan

    report.update(
        config=config,
        load_before=load_before,
        window_s=window,
        all_done_after_s=tally.all_done_after_s,
        leases=leases,
        leases_per_s=leases / window,
        results_per_s=results / window,
        lease_requests=len(all_lease),
        report_leases=tally.report_leases,
        answers_lost=tally.answers_lost,
        result_requests=tally.result_posts,
        empty_polls=len(tally.lease_empty_s),
        lease_p50_ms=1e3 * pct(tally.lease_granted_s, 0.5) if tally.lease_granted_s else nan,
        lease_p99_ms=1e3 * pct(tally.lease_granted_s, 0.99) if tally.lease_granted_s else nan,
        lease_all_p99_ms=1e3 * pct(all_lease, 0.99) if all_lease else nan,
        result_p50_ms=1e3 * pct(tally.result_s, 0.5) if tally.result_s else nan,
        result_p99_ms=1e3 * pct(tally.result_s, 0.99) if tally.result_s else nan,
        http_errors=dict(tally.errors),
        workers_registered=tally.registered,
        heartbeats=tally.heartbeats,
        service_tracebacks=log_text.count("Traceback"),
        service_errors=_errors_logged(log_text),
        service_cpu_ms_per_result=per_result("service_cpu_s"),
        proposal_cpu_ms_per_result=per_result("proposal_cpu_s"),
        # Where the service's CPU went, by thread role (service/thread_cpu.py).
        service_cpu_ms_per_result_by_thread={
            key.split(":", 1)[1].removesuffix("_cpu_s"): per_result(key)
            for key in sorted(cpu_figures)
            if key.startswith("thread:")
        },
        postgres_cpu_ms_per_result=per_result("postgres_cpu_s"),
        generator_cpu_ms_per_result=per_result("generator_cpu_s"),
        machine_busy=cpu_figures["machine_busy"],
        idle_s=idle_s,
        idle_polls=tally.idle_polls,
        idle_heartbeats=tally.idle_heartbeats,
        idle_jobs=tally.idle_jobs,
        idle_skipped=tally.idle_skipped,
        # What an idle fleet costs: CPU milliseconds per second of polling an empty queue.
        empty_poll_cpu_ms_per_s=per_idle_second("idle_service_cpu_s") if idle_s else nan,
        idle_postgres_cpu_ms_per_s=per_idle_second("idle_postgres_cpu_s") if idle_s else nan,
        idle_generator_cpu_ms_per_s=per_idle_second("idle_generator_cpu_s") if idle_s else nan,
    )
    return report


BATCHED_MAX_JOBS = 8  # a batched worker's lease: one task batch

JSON_KEYS = (
    "results_per_s",
    "service_cpu_ms_per_result",
    "proposal_cpu_ms_per_result",
    "service_cpu_ms_per_result_by_thread",
    "postgres_cpu_ms_per_result",
    "generator_cpu_ms_per_result",
    "duplicate_leases",
    "lost_jobs",
    "unfinished_jobs",
    "empty_poll_cpu_ms_per_s",
    "idle_postgres_cpu_ms_per_s",
    "idle_generator_cpu_ms_per_s",
    "idle_s",
    "idle_polls",
    "idle_heartbeats",
    "idle_jobs",
    "idle_skipped",
    "heartbeats",
    "leases_per_s",
    "window_s",
    "tasks_done",
    "tasks",
    "results_accepted",
    "results_db",
    "lease_requests",
    "report_leases",
    "answers_lost",
    "result_requests",
    "empty_polls",
    "lease_p50_ms",
    "lease_p99_ms",
    "result_p50_ms",
    "result_p99_ms",
    "machine_busy",
    "load_before",
    "service_tracebacks",
    "http_errors",
    "duplicates",
    "lost",
    "leases_expired",
    "re_leases",
    "abandoned",
)


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    """A run's figures and its settings, JSON-ready (NaN as null)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return None if isinstance(value, float) and math.isnan(value) else value

    out: dict[str, Any] = {}
    for key in JSON_KEYS:
        out[key] = plain(report[key])
    out["config"] = dataclasses.asdict(report["config"])
    return out


def _not_a_pg_url(text: str) -> str | None:
    """Why --pg-url is no PostgreSQL URL (None: it is one), said before anything starts:
    `nonsense` ended the run in sqlalchemy's ArgumentError."""
    try:
        url = make_url(text)
        url.get_dialect()  # (a driver sqlalchemy does not know: NoSuchModuleError)
    except ArgumentError as exc:
        return str(exc)
    if url.get_backend_name() != "postgresql":
        return f"a PostgreSQL URL, not {url.get_backend_name()}'s"
    return None


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
    parser.add_argument(
        "--strategy",
        default=LoadConfig.strategy,
        choices=get_args(StrategyName),  # (the service answered another name with a 422)
    )
    parser.add_argument("--measure-ms", type=float, default=0.0, help="simulated measurement")
    parser.add_argument(
        "--measure-spread",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="log-normal spread of each measurement's duration around --measure-ms (its mean;"
        " 0: all take --measure-ms)",
    )
    parser.add_argument(
        "--propose-early",
        type=float,
        metavar="SHARE",
        help="the replicas' PIPETUNE_PROPOSE_EARLY (default: the service's)",
    )
    parser.add_argument(
        "--proposer-threads",
        type=int,
        metavar="N",
        help="the replicas' PIPETUNE_PROPOSER_THREADS (default: the service's)",
    )
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
        "--lose-answers",
        type=float,
        default=LoadConfig.lose_answers,
        metavar="FRACTION",
        help="probability that an answer that leased jobs is lost on the way back; the worker "
        "sends the request again with its request_id as a retry, as the worker daemon does "
        "(default 0)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        metavar="SECONDS",
        help=f"the replicas' lease TTL (default: {LoadConfig.lease_ttl_s:g} s without churn, "
        f"{CHURN_TTL_S:g} s with)",
    )
    parser.add_argument("--seed", type=int, default=LoadConfig.seed, help="of the churn draws")
    parser.add_argument(
        "--batched",
        action="store_true",
        help="the batched worker protocol: leases of up to --max-jobs jobs, their results "
        "in one POST /v1/jobs/results",
    )
    parser.add_argument(
        "--single",
        action="store_true",
        help="with --batched: run the single-job protocol too (alone it is the default)",
    )
    parser.add_argument(
        "--separate-leases",
        action="store_true",
        help="with --batched: workers lease with a request of their own after each report "
        "(by default a report leases the next jobs, as the worker daemon's reporter does)",
    )
    parser.add_argument(
        "--report-each",
        action="store_true",
        help="with --batched: report each job as soon as it is measured, the report leasing "
        "what tops the jobs in hand back up to --max-jobs (the worker daemon with one GPU)",
    )
    parser.add_argument(
        "--max-jobs",
        type=int,
        help=f"jobs per lease request of batched workers (default {BATCHED_MAX_JOBS})",
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=LoadConfig.wait_s,
        help="how long a worker's lease request waits for jobs while the tasks run (the "
        f"worker daemon waits {LoadConfig.idle_wait_s:g} s; default {LoadConfig.wait_s:g})",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=0.0,
        help="after the tasks, poll the empty queue this long and report its CPU per second",
    )
    parser.add_argument(
        "--daemon-heartbeat",
        type=float,
        default=None,
        metavar="S",
        help="workers heartbeat as the worker daemon given `--heartbeat S` does (its default "
        "is 5), the whole run long, idle phase included (default: only in holds longer "
        "than a quarter of the lease TTL)",
    )
    parser.add_argument(
        "--results",
        choices=tuple(RESULT_KINDS),
        default=LoadConfig.results,
        help="what workers answer: made-up results (they contradict the analytical model, "
        "so a model-guided task drops its prior) or the simulated runner's (the model plus "
        "noise: SIMULATED)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--write", action="store_true", help="record in benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.report_each and (not args.batched or args.separate_leases):
        parser.error("--report-each: with --batched, and without --separate-leases")
    if args.daemon_heartbeat is not None and not args.daemon_heartbeat > 0:
        parser.error("--daemon-heartbeat: a number of seconds above 0")
    for option, values in (
        ("--replicas", args.replicas or []),
        ("--workers", [args.workers]),
        ("--tasks", [args.tasks]),
        ("--budget", [args.budget]),
        ("--batch-size", [args.batch_size]),
        ("--max-jobs", [] if args.max_jobs is None else [args.max_jobs]),
    ):
        if any(v < 1 for v in values):
            parser.error(f"{option}: at least 1")
    if any(not 0 <= c < 1 for c in args.churn or []):
        parser.error("--churn: a probability in [0, 1)")
    if not args.seconds > 0:
        parser.error("--seconds: a number of seconds above 0")
    if not 0 <= args.lose_answers < 1:
        parser.error("--lose-answers: a probability in [0, 1)")
    for option, value in (
        ("--idle-seconds", args.idle_seconds),
        ("--measure-ms", args.measure_ms),
        ("--measure-spread", args.measure_spread),
        ("--wait-s", args.wait_s),
    ):
        if not value >= 0:
            parser.error(f"{option}: 0 or more")
    # The replicas' own limits (service/settings.py), which they refused only at start.
    if args.lease_ttl is not None and not 0 < args.lease_ttl <= MAX_SECONDS:
        parser.error(f"--lease-ttl: a number of seconds above 0, at most {MAX_SECONDS:g}")
    if args.propose_early is not None and not 0 <= args.propose_early < 1:
        parser.error("--propose-early: a share in [0, 1)")
    if args.proposer_threads is not None and not (
        1 <= args.proposer_threads <= MAX_PROPOSER_THREADS
    ):
        parser.error(f"--proposer-threads: within 1..{MAX_PROPOSER_THREADS}")
    if why := _not_a_pg_url(args.pg_url):
        parser.error(f"--pg-url: {why}")
    say = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print

    # --batched alone: the batched protocol; with --single too: both, one after the other.
    protocols = ([False] if args.single or not args.batched else []) + (
        [True] if args.batched else []
    )
    reports = []
    for churn in args.churn or DEFAULT_CHURN:
        for batched in protocols:
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
                    measure_spread=args.measure_spread,
                    propose_early=args.propose_early,
                    proposer_threads=args.proposer_threads,
                    lease_ttl_s=ttl,
                    churn=churn,
                    lose_answers=args.lose_answers,
                    seed=args.seed,
                    batched=batched,
                    lease_with_results=not args.separate_leases,
                    report_each=args.report_each and batched,
                    max_jobs=(args.max_jobs or BATCHED_MAX_JOBS) if batched else 1,
                    idle_s=args.idle_seconds,
                    daemon_heartbeat_s=args.daemon_heartbeat,
                    wait_s=args.wait_s,
                    results=args.results,
                )
                try:
                    report = run_load(args.pg_url, config)
                except ServiceStartError as exc:
                    print(f"bench_load: the service did not start: {exc}", file=sys.stderr)
                    return 2
                except OperationalError as exc:  # (refused, unknown host or database, auth)
                    print(f"bench_load: PostgreSQL: {exc.orig or exc}", file=sys.stderr)
                    return 2
                say(summary(report), flush=True)
                if report["http_errors"]:
                    say("  HTTP errors:", report["http_errors"], flush=True)
                if report["idle_skipped"]:
                    say("  no idle phase:", report["idle_skipped"], flush=True)
                for error in report["service_errors"]:
                    say("  service error:", error, flush=True)
                reports.append(report)
    failed = [r for r in reports if r["duplicate_leases"] or r["lost_jobs"]]
    if args.json:
        runs = [as_json(r) for r in reports]
        if len(runs) == 1:
            print(json.dumps(runs[0], indent=2))
        else:
            total = {k: sum(r[k] for r in runs) for k in ("duplicate_leases", "lost_jobs")}
            print(json.dumps({**total, "runs": runs}, indent=2))
        return 1 if failed else 0
    text_body = section(reports, args)
    print(text_body)
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
