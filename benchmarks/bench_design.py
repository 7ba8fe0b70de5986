"""Benchmark: the initial design (tuner/design.py), or a whole search, over a wide Kernel
Tuner-like space.

    python -m benchmarks.bench_design [--configs 200000] [--values 500] [--picks 32]
    python -m benchmarks.bench_design --search-trials 24

Builds a recorded space of `--configs` configurations with six 8-valued numeric knobs and one
text knob of `--values` values (one-hot in the surrogate's features), then times
`design_rows` and reports the peak resident memory it added, and its first picks (which a
change to how the design computes must not move). With `--search-trials N`: instead, `auto`
from building its encoding through N trials in batches of 8 (answered by a smooth made-up
objective), its time, the peak resident memory it added and its first rows.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from pipetune.tuner.bench import run_strategy_rows
from pipetune.tuner.design import design_rows
from pipetune.tuner.encoding import KnobEncoding
from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs
from pipetune.tuner.strategies import make_strategy


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=200_000)
    parser.add_argument("--values", type=int, default=500)
    parser.add_argument("--picks", type=int, default=32)
    parser.add_argument("--search-trials", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    numeric = rng.integers(0, 8, size=(args.configs, 6))
    kinds = rng.integers(0, args.values, size=args.configs)
    knobs = {f"n{i}": list(range(8)) for i in range(6)}
    knobs["kind"] = [f"k{i}" for i in range(args.values)]
    configs = [
        {**{f"n{i}": int(v[i]) for i in range(6)}, "kind": f"k{c}"}
        for v, c in zip(numeric, kinds, strict=True)
    ]
    objective = 1.0 + 0.05 * ((numeric - 3.5) ** 2).sum(axis=1) + 0.02 * (kinds % 7)
    recorded = RecordedConfigs("wide", knobs, configs, objective)
    space = ForeignSpace(recorded)
    if args.search_trials:
        before = _peak_mib()
        started = time.perf_counter()
        strategy = make_strategy("auto", space, 0)
        rows = run_strategy_rows(strategy, recorded.objective_ms, args.search_trials, 8)
        took = time.perf_counter() - started
        print(
            f"auto, {args.search_trials} trials in batches of 8 over {args.configs} "
            f"configurations: {took:.1f} s; peak RSS +{_peak_mib() - before:.0f} MiB; "
            f"first rows {rows[:4]}"
        )
        return 0
    encoding = KnobEncoding.of(space)
    before = _peak_mib()
    started = time.perf_counter()
    rows = design_rows(encoding, args.picks, 0)
    took = time.perf_counter() - started
    print(
        f"design of {args.picks} over {args.configs} configurations, features "
        f"{encoding.features.shape}: {took:.2f} s; peak RSS +{_peak_mib() - before:.0f} MiB; "
        f"first picks {rows[:4]}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
