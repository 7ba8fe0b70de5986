"""Benchmark: NVRTC compile time of pipetune's kernels, per schedule and per kernel kind, and
the suites' kernel counts: the compile side of the GPU campaign's time plan (README, "GPU
work").

    python -m benchmarks.bench_compile [--sample 24] [--suites alcop,memops,llama] [--write]

For each kind of kernel of a suite (a GEMM variant; a memory-intensive op and GELU form), a
uniform seeded sample of one operator's schedule space is compiled for sm_90, one kernel at
a time on one thread, with the cubin cache off (every compile is a real NVRTC + ptxas run).
Then another sample of the same size is compiled by the compile pool
(workers.compile.compile_many) on every core, for the throughput the pool reaches here. The
suites' counts: trials (schedules of their operators) and distinct kernels (one per build
key and schedule: shared by every operator of a kind whose kernels take the shape as
arguments).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

from benchmarks.results import write_section
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import SUITES
from pipetune.workers.compile import compile_kernel, compile_many
from pipetune.workers.families import codegen_for
from pipetune.workers.runners.sweep import select_schedules

# The operator whose space stands for each kind of kernel (every operator of a kind shares
# its kernels; the spaces differ only where a small shape rules schedules out): for the
# memory-intensive kinds the largest shape, whose space holds the others'.
SAMPLED = {
    "alcop": {"gemm_kn": "MM_Square_1k", "bmm": "BMM_BERT_SV", "conv2d": "Conv2D_RN50_3",
              "conv3d": "Conv3D_1"},
    "memops": {"softmax": "Softmax_BERT_b32_s1024", "layernorm": "LayerNorm_BERT_b32_s1024",
               "bias_gelu": "BiasGELU_BERT_b32_s1024",
               "bias_gelu-tanh": "BiasGELU_GPT2_b32_s1024"},
    "llama": {"rmsnorm": "RMSNorm_LLaMA2_70B_t8192", "silu_mul": "SwiGLU_LLaMA2_70B_t8192"},
}  # fmt: skip
ARCH = "sm_90"


def kind_of(workload) -> str:
    """The kind a workload's kernels are counted under: the GEMM variant, or the
    memory-intensive op (and GELU form) without the register-cache length."""
    module = codegen_for(family_of(workload))
    return (
        module.kernel_kind(workload)
        if hasattr(module, "kernel_kind")
        else module.variant_of(workload)
    )


def suite_counts(suite: str) -> tuple[int, dict[str, int]]:
    gpu = get_gpu("h100", calibrated=False)
    trials = 0
    kernels: dict[str, set[tuple[str, str]]] = {}
    for workload in SUITES[suite].values():
        fam = family_of(workload)
        space = fam.enumerate(workload, gpu)
        trials += len(space)
        build_key = codegen_for(fam).build_key
        kernels.setdefault(kind_of(workload), set()).update(
            (build_key(workload, s), s.id) for s in space
        )
    return trials, {kind: len(ids) for kind, ids in kernels.items()}


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(suite: str, sample: int) -> list[dict]:
    gpu = get_gpu("h100", calibrated=False)
    rows = []
    for variant, operator in SAMPLED[suite].items():
        workload = SUITES[suite][operator]
        fam = family_of(workload)
        space = fam.enumerate(workload, gpu)
        generate = codegen_for(fam).generate
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
    tables: list[tuple[str, list[dict], int, dict[str, int]]],
    sample: int,
    load: tuple[float, float],
) -> str:
    cores = os.cpu_count() or 1
    lines = [
        f"NVRTC (cuda-bindings, nvidia-cuda-nvrtc wheel) compiling for {ARCH} with ptxas -v, "
        f"cache off. One thread: {sample} schedules per kind drawn uniformly (seed 1) from "
        f"the operator's space; CPU seconds of the compiling thread (what one dedicated core "
        f"takes) and wall seconds. Pool: another {sample} (seed 2) through `compile_many` on "
        f"all {cores} cores, process CPU and wall seconds per kernel. Load average (1 min) "
        f"{load[0]:.1f} before, {load[1]:.1f} after: the machine is shared, so wall times are "
        "inflated; the plan uses CPU seconds.",
        "",
        "| suite | kind | sampled from | CPU s/kernel mean | median | min | max | wall s/kernel "
        f"(1 thread) | pool CPU s/kernel | pool wall s/kernel ({cores} cores) "
        "| distinct kernels in the suite |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for suite, rows, _, kernels in tables:
        for row in rows:
            lines.append(
                f"| {suite} | {row['variant']} | {row['operator']} | {row['cpu_mean_s']:.3f} | "
                f"{row['cpu_median_s']:.3f} | {row['cpu_min_s']:.3f} | {row['cpu_max_s']:.3f} | "
                f"{row['wall_mean_s']:.3f} | {row['pool_cpu_s_per_kernel']:.3f} | "
                f"{row['pool_wall_s_per_kernel']:.3f} | {kernels[row['variant']]:,} |"
            )
    lines.append("")
    for suite, rows, trials, kernels in tables:
        total_kernels = sum(kernels.values())
        weighted = sum(r["cpu_mean_s"] * kernels[r["variant"]] for r in rows) / total_kernels
        pooled = (
            sum(r["pool_cpu_s_per_kernel"] * kernels[r["variant"]] for r in rows) / total_kernels
        )
        lines.append(
            f"- {suite} suite on H100: {trials:,} trials (schedules of its "
            f"{len(SUITES[suite])} operators), {total_kernels:,} distinct kernels. "
            f"Kernel-weighted mean: {weighted:.3f} CPU s per kernel on one thread, "
            f"{pooled:.3f} in the pool, so {total_kernels * pooled / 14:.0f} s on 14 threads "
            "(a 16-core machine with two cores left to the GPU process and the measuring thread)."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=24)
    parser.add_argument("--suites", default="alcop,memops,llama", help="suites, comma-separated")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    tables = []
    for suite in args.suites.split(","):
        trials, kernels = suite_counts(suite)
        tables.append((suite, measure(suite, args.sample), trials, kernels))
    body = render(tables, args.sample, (before, os.getloadavg()[0]))
    body += (
        "\n\nCommand: `python -m benchmarks.bench_compile "
        f"--sample {args.sample} --suites {args.suites} --write`."
    )
    print(body)
    if args.write:
        write_section("compile-time", "NVRTC compile time per kernel (GPU campaign plan)", body)


if __name__ == "__main__":
    main()
