"""Benchmark: what bfloat16 changes in the generated kernels, as ptxas reports it.

    python -m benchmarks.bench_bf16_kernels [--per-kind N] [--arch sm_90] [--json] [--write]

A bfloat16 kernel is its float16 twin with other type words (the mma.sync operand type, the
output conversion; the memory-intensive kernels widen bf16 by a shift). The schedule spaces
do not depend on the element type: their register estimates, and so which schedules are
valid, are float16's. This compiles the same stratified sample of each kind of kernel in
both types with NVRTC (no GPU) and compares what ptxas says of each pair: registers per
thread, spills, and the compile time (the Hopper wgmma family's kernels on sm_90 only, as
sm_90a). A bf16 kernel that needs more registers than its
float16 twin could spill where the space says it fits, or lose occupancy the models do not
see. Measured here: compiles, not run times (README "GPU work" 9. times bf16 kernels).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.results import write_section
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.workloads import as_hopper
from pipetune.model.memops.workloads import parse_mem_workload
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm, gemm_swiglu
from pipetune.workers.compile import CompileError, compile_many
from pipetune.workers.families import codegen_for

# One workload per kind of kernel (the NVRTC tests' shapes): its space on an H100.
WORKLOADS: dict[str, Any] = {
    "gemm_kn": gemm(4096, 4096, 4096),
    "gemm_nk": gemm(4096, 4096, 4096, b_layout="nk"),
    "gemm_swiglu_kn": gemm_swiglu(4096, 2048, 4096),
    "bmm": bmm(16, 1024, 1024, 1024),
    "conv2d": conv2d(32, 56, 56, 128, 256, 3, 3, pad=1),
    "conv3d": conv3d(4, 16, 28, 28, 64, 128, 3, 3, 3, pad=1),
    "softmax": parse_mem_workload({"op": "softmax", "rows": 8192, "cols": 4096}),
    "rmsnorm": parse_mem_workload({"op": "rmsnorm", "rows": 8192, "cols": 4096, "eps": 1e-5}),
    "silu_mul": parse_mem_workload({"op": "silu_mul", "rows": 8192, "cols": 11008}),
}
# The Hopper wgmma family's kernels build for sm_90a only: compiled when --arch is sm_90.
HOPPER_WORKLOADS: dict[str, Any] = {
    "hopper_gemm": as_hopper(gemm(4096, 4096, 4096)),
    "hopper_bmm": as_hopper(bmm(16, 1024, 1024, 1024)),
}


def workloads(arch: str) -> dict[str, Any]:
    """The kinds of kernel compiled for ``arch``: the Hopper family's on sm_90 (as sm_90a)."""
    return {**WORKLOADS, **(HOPPER_WORKLOADS if arch == "sm_90" else {})}


@dataclass(frozen=True)
class Pair:
    """One schedule of one kind compiled in both types."""

    kind: str
    schedule: str
    registers: tuple[int, int]  # float16, bfloat16
    spill_bytes: tuple[int, int]
    compile_ms: tuple[float, float]


def sample(workload: Any, per_kind: int, seed: int) -> list[Any]:
    """A seeded, evenly spread sample of the workload's space on an H100."""
    space = family_of(workload).enumerate(workload, get_gpu("h100", calibrated=False))
    step = max(1, len(space) // per_kind)
    start = seed % step
    return [space[i] for i in range(start, len(space), step)][:per_kind]


def compile_pairs(per_kind: int, arch: str, seed: int = 0) -> list[Pair]:
    """Every kind's sample compiled as float16 and as bfloat16 (no disk cache: cold times)."""
    jobs: list[tuple[str, Any, Any, Any]] = []
    for kind, fp16 in workloads(arch).items():
        bf16 = fp16.model_copy(update={"dtype": "bfloat16"})
        codegen = codegen_for(family_of(fp16))
        for schedule in sample(fp16, per_kind, seed):
            jobs.append(
                (kind, schedule, codegen.generate(fp16, schedule), codegen.generate(bf16, schedule))
            )
    kernels = [k for _, _, a, b in jobs for k in (a, b)]
    results = compile_many(kernels, arch, return_exceptions=True, use_cache=False)
    pairs = []
    for i, (kind, schedule, _, _) in enumerate(jobs):
        a, b = results[2 * i], results[2 * i + 1]
        failed = [r for r in (a, b) if isinstance(r, CompileError)]
        if failed:
            raise SystemExit(f"{kind} {schedule.id}: did not compile: {failed[0]}")
        pairs.append(
            Pair(
                kind,
                schedule.id,
                (a.registers, b.registers),
                (a.spill_bytes, b.spill_bytes),
                (a.compile_ms, b.compile_ms),
            )
        )
    return pairs


def summary(pairs: list[Pair]) -> list[dict[str, Any]]:
    """Per kind: schedules, bf16 - fp16 registers (mean, min, max), spills, compile ms."""
    rows = []
    for kind in dict.fromkeys(p.kind for p in pairs):
        mine = [p for p in pairs if p.kind == kind]
        delta = [p.registers[1] - p.registers[0] for p in mine]
        rows.append(
            {
                "kind": kind,
                "schedules": len(mine),
                "registers_fp16_mean": statistics.fmean(p.registers[0] for p in mine),
                "register_delta_mean": statistics.fmean(delta),
                "register_delta_min": min(delta),
                "register_delta_max": max(delta),
                "spilling_fp16": sum(p.spill_bytes[0] > 0 for p in mine),
                "spilling_bf16": sum(p.spill_bytes[1] > 0 for p in mine),
                "compile_ms_fp16": statistics.median(p.compile_ms[0] for p in mine),
                "compile_ms_bf16": statistics.median(p.compile_ms[1] for p in mine),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| kind | schedules | fp16 registers (mean) | bf16 - fp16 registers: mean, min, max "
        "| spilling fp16 / bf16 | compile ms fp16 / bf16 (median) |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['schedules']} | {r['registers_fp16_mean']:.1f} | "
            f"{r['register_delta_mean']:+.2f}, {r['register_delta_min']:+d}, "
            f"{r['register_delta_max']:+d} | {r['spilling_fp16']} / {r['spilling_bf16']} | "
            f"{r['compile_ms_fp16']:.0f} / {r['compile_ms_bf16']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=24, help="schedules per kind of kernel")
    parser.add_argument("--arch", default="sm_90", help="the NVRTC target (sm_80, sm_90)")
    parser.add_argument("--json", action="store_true", help="print the pairs and summary")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    if args.per_kind < 1:
        parser.error("--per-kind: must be at least 1")
    pairs = compile_pairs(args.per_kind, args.arch)
    rows = summary(pairs)
    if args.json:
        print(json.dumps({"arch": args.arch, "summary": rows, "pairs": [asdict(p) for p in pairs]}))
    else:
        print(table(rows))
    if args.write:
        write_section(
            f"bf16-kernels-{args.arch}",
            f"bfloat16 kernels against their float16 twins: ptxas on {args.arch} (compiles, "
            "not run times)",
            f"Command: `python -m benchmarks.bench_bf16_kernels --per-kind {args.per_kind} "
            f"--arch {args.arch} --write` (NVRTC, no GPU; cold compiles, no cache). The same "
            "evenly spread sample of each kind's H100 space, compiled as float16 and as "
            "bfloat16: registers per thread as ptxas reports them, schedules that spill, and "
            "the median compile time (both types compiled in one parallel batch).\n\n"
            + table(rows),
        )


if __name__ == "__main__":
    main()
