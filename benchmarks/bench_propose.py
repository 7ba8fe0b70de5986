"""Benchmark: wall time of one proposal round (model fit + acquisition, batch of 8), per
strategy, on one core.

    python -m benchmarks.bench_propose [--write]
    python -m benchmarks.bench_propose --tasks 4 --budget 120 [--strategy analytical+xgb]

1. A pipetune schedule space of several thousand schedules; measurements are answered by the
   analytical model with the simulated runner's noise (3% lognormal, seeded; no GPU). Only
   the tuner's own time is measured, but the answers steer the search: answers exactly equal
   to the model would leave `analytical+xgb` residuals of rounding error to model.
2. The largest recorded space of the development set (CLBlast-style GEMM on the RTX 3090,
   17,956 configurations, a Kernel Tuner cache), answered from the recording, through 100
   trials: the later rounds fit the surrogate to the most trials and are the slowest.

BLAS is limited to one thread (the goal is "under 0.5 s on one core").

`--tasks N`: instead, the proposer's CPU over whole tasks, per result (what the fleet
benchmark's service spends proposing, benchmarks/bench_load.py): the load benchmark's first N
GEMMs on H100 (its `workload(i)`, seed i), answered as in 1., batches of 8 through `--budget`;
with `--results made-up`, by the load benchmark's made-up results instead (they contradict the
analytical model: a model-guided task then fits both of its GPs, the costliest case).

`--space-size N`: instead, a space bigger than any recorded one: six knobs of equal levels,
about N configurations (8 levels: 262,144), a smooth landscape with a failing corner (test
plumbing, not measurements), searched by `auto` and `xgb` in batches of 8 through `--budget`
trials. Per strategy, the rounds' wall and CPU time (a first pass), then the most memory the
search held at once (a second pass under tracemalloc, which slows it; numpy reports its arrays
to it): the tuner's own allocations, not the space's.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.results import write_section
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import ALCOP
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.tuner.allocator import keep_freed_blocks
from pipetune.tuner.bench import run_strategy_rows
from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs
from pipetune.tuner.session import TuningSession
from pipetune.tuner.strategies import make_strategy
from pipetune.workers.runners.simulated import DEFAULT_SIGMA

GEMM_CACHE = (
    Path(__file__).resolve().parents[2] / "shared" / "datasets" / "gemm_RTX_3090.kt-cache.json.gz"
)

ROUNDS = 8
BATCH = 8


def simulated_latency(space: Space, seed: int) -> np.ndarray:
    """The analytical model's latency (s) of every schedule with the simulated runner's noise."""
    rng = np.random.default_rng(seed)
    return evaluate(space).T_kernel * np.exp(DEFAULT_SIGMA * rng.standard_normal(len(space)))


def answer(session: TuningSession, proposed: list, latency: np.ndarray) -> None:
    """Observe the proposed schedules as measured at `latency`."""
    space = session.space
    session.observe(
        [
            (s, MeasureResult(status="ok", latency_us=float(latency[space.index(s)]) * 1e6))
            for s in proposed
        ]
    )


def time_rounds(strategy: str, space: Space) -> tuple[float, list[float]]:
    latency = simulated_latency(space, 0)
    t0 = time.perf_counter()
    session = TuningSession(
        space.workload, space.gpu, strategy, seed=0, budget=ROUNDS * BATCH, space=space
    )
    setup = time.perf_counter() - t0
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        proposed = session.propose(BATCH)
        rounds.append(time.perf_counter() - t0)
        answer(session, proposed, latency)
    return setup, rounds


class Timed:
    """Wraps a strategy and records the wall and CPU time of each next_batch call (CPU time
    of this single-threaded process is the one-core figure even on a shared machine)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.rounds: list[float] = []
        self.cpu: list[float] = []

    def next_batch(self, n, exclude, history):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = self.strategy.next_batch(n, exclude, history)
        self.rounds.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)
        return rows


def foreign_rounds(strategy: str, budget: int = 100) -> tuple[int, Timed]:
    from pipetune.clients.cli.bench_cmds import recorded_dataset

    configs = recorded_dataset(GEMM_CACHE).configs
    timed = Timed(make_strategy(strategy, ForeignSpace(configs), seed=0))
    run_strategy_rows(timed, configs.objective_ms, budget, BATCH)  # type: ignore[arg-type]
    return len(configs.configs), timed


SYNTHETIC_KNOBS = 6


def synthetic_space(size: int, seed: int = 0) -> RecordedConfigs:
    """About `size` configurations: SYNTHETIC_KNOBS knobs of equal levels, latency a seeded
    bowl (each knob its own weight) with 3% noise, failing where the knobs' sum is in its top
    fifth (as too much shared memory would)."""
    levels = max(2, round(size ** (1 / SYNTHETIC_KNOBS)))
    rng = np.random.default_rng(seed)
    index = np.array(list(itertools.product(range(levels), repeat=SYNTHETIC_KNOBS)))
    centre = rng.uniform(0, levels - 1, SYNTHETIC_KNOBS)
    weight = rng.uniform(0.05, 0.4, SYNTHETIC_KNOBS)
    ms = 1.0 + ((index - centre) ** 2 * weight).sum(axis=1) / levels
    ms *= np.exp(0.03 * rng.standard_normal(len(index)))
    ms[index.sum(axis=1) > 0.8 * SYNTHETIC_KNOBS * (levels - 1)] = np.inf
    knobs = {f"k{j}": list(range(levels)) for j in range(SYNTHETIC_KNOBS)}
    configs = [dict(zip(knobs, row, strict=True)) for row in index.tolist()]
    return RecordedConfigs(f"synthetic-{len(index)}", knobs, configs, ms)


def large_space_rounds(strategy: str, configs: RecordedConfigs, budget: int) -> tuple[Timed, int]:
    """The rounds' times, and the peak bytes the search allocated (a second, traced pass)."""
    space = ForeignSpace(configs)
    timed = Timed(make_strategy(strategy, space, seed=0))
    run_strategy_rows(timed, configs.objective_ms, budget, BATCH)  # type: ignore[arg-type]
    again = make_strategy(strategy, space, seed=0)
    tracemalloc.start()
    try:
        run_strategy_rows(again, configs.objective_ms, budget, BATCH)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return timed, peak


def task_cpu(
    strategy: str, tasks: int, budget: int, results: str = "simulated"
) -> tuple[float, int]:
    """CPU seconds of `propose` over whole tasks of the load benchmark's GEMMs, and the
    number of trials proposed; `results`: "simulated" (the model plus noise) or the load
    benchmark's "made-up" ones."""
    from benchmarks.harness import fake_result
    from benchmarks.load_driver import workload
    from pipetune.model.workloads import parse_workload

    cpu, proposed_total = 0.0, 0
    for i in range(tasks):
        space = Space.enumerate(parse_workload(workload(i)), get_gpu("h100", calibrated=False))
        latency = simulated_latency(space, i)
        if results == "made-up":
            latency = np.array(
                [fake_result({"schedule": s.as_dict()})["latency_us"] for s in space]
            )
            latency = latency * 1e-6
        session = TuningSession(
            space.workload, space.gpu, strategy, seed=i, budget=budget, space=space
        )
        while session.remaining > 0:
            c0 = time.process_time()
            proposed = session.propose(BATCH)
            cpu += time.process_time() - c0
            proposed_total += len(proposed)
            answer(session, proposed, latency)
    return cpu, proposed_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--tasks", type=int, default=0, help="whole tasks instead (see above)")
    parser.add_argument("--budget", type=int, default=120)
    parser.add_argument("--strategy", default="analytical+xgb")
    parser.add_argument(
        "--results",
        choices=("simulated", "made-up"),
        default="simulated",
        help="with --tasks: what answers the trials (see above)",
    )
    parser.add_argument(
        "--space-size", type=int, default=0, help="a large synthetic space instead (see above)"
    )
    args = parser.parse_args()
    threadpool_limits(limits=1)  # one core, as the goal states
    keep_freed_blocks()  # as the service does (tuner/allocator.py)
    if args.space_size > 0:
        configs = synthetic_space(args.space_size)
        print(
            f"{configs.name}: {len(configs.configs)} configurations, batch {BATCH}, "
            f"{args.budget} trials (synthetic landscape, not measurements)"
        )
        print(
            "| strategy | rounds | median round (ms) | max round (ms) | max round CPU (ms) "
            "| peak allocated (MB) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for strategy in ("auto", "xgb"):
            t, peak = large_space_rounds(strategy, configs, args.budget)
            print(
                f"| {strategy} | {len(t.rounds)} | {statistics.median(t.rounds) * 1e3:.0f} "
                f"| {max(t.rounds) * 1e3:.0f} | {max(t.cpu) * 1e3:.0f} | {peak / 2**20:.0f} |"
            )
        return
    if args.tasks > 0:
        cpu, n = task_cpu(args.strategy, args.tasks, args.budget, args.results)
        print(
            f"{args.strategy}: {args.tasks} tasks of {args.budget} trials, {n} proposed "
            f"({args.results} results): "
            f"{cpu * 1e3:.0f} ms of CPU, {cpu / n * 1e3:.2f} ms per result"
        )
        return
    space = Space.enumerate(ALCOP["MM_Square_4k"], get_gpu("h100", calibrated=False))
    lines = [
        f"MM_Square_4k on H100: {len(space)} schedules, batch {BATCH}, {ROUNDS} rounds.",
        "Setup = session creation; times with BLAS on one thread.",
        "",
        "| strategy | setup (ms) | median round (ms) | max round (ms) |",
        "|---|---:|---:|---:|",
    ]
    for strategy in ("grid", "random", "analytical", "xgb", "bo", "analytical+xgb", "auto"):
        setup, rounds = time_rounds(strategy, space)
        lines.append(
            f"| {strategy} | {setup * 1e3:.0f} | {statistics.median(rounds) * 1e3:.1f} | {max(rounds) * 1e3:.1f} |"
        )
    if GEMM_CACHE.exists():
        lines += [
            "",
            f"`{GEMM_CACHE.name}` (Kernel Tuner cache), batch {BATCH}, 100 trials:",
            "",
            "| strategy | configurations | rounds | median round (ms) | max round (ms) | max round CPU (ms) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for strategy in ("xgb", "auto"):
            size, t = foreign_rounds(strategy)
            lines.append(
                f"| {strategy} | {size} | {len(t.rounds)} | {statistics.median(t.rounds) * 1e3:.0f} | {max(t.rounds) * 1e3:.0f} | {max(t.cpu) * 1e3:.0f} |"
            )
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section("propose-round", "Tuner: proposal round time", body)


if __name__ == "__main__":
    main()
