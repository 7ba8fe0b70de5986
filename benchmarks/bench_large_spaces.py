"""Benchmark: pipetune's knob-only strategies on Kernel Tuner-like spaces of 10^5 to 10^6
configurations (synthetic, not measurements), one proposal round at a time.

    python -m benchmarks.bench_large_spaces [--sizes 200000,1000000] [--budget 50] [--trace]
    python -m benchmarks.bench_large_spaces --write-cache /tmp/big.kt-cache.json.gz --sizes 200000

The space: 17 knobs of 2 to 5 values (one of them text), a seeded sample of their grid of
49,766,400 cells under one restriction (block_size_x * block_size_y <= 1024), latency a
seeded bowl with an interaction and 2% noise, failing where three tiling knobs are all large
and at random in 1% of the rest (`RuntimeFailedConfig`). Each strategy of the registry that
needs no analytical model (grid, random, xgb, bo, auto) searches it in batches of 8 through
`--budget` trials, answered from the recording; per strategy: the building of its search
space, each round's CPU time (this process is single-threaded: one core), and best-in-k.
`--trace`: a second pass under tracemalloc for the most memory the search held at once (its
own allocations; numpy reports its arrays to it), which slows it.

`--write-cache PATH`: instead, write the first size's space as a Kernel Tuner cache file
(gzip'd JSON), for `pipetune bench tuner --dataset PATH`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
import tracemalloc
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from pipetune.tuner.bench import run_strategy_rows
from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs
from pipetune.tuner.strategies import KNOB_ONLY, make_strategy

KNOBS: dict[str, list[Any]] = {
    "block_size_x": [16, 32, 64, 128, 256],
    "block_size_y": [1, 2, 4, 8, 16],
    "tile_x": [1, 2, 4, 8],
    "tile_y": [1, 2, 4, 8],
    "vec": [1, 2, 4],
    "unroll": [0, 1],
    "smem_a": [0, 1],
    "smem_b": [0, 1],
    "stages": [1, 2, 3, 4],
    "prefetch": [0, 1],
    "split_k": [1, 2, 4],
    "swizzle": [0, 1, 2],
    "layout": ["row", "col", "tiled"],
    "loop_order": [0, 1],
    "use_ldg": [0, 1],
    "warp_k": [1, 2],
    "regs": [32, 64, 128],
}
BATCH = 8


def synthetic_index(size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Value indices (configurations x knobs) of about `size` configurations, in the order
    Kernel Tuner lists them, and each one's latency in ms (inf: failed)."""
    rng = np.random.default_rng(seed)
    radix = np.array([len(v) for v in KNOBS.values()])
    grid = int(np.prod(radix))
    codes = rng.choice(grid, size=min(grid, int(size * 1.9)), replace=False)
    index = np.empty((len(codes), len(radix)), dtype=np.int64)
    for j in range(len(radix) - 1, -1, -1):
        index[:, j], codes = codes % radix[j], codes // radix[j]
    threads = (
        np.array(KNOBS["block_size_x"])[index[:, 0]] * np.array(KNOBS["block_size_y"])[index[:, 1]]
    )
    index = index[threads <= 1024][:size]
    index = index[np.lexsort(index.T[::-1])]
    x = index / (radix - 1)
    centre, weight = rng.uniform(0.2, 0.8, len(radix)), rng.uniform(0.1, 1.0, len(radix))
    ms = 1.0 + ((x - centre) ** 2 * weight).sum(axis=1) + 0.3 * x[:, 2] * x[:, 3]
    ms += 0.2 * (index[:, 12] == 1)
    ms *= np.exp(0.02 * rng.standard_normal(len(index)))
    failed = (x[:, 2] + x[:, 3] + x[:, 8] > 2.4) | (rng.random(len(index)) < 0.01)
    ms[failed] = np.inf
    return index, ms


def recorded_configs(size: int, seed: int = 0) -> RecordedConfigs:
    index, ms = synthetic_index(size, seed)
    names, values = list(KNOBS), list(KNOBS.values())
    configs = [
        {k: values[j][i] for j, (k, i) in enumerate(zip(names, row, strict=True))}
        for row in index.tolist()
    ]
    return RecordedConfigs(f"synthetic-{len(index)}", KNOBS, configs, ms)


def write_cache(path: str, size: int, seed: int = 0) -> int:
    """The space as a Kernel Tuner cache document (what `pipetune bench tuner` reads)."""
    recorded = recorded_configs(size, seed)
    cache = {}
    for config, ms in zip(recorded.configs, recorded.objective_ms.tolist(), strict=True):
        entry: dict[str, Any] = dict(config)
        entry["time"] = "RuntimeFailedConfig" if not np.isfinite(ms) else round(ms, 6)
        entry.update(compile_time=100.0, benchmark_time=10.0, framework_time=1.0)
        entry.update(strategy_time=0, verification_time=0)
        entry["timestamp"] = "2025-01-01 00:00:00+00:00"
        cache[",".join(str(v) for v in config.values())] = entry
    document = {
        "device_name": "synthetic",
        "kernel_name": "synthetic",
        "problem_size": [4096, 4096],
        "tune_params_keys": list(KNOBS),
        "tune_params": KNOBS,
        "objective": "time",
        "cache": cache,
    }
    with gzip.open(path, "wt") as out:
        json.dump(document, out)
    return len(cache)


class Timed:
    """A strategy whose next_batch calls are timed (CPU seconds of this process)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.cpu: list[float] = []

    def next_batch(self, n, exclude, history):
        started = time.process_time()
        rows = self.strategy.next_batch(n, exclude, history)
        self.cpu.append(time.process_time() - started)
        return rows


def run(recorded: RecordedConfigs, strategy: str, budget: int, trace: bool) -> dict[str, Any]:
    started = time.process_time()
    space = ForeignSpace(recorded)
    timed = Timed(make_strategy(strategy, space, seed=0))
    setup = time.process_time() - started
    rows = run_strategy_rows(timed, recorded.objective_ms, budget, BATCH)  # type: ignore[arg-type]
    result = {
        "setup_s": setup,
        "median_s": statistics.median(timed.cpu),
        "max_s": max(timed.cpu),
        "total_s": sum(timed.cpu),
        "best": float(recorded.throughput[rows].max() / recorded.optimum),
    }
    if trace:
        tracemalloc.start()
        try:
            run_strategy_rows(
                make_strategy(strategy, space, seed=0), recorded.objective_ms, budget, BATCH
            )
            result["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200000,1000000")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--strategies", default=",".join(KNOB_ONLY))
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--write-cache", metavar="PATH")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.write_cache:
        count = write_cache(args.write_cache, sizes[0])
        print(f"{args.write_cache}: {count} configurations")
        return 0
    print(
        "| space | strategy | building (s) | median round (s) | longest round (s) "
        "| all rounds (s) | best-in-k | peak traced (MB) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    with threadpool_limits(limits=1):
        for size in sizes:
            recorded = recorded_configs(size)
            for strategy in args.strategies.split(","):
                r = run(recorded, strategy, args.budget, args.trace)
                peak = f"{r['peak_mb']:.0f}" if "peak_mb" in r else "-"
                print(
                    f"| {len(recorded.configs):,} | `{strategy}` | {r['setup_s']:.1f} "
                    f"| {r['median_s']:.2f} | {r['max_s']:.2f} | {r['total_s']:.1f} "
                    f"| {r['best']:.3f} | {peak} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
