"""Benchmark: NVRTC compile time of pipetune's kernels, per schedule and per variant, and the
suite's kernel counts: the compile side of the GPU campaign's time plan (README, "GPU work").

    python -m benchmarks.bench_compile [--sample 24] [--write]

For each kernel variant of the ALCOP suite, a uniform seeded sample of one operator's
schedule space is compiled for sm_90, one kernel at a time on one thread, with the cubin
cache off (every compile is a real NVRTC + ptxas run). Then another sample of the same size
is compiled by the compile pool (workers.compile.compile_many) on every core, for the
throughput the pool reaches here. The suite's counts: trials (schedules of the 23 operators)
and distinct kernels (one per variant and schedule, shared by every operator of a variant).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

from benchmarks.results import write_section
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import ALCOP
from pipetune.model.space import Space
from pipetune.workers.codegen import generate, variant_of
from pipetune.workers.compile import compile_kernel, compile_many
from pipetune.workers.runners.sweep import select_schedules

# The operator whose space stands for each variant (every operator of a variant shares its
# kernels; the spaces differ only where a small shape rules schedules out).
SAMPLED = {"gemm_kn": "MM_Square_1k", "bmm": "BMM_BERT_SV", "conv2d": "Conv2D_RN50_3",
           "conv3d": "Conv3D_1"}  # fmt: skip
ARCH = "sm_90"


def suite_counts() -> tuple[int, dict[str, int]]:
    gpu = get_gpu("h100", calibrated=False)
    trials = 0
    kernels: dict[str, set[str]] = {}
    for workload in ALCOP.values():
        space = Space.enumerate(workload, gpu)
        trials += len(space)
        kernels.setdefault(variant_of(workload), set()).update(space.ids)
    return trials, {variant: len(ids) for variant, ids in kernels.items()}


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(sample: int) -> list[dict]:
    gpu = get_gpu("h100", calibrated=False)
    rows = []
    for variant, operator in SAMPLED.items():
        workload = ALCOP[operator]
        space = Space.enumerate(workload, gpu)
        serial = [generate(workload, s) for s in select_schedules(space, sample, seed=1)]
        seconds, cpu = [], []
        for kernel in serial:
            started, started_cpu = time.perf_counter(), time.thread_time()
            compile_kernel(kernel, ARCH, use_cache=False)
            seconds.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
        pooled = [generate(workload, s) for s in select_schedules(space, sample, seed=2)]
        started, started_cpu = time.perf_counter(), _process_cpu()
        compile_many(pooled, ARCH, use_cache=False)
        pool_s, pool_cpu = time.perf_counter() - started, _process_cpu() - started_cpu
        rows.append(
            {
                "variant": variant,
                "operator": operator,
                "cpu_mean_s": statistics.fmean(cpu),
                "cpu_median_s": statistics.median(cpu),
                "cpu_min_s": min(cpu),
                "cpu_max_s": max(cpu),
                "wall_mean_s": statistics.fmean(seconds),
                "pool_cpu_s_per_kernel": pool_cpu / len(pooled),
                "pool_wall_s_per_kernel": pool_s / len(pooled),
            }
        )
        print(f"{variant}: {rows[-1]}", file=sys.stderr)
    return rows


def render(
    rows: list[dict], sample: int, trials: int, kernels: dict[str, int], load: tuple[float, float]
) -> str:
    cores = os.cpu_count() or 1
    lines = [
        f"NVRTC (cuda-bindings, nvidia-cuda-nvrtc wheel) compiling for {ARCH} with ptxas -v, "
        f"cache off. One thread: {sample} schedules per variant drawn uniformly (seed 1) from "
        f"the operator's space; CPU seconds of the compiling thread (what one dedicated core "
        f"takes) and wall seconds. Pool: another {sample} (seed 2) through `compile_many` on "
        f"all {cores} cores, process CPU and wall seconds per kernel. Load average (1 min) "
        f"{load[0]:.1f} before, {load[1]:.1f} after: the machine is shared, so wall times are "
        "inflated; the plan uses CPU seconds.",
        "",
        "| variant | sampled from | CPU s/kernel mean | median | min | max | wall s/kernel "
        f"(1 thread) | pool CPU s/kernel | pool wall s/kernel ({cores} cores) "
        "| distinct kernels in the suite |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['variant']} | {row['operator']} | {row['cpu_mean_s']:.3f} | "
            f"{row['cpu_median_s']:.3f} | {row['cpu_min_s']:.3f} | {row['cpu_max_s']:.3f} | "
            f"{row['wall_mean_s']:.3f} | {row['pool_cpu_s_per_kernel']:.3f} | "
            f"{row['pool_wall_s_per_kernel']:.3f} | {kernels[row['variant']]:,} |"
        )
    total_kernels = sum(kernels.values())
    weighted = sum(r["cpu_mean_s"] * kernels[r["variant"]] for r in rows) / total_kernels
    lines += [
        "",
        f"ALCOP suite on H100: {trials:,} trials (schedules of the 23 operators), "
        f"{total_kernels:,} distinct kernels. Kernel-weighted mean: {weighted:.3f} CPU s per "
        f"kernel, so {total_kernels * weighted / 60:.1f} min on one core, "
        f"{total_kernels * weighted / 14 / 60:.1f} min on 14 (a 16-core machine with two "
        "cores left to the GPU process and the measuring thread).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=24)
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    trials, kernels = suite_counts()
    before = os.getloadavg()[0]
    rows = measure(args.sample)
    body = render(rows, args.sample, trials, kernels, (before, os.getloadavg()[0]))
    print(body)
    if args.write:
        write_section("compile-time", "NVRTC compile time per kernel (GPU campaign plan)", body)


if __name__ == "__main__":
    main()
