"""The correctness phase: before any timing, check that the kernels compute the right thing.

``PER_CASE`` schedules of each of ``CASES`` (>= 300 in all), drawn by
workers.codegen.sample.stratified_sample: the largest and smallest tiles, the most
register- and shared-memory-hungry schedules, then every (smem_stages, reg_stages) stratum
in turn, so every kernel variant meets every shared-memory stage count and both register
stage values. The shapes leave tails in M, N and K for most tiles and cover conv strides
1 and 2 with padding 0 and 1; the document counts the tails the schedules met.

Each kernel is launched once on random fp16 inputs and its output checked against an fp32
reference with the stated fp16 tolerance (workers.runners.reference): cuBLAS
(``cupy.matmul``) for GEMM and BMM, cuDNN through PyTorch (channels-last, fp32 math, TF32
off) for convolutions, falling back to im2col through cuBLAS where PyTorch is missing (the
document says which). Any other outcome than a verified output (a wrong result, a launch
or runtime error, a timeout, a compile error) counts as a failure; if more than
``FAILURE_LIMIT`` of the schedules fail, the campaign stops after this phase: sweeping wrong
kernels is worthless.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from pipetune.model.hardware import GPUSpec
from pipetune.model.space import Schedule, Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import AnyWorkload, bmm, conv2d, conv3d, gemm
from pipetune.workers.codegen.sample import stratified_sample
from pipetune.workers.runners.kernel_runner import KernelRunner
from pipetune.workers.runners.reference import TOLERANCE_TEXT

PER_CASE = 36
FAILURE_LIMIT = 0.01

# (what the case covers, workload). M = 997 and 333 leave a tail for every block height,
# N = 200 and 136 and K = 328 and 200 for every width and depth but 8 (multiples of 8, as
# the 16-byte loads require); the aligned cases check the path without tails.
CASES: tuple[tuple[str, AnyWorkload], ...] = (
    ("gemm_kn, tails in M, N, K", gemm(997, 200, 328)),
    ("gemm_kn, aligned", gemm(512, 256, 512)),
    ("gemm_nk, tails in M, N, K", gemm(997, 200, 328, b_layout="nk")),
    ("bmm, tails in M, N, K", bmm(3, 333, 136, 200)),
    ("bmm, aligned M and N", bmm(4, 256, 128, 64)),
    ("conv2d, stride 2, pad 1", conv2d(2, 15, 13, 24, 40, 3, 3, stride=2, pad=1)),
    ("conv2d, stride 1, pad 0", conv2d(3, 9, 9, 16, 24, 3, 3, stride=1, pad=0)),
    ("conv3d, stride 2, pad 1", conv3d(2, 5, 6, 7, 16, 24, 3, 3, 3, stride=2, pad=1)),
    ("conv3d, stride 1, pad 0", conv3d(1, 6, 6, 6, 8, 16, 3, 3, 3, stride=1, pad=0)),
)


def selection(gpu: GPUSpec) -> list[tuple[str, AnyWorkload, list[Schedule]]]:
    """(case, workload, schedules) of every case: deterministic for a GPU."""
    return [
        (case, workload, stratified_sample(Space.enumerate(workload, gpu), PER_CASE, seed=i))
        for i, (case, workload) in enumerate(CASES)
    ]


def tails(workload: AnyWorkload, schedule: Schedule) -> dict[str, bool]:
    view = workload.gemm_view()
    return {
        "m": view.m % schedule.block_m != 0,
        "n": view.n % schedule.block_n != 0,
        "k": view.k % schedule.block_k != 0,
    }


def stops(failed: int, total: int, limit: float = FAILURE_LIMIT) -> bool:
    """Whether the campaign stops: more than ``limit`` of the schedules failed."""
    return total == 0 or failed / total > limit


def summarise(
    checked: list[tuple[str, AnyWorkload, list[Schedule], list[MeasureResult]]],
    references: dict[str, Any],
    *,
    runner: str,
    simulated: bool,
) -> dict[str, Any]:
    from pipetune.workers.codegen import variant_of

    by_variant: dict[str, Counter[str]] = {}
    by_stages: dict[str, Counter[str]] = {}
    tail_counts: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    cases = []
    total = failed = 0
    for case, workload, schedules, results in checked:
        variant = variant_of(workload)
        case_failed = 0
        for schedule, result in zip(schedules, results, strict=True):
            total += 1
            stratum = f"smem_stages={schedule.smem_stages},reg_stages={schedule.reg_stages}"
            by_variant.setdefault(variant, Counter())[result.status] += 1
            by_stages.setdefault(stratum, Counter())[result.status] += 1
            tail_counts.update(axis for axis, has in tails(workload, schedule).items() if has)
            if result.status != "ok":
                failed += 1
                case_failed += 1
                failures.append(
                    {
                        "case": case,
                        "workload": workload.canonical(),
                        "variant": variant,
                        "schedule": schedule.as_dict(),
                        "status": result.status,
                        "max_abs_error": result.max_abs_error,
                        "error": result.error,
                    }
                )
        cases.append(
            {
                "case": case,
                "workload": workload.canonical(),
                "label": workload.label(),
                "variant": variant,
                "schedules": len(schedules),
                "failed": case_failed,
                "reference": references.get(case),
            }
        )
    stop = stops(failed, total)
    return {
        "runner": runner,
        "simulated": simulated,
        "verified": not simulated,
        "tolerance": TOLERANCE_TEXT,
        "schedules": total,
        "passed": total - failed,
        "failed": failed,
        "failed_fraction": failed / total if total else None,
        "limit": FAILURE_LIMIT,
        "verdict": "stop" if stop else "pass",
        "by_variant": {v: dict(c) for v, c in sorted(by_variant.items())},
        "by_stages": {s: dict(c) for s, c in sorted(by_stages.items())},
        "tails": {axis: tail_counts[axis] for axis in ("m", "n", "k")},
        "cases": cases,
        "mismatches": failures,
        **(
            {"note": "simulated launches: nothing was verified; the counts are the plumbing's"}
            if simulated
            else {}
        ),
    }


def run_correctness(runner: KernelRunner, gpu: GPUSpec) -> dict[str, Any]:
    """Verify the selection with the runner; the correctness document."""
    started = time.perf_counter()
    chosen = selection(gpu)
    for _, workload, schedules in chosen:
        runner.compile_ahead(workload, schedules)
    previous = runner.conv_reference
    runner.conv_reference = "cudnn"
    checked = []
    references: dict[str, Any] = {}
    try:
        for case, workload, schedules in chosen:
            results = runner.verify(workload, schedules)
            references[case] = runner.last_prepare
            checked.append((case, workload, schedules, results))
    finally:
        runner.conv_reference = previous
    document = summarise(checked, references, runner=runner.name, simulated=runner.simulated_launch)
    document["device_name"] = runner.device_name
    document["seconds"] = round(time.perf_counter() - started, 3)
    return document
