"""Benchmark: the memory-intensive family's model, its speed and what it predicts about
adaptive thread mapping (AStitch) on the benchmark operators.

    python -m benchmarks.bench_memops [--write]

Speed: schedules per second of `MemSpace.enumerate` + `memops.analytical.evaluate` (best of
20, one CPU core) for every operator of the ``memops`` suite (BERT-base and GPT-2 softmax,
layer norm and bias+GELU at batch 1, 8, 32 and sequence 128, 1024) on H100.

Predictions: the best schedule's predicted speedup over the best fixed one-row-per-block
mapping (one block per row, no splitting, no wave bound; thread count, vector width and row
cache free) on A100, H100 and H200, for the suite, for AStitch's irregular shapes and for
the ``llama`` suite (RMS norms and SwiGLUs). These
are the model's predictions, not measurements; what the H100 and H200 measured of these
kernels is in RESULTS.md's GPU campaign sections.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from benchmarks.results import write_section
from pipetune.model.family import full_grid
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.analytical import evaluate, mapping_gain
from pipetune.model.memops.space import KNOBS, MemSpace, static_grid
from pipetune.model.memops.workloads import MemWorkload, layernorm, reduce, softmax
from pipetune.model.operators import LLAMA, MEMOPS

REPEATS = 20
GPUS = ("a100", "h100", "h200")
# AStitch section 2.3.2's irregular shapes (row reductions from DIEN and a Transformer)
# and the long-row cases of the same kind.
IRREGULAR: dict[str, MemWorkload] = {
    "AStitch_DIEN_reduce_750000x32": reduce(750000, 32),
    "AStitch_Transformer_reduce_64x30000": reduce(64, 30000),
    "LongRow_softmax_8x65536": softmax(8, 65536),
    "LongRow_layernorm_16x65536": layernorm(16, 65536),
    "ShortRow_softmax_49152x128": softmax(49152, 128),
}


def best_time(fn) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def speed_rows(gpu_key: str) -> list[tuple[str, int, float, float]]:
    gpu = get_gpu(gpu_key, calibrated=False)
    rows = []
    for name, workload in MEMOPS.items():
        space = MemSpace.enumerate(workload, gpu)
        total = best_time(lambda w=workload: evaluate(MemSpace.enumerate(w, gpu)))
        model_only = best_time(lambda s=space: evaluate(MemSpace(s.workload, s.gpu, s.knobs)))
        rows.append((name, len(space), total, model_only))
    return rows


def gain_row(workload: MemWorkload, gpu_key: str) -> tuple[float, str]:
    gpu = get_gpu(gpu_key, calibrated=False)
    space = MemSpace.enumerate(workload, gpu)
    prediction = evaluate(space)
    gain = mapping_gain(space, prediction.T_kernel)
    best = space[int(np.argmin(prediction.T_kernel))]
    return gain.speedup_over_fixed, _mapping(best.as_dict())


def _mapping(k: dict[str, int]) -> str:
    text = f"{k['threads_per_row']}x{k['rows_per_block']}"
    if k["blocks_per_row"] > 1:
        text += f" /{k['blocks_per_row']}{' fused' if k['split_mode'] else ''}"
    cache = ("global", "smem", "regs")[k["row_cache"]]
    return (
        text + f" v{k['vector_width']} {cache}" + (f" w{k['max_waves']}" if k["max_waves"] else "")
    )


def gains_table(operators: dict[str, MemWorkload]) -> list[str]:
    lines = [
        "| operator | shape | " + " | ".join(GPUS) + " | best mapping on h100 |",
        "|---|---|" + "---:|" * len(GPUS) + "---|",
    ]
    for name, workload in operators.items():
        cells, mapping = [], ""
        for g in GPUS:
            speedup, best = gain_row(workload, g)
            cells.append("-" if np.isnan(speedup) else f"{speedup:.2f}x")
            mapping = best if g == "h100" else mapping
        shape = f"{workload.rows}x{workload.cols}"
        lines.append(f"| {name} | {shape} | " + " | ".join(cells) + f" | {mapping} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS.md")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    speed = speed_rows("h100")
    lines = [
        "Command: `python -m benchmarks.bench_memops --write`.",
        "",
        "Space enumeration + the memory-intensive model for every operator of the `memops`",
        f"suite on H100 (spec-sheet profile), best of {REPEATS} runs, one CPU core (load",
        f"average {load:.1f} when it started: the machine is shared, so read the times as upper",
        "bounds).",
        "",
        "| operator | schedules | enumerate + model (ms) | model only (ms) | schedules/s (model only) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, n, total, model_only in speed:
        lines.append(
            f"| {name} | {n} | {total * 1e3:.2f} | {model_only * 1e3:.2f} | {n / model_only:,.0f} |"
        )
    rates = [n / m for _, n, _, m in speed]
    lines += [
        "",
        f"Median: {statistics.median(rates):,.0f} schedules/s (model only). Enumeration checks",
        f"the {len(static_grid()['max_waves']):,} points of the {len(full_grid(KNOBS)['max_waves']):,}-point knob grid that no workload rules out",
        "against every validity rule.",
        "",
        "### Predicted speedup of adaptive thread mapping (model, not measured)",
        "",
        "Best schedule over the best fixed one-row-per-block mapping (one block per row, no",
        "splitting, no wave bound; threads per row, vector width and row cache left free), both",
        "as the analytical model predicts them. PREDICTIONS, not measurements: the H100 and",
        'H200 measurements of these kernels are in "GPU campaign on H100: measured" and "GPU',
        'campaign on H200: measured" ("Memory-intensive operators: tuned mapping against one',
        'row per block and PyTorch").',
        "",
        *gains_table(MEMOPS),
        "",
        "AStitch's irregular shapes and long/short-row cases (same columns):",
        "",
        *gains_table(IRREGULAR),
        "",
        "The `llama` suite's RMS norms and SwiGLUs (same columns; no GPU has measured them yet):",
        "",
        *gains_table(LLAMA),
        "",
        "The suite's operators are regular: rows are many and hundreds to thousands of elements",
        "long, so one block per row already fills the GPU and the predicted gains are small,",
        "except the short-row (cols 128) softmax at batch 8 and 32, which packing helps. The",
        "irregular shapes show the two mechanisms AStitch describes: packing for many short rows,",
        "splitting for few long ones. For AStitch's own 64x30000 reduction the model predicts no",
        "gain on these GPUs: 64 blocks of 1024 threads reach 64 SMs, whose crossbar ports",
        "(BW_L2 / N_SM each) already carry about the whole DRAM bandwidth; AStitch measured its",
        "gain on a V100 against XLA's kernel. The cupy runner checks these kernels against",
        "workers/runners/memops_reference.py.",
    ]
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section(
            "memops-model",
            "Memory-intensive family: model speed and predicted adaptive-mapping gains",
            body,
        )


if __name__ == "__main__":
    main()
