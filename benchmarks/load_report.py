"""The load benchmark's report: one line per run for the terminal, and the RESULTS.md
section (the text around the figures says how they were made and how to read them)."""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.harness import RESULT_KINDS

DEFAULT_CHURN = (0.0, 0.05)  # main's runs: without churn and with


def protocol_of(c) -> str:
    """The workers' protocol in a few words (a LoadConfig)."""
    if not c.batched:
        return "single-job"
    return f"batched ({c.max_jobs}{', each reported' if c.report_each else ''})"


def _unfinished(r: dict, sentence: bool = False) -> str:
    """The jobs the run's end left to dead workers' leases (not lost), where there are any."""
    n = r.get("unfinished_jobs", 0)
    if not n:
        return ""
    jobs = f"{n} job{'s' if n != 1 else ''}"
    what = f"{jobs} of tasks the run ended before, their last lease a dead worker's"
    return f" {what[0].upper()}{what[1:]} (not lost)." if sentence else f" ({what})"


def summary(r: dict) -> str:
    """One run in one line, for the terminal."""
    c = r["config"]
    return (
        f"churn {c.churn:g}, {protocol_of(c)}, "
        f"{c.replicas} replica(s), {c.workers} workers, {r['tasks_done']}/{r['tasks']} tasks "
        f"done in {r['window_s']:.1f} s: {r['leases_per_s']:.1f} leases/s, "
        f"{r['results_per_s']:.1f} results/s, lease p50/p99 {r['lease_p50_ms']:.1f}/"
        f"{r['lease_p99_ms']:.1f} ms, result p50/p99 {r['result_p50_ms']:.1f}/"
        f"{r['result_p99_ms']:.1f} ms, empty polls {r['empty_polls']}, "
        f"HTTP errors {sum(r['http_errors'].values())}, service tracebacks "
        f"{r['service_tracebacks']}, duplicate leases {r['duplicate_leases']}, "
        f"lost jobs {r['lost_jobs']}{_unfinished(r)}, results DB/accepted {r['results_db']}/"
        f"{r['results_accepted']}, CPU per result: service "
        f"{r['service_cpu_ms_per_result']:.2f} ms (proposals "
        f"{r['proposal_cpu_ms_per_result']:.2f} ms; by thread "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["service_cpu_ms_per_result_by_thread"].items())
        + "), PostgreSQL "
        f"{r['postgres_cpu_ms_per_result']:.2f} ms, load generator "
        f"{r['generator_cpu_ms_per_result']:.2f} ms"
        + (
            f"; churn {c.churn:g} (TTL {c.lease_ttl_s:g} s): abandoned {r['abandoned']} "
            f"({r['abandoned_expired']} expired), leases expired {r['leases_expired']} "
            f"(live {r['live_leases_expired']}), re-leases {r['re_leases']} over "
            f"{r['re_leased_jobs']} jobs ({r['re_leased_one_result']} with one result), "
            f"workers registered {r['workers_registered']}, heartbeats {r['heartbeats']}"
            if c.churn > 0
            else ""
        )
        + (
            f"; answers lost {r['answers_lost']} (each retried with its request_id), "
            f"leases expired {r['leases_expired']}"
            if c.lose_answers > 0
            else ""
        )
    )


def churn_line(r: dict) -> str:
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


def section(reports: list[dict], args: argparse.Namespace) -> str:
    """The RESULTS.md section of a set of runs (`args`: the command line that made them)."""
    c = reports[0]["config"]
    churned = [r["config"] for r in reports if r["config"].churn > 0]
    rows = []
    for r in reports:
        done = r["all_done_after_s"]
        ended = f"all done at {done:.1f} s" if done is not None else "time limit"
        protocol = protocol_of(r["config"])
        rows.append(
            f"| {r['config'].churn:g} | {r['config'].replicas} | {protocol} "
            f"| {r['config'].lease_ttl_s:g} "
            f"| {r['tasks_done']}/{r['tasks']} ({ended}) "
            f"| {r['window_s']:.1f} | {r['leases']} | {r['leases_per_s']:.1f} "
            f"| {r['results_per_s']:.1f} | {r['lease_p50_ms']:.1f} / {r['lease_p99_ms']:.1f} "
            f"| {r['result_p50_ms']:.1f} / {r['result_p99_ms']:.1f} | {r['empty_polls']} "
            f"| {sum(r['http_errors'].values())} | {len(r['service_errors'])} "
            f"| {r['service_cpu_ms_per_result']:.2f} | {r['postgres_cpu_ms_per_result']:.2f} "
            f"| {r['generator_cpu_ms_per_result']:.2f} "
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
            f"by the workers; job states {r['job_states']}. {churn_line(r)} "
            f"Duplicates: {dup}. Lost: {lost}.{_unfinished(r, sentence=True)} "
            f"HTTP errors: {r['http_errors'] or 'none'}. Service errors logged: "
            f"{'; '.join(f'`{e}`' for e in r['service_errors']) or 'none'}. "
            f"Load average (1 min) before the run: {r['load_before']:.1f}."
            + (
                f" Idle: {r['config'].workers} workers polled the empty queue for "
                f"{r['idle_s']:.0f} s ({r['idle_polls']} lease requests of up to "
                f"{r['config'].idle_wait_s:g} s, {r.get('idle_heartbeats', 0)} heartbeats): "
                "service CPU "
                f"{r['empty_poll_cpu_ms_per_s']:.1f} ms/s, PostgreSQL "
                f"{r['idle_postgres_cpu_ms_per_s']:.1f} ms/s."
                if r["idle_s"]
                else ""
            )
            + (f" No idle phase: {r['idle_skipped']}." if r.get("idle_skipped") else "")
        )
    churn_text = []
    if churned:
        k = churned[0]
        churn_text = [
            f"Churn (rows with churn {k.churn:g}): each time a worker receives a job it dies "
            f"with probability {k.churn:g} (one RNG, seed {k.seed}, drawn once per job "
            "received in arrival order, so the deaths among the first N jobs are the same in "
            "every run): it never answers that job (a batched worker: any job of that lease) "
            "and never polls or heartbeats again, and "
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
            "task proposes a batch only when the one before the newest is complete, so each "
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
        "simulated HTTP clients (httpx, asyncio, one process): each leases "
        "one job at a time (single-job protocol) or up to the given number of jobs per "
        "request, answered in one `POST /v1/jobs/results` (batched protocol), with long "
        f"polls (wait {c.wait_s:g} s), waits {c.measure_ms:g} ms per job and posts "
        f"{RESULT_KINDS[c.results]}, so the figures are the service's and the database's "
        f"costs, no GPU's. Everything shares one {os.cpu_count()}-core VM: the load generator, the "
        "replicas and PostgreSQL, so a second replica adds no hardware here, only a second "
        "Python process; the figures show that replicas share the queue correctly, not how "
        "they scale on more machines. The VM is also "
        "shared with other work (the load average before each run is given below): runs "
        "made while test suites ran beside them measured 45-55 results/s, so read the rates "
        "as +-40%.",
        "",
        f"Tasks: distinct GEMM shapes on h100, strategy `{c.strategy}`, budget {c.budget} "
        f"trials each, batch size {c.batch_size} (`random` keeps two batches enqueued: the "
        "next is proposed when the one before the newest is complete; the model-based "
        f"strategies propose when their batch is complete), lease TTL {ttls} (without / with "
        "churn). A run ends when "
        f"every task is done or after {c.seconds:g} s; rates are over that window.",
        "",
        *churn_text,
        "| churn | replicas | worker protocol (jobs per lease) | lease TTL (s) | tasks done "
        "| window (s) | jobs leased | leases/s | results/s "
        "| lease p50 / p99 (ms) | result p50 / p99 (ms) | empty polls | HTTP errors "
        "| service errors logged | service CPU per result (ms) "
        "| PostgreSQL CPU per result (ms) | load generator CPU per result (ms) "
        "| machine CPU busy | leases abandoned | leases expired | re-leases "
        "| duplicate leases | lost jobs |",
        "|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|---:|---:|---:|---:|",
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
        f"Command: `python -m benchmarks.bench_load {' '.join(sys.argv[1:])}` (--workers "
        f"{args.workers} --tasks {args.tasks} --seconds {args.seconds:g} --budget "
        f"{args.budget}; churn {' and '.join(f'{x:g}' for x in args.churn or DEFAULT_CHURN)}, "
        f"seed {args.seed}). `tests/test_load_small.py` runs a small version (8 workers, 3 "
        "tasks; 2 and 1 replicas without churn, 2 replicas with churn 0.1 and a 2 s TTL) as "
        "a correctness test, `tests/test_load_batched.py` the same with batched workers and "
        "an idle phase.",
    ]
    return "\n".join(body)
