"""Benchmark: wall time of one proposal round (cost-model refit + simulated annealing,
batch of 8) over a space of several thousand schedules, per strategy.

    python benchmarks/bench_propose.py [--write]

Measurements are answered by the analytical model itself (no GPU); only the tuner's own
time is measured, which does not depend on where latencies come from.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import write_section
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import ALCOP
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.tuner.session import TuningSession

ROUNDS = 8
BATCH = 8


def time_rounds(strategy: str, space: Space) -> tuple[float, list[float]]:
    latency = evaluate(space).T_kernel
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
        session.observe(
            [
                (s, MeasureResult(status="ok", latency_us=float(latency[space.index(s)]) * 1e6))
                for s in proposed
            ]
        )
    return setup, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    space = Space.enumerate(ALCOP["MM_Square_4k"], get_gpu("h100", calibrated=False))
    lines = [
        f"MM_Square_4k on H100: {len(space)} schedules, batch {BATCH}, {ROUNDS} rounds.",
        "Setup = session creation (pretraining the prior for analytical+xgb).",
        "",
        "| strategy | setup (ms) | median round (ms) | max round (ms) |",
        "|---|---:|---:|---:|",
    ]
    for strategy in ("grid", "random", "analytical", "xgb", "analytical+xgb"):
        setup, rounds = time_rounds(strategy, space)
        lines.append(
            f"| {strategy} | {setup * 1e3:.0f} | {statistics.median(rounds) * 1e3:.1f} | {max(rounds) * 1e3:.1f} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section("propose-round", "Tuner: proposal round time", body)


if __name__ == "__main__":
    main()
