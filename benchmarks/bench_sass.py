"""Benchmark: the instructions of the generated kernels' main loop, from their SASS, against
model/issue.py (reading 8 of the analytical model). No GPU: NVRTC compiles for sm_90 and
nvdisasm (the `nvidia-cuda-nvdisasm` wheel) disassembles.

    python -m benchmarks.bench_sass [--sample 48] [--seed 3] [--write]

For each kernel kind of the ALCOP suite (the operator that stands for it, as in
benchmarks/bench_compile.py), a stratified sample of its H100 space is compiled and the K-tile
loop's instructions per warp are counted by class: mma.sync (HMMA), ldmatrix (LDSM), cp.async
(LDGSTS) and the integer and control work around them. Printed per kind: whether the model's
mma, ldmatrix and copy counts are exact; the integer work per A copy, per B copy, per
ldmatrix, per part of the next tile's copies and per step that non-negative least squares
fits to the sample (the constants model/issue.py holds: update them from here when the
generator changes); and the model's
error on the total with the committed constants. The GEMM and batched GEMM kernels share
their loop ("gemm").
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.optimize import nnls

from benchmarks.bench_compile import SAMPLED
from benchmarks.results import write_section
from benchmarks.sass_loop import sample_step_counts
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.issue import INTEGER_WORK, operand_kind, step_instructions
from pipetune.model.operators import SUITES

ARCH = "sm_90"


def sample_counts(operator: str, sample: int, seed: int) -> list[dict]:
    """Model and SASS counts of a stratified sample of one ALCOP operator's schedules."""
    workload = SUITES["alcop"][operator]
    space = family_of(workload).enumerate(workload, get_gpu("h100", calibrated=False))
    model = step_instructions(space)
    total = model.total
    rows = []
    for i, schedule, sass in sample_step_counts(space, sample, seed, ARCH):
        rows.append(
            {
                "kind": operand_kind(workload),
                "schedule": schedule.id,
                "sass": sass,
                "a_copies": float(model.a_copies[i]),
                "b_copies": float(model.b_copies[i]),
                "copy_parts": float(model.copy_parts[i]),
                "mma": float(model.mma[i]),
                "ldmatrix": float(model.ldmatrix[i]),
                "fragment_copies": float(model.fragment_copies[i]),
                "model_total": float(total[i]),
            }
        )
    return rows


def fit(rows: list[dict]) -> tuple[np.ndarray, float]:
    """Integer work per A copy, per B copy, per ldmatrix, per copy part and per step
    (non-negative least squares on the SASS counts), and the median relative error of the
    total with them."""
    design = np.array(
        [[r["a_copies"], r["b_copies"], r["ldmatrix"], r["copy_parts"], 1.0] for r in rows]
    )
    # The fragments' copy (BK 16, two register stages) is counted apart (model/issue.py).
    copies = np.array([r.get("fragment_copies", 0.0) for r in rows], dtype=float)
    integer = np.array([r["sass"].integer for r in rows], dtype=float) - copies
    coef, _ = nnls(design, integer)
    fixed = np.array([r["sass"].total - r["sass"].integer for r in rows], dtype=float) + copies
    total = np.array([r["sass"].total for r in rows], dtype=float)
    return coef, float(np.median(np.abs(design @ coef + fixed - total) / total))


def report(sample: int, seed: int) -> str:
    by_kind: dict[str, list[dict]] = {}
    for variant, operator in SAMPLED["alcop"].items():
        rows = sample_counts(operator, sample, seed)
        by_kind.setdefault(rows[0]["kind"], []).extend(rows)
        print(f"{variant} ({operator}): {len(rows)} kernels", file=sys.stderr)
    lines = [
        f"Stratified samples of {sample} schedules per kernel kind (seed {seed}) of the ALCOP "
        f"operators that stand for the kinds ({', '.join(SAMPLED['alcop'].values())}), "
        f"compiled by NVRTC for {ARCH} and disassembled by nvdisasm. Counts are per warp per "
        "K step (the K-tile loop's static instructions, its copy path included).",
        "",
        "| loop | kernels | mma, ldmatrix, copies exact | instructions per mma (SASS), median "
        "[min, max] | fitted integer work per A copy / B copy / ldmatrix / copy part / step "
        "| committed (model/issue.py) | median error of the total, fitted | committed |",
        "|---|---:|---|---|---|---|---:|---:|",
    ]
    for kind, rows in by_kind.items():
        exact = all(
            r["sass"].mma == r["mma"]
            and r["sass"].ldmatrix == r["ldmatrix"]
            and r["sass"].copies == r["a_copies"] + r["b_copies"]
            for r in rows
        )
        per_mma = np.array([r["sass"].total / r["sass"].mma for r in rows])
        coef, fitted_error = fit(rows)
        total = np.array([r["sass"].total for r in rows], dtype=float)
        model = np.array([r["model_total"] for r in rows])
        committed_error = float(np.median(np.abs(model - total) / total))
        work = INTEGER_WORK[kind]
        lines.append(
            f"| {kind} | {len(rows)} | {'yes' if exact else 'no'} | {np.median(per_mma):.1f} "
            f"[{per_mma.min():.1f}, {per_mma.max():.1f}] | "
            + " / ".join(f"{c:.1f}" for c in coef)
            + f" | {work.per_a_copy:g} / {work.per_b_copy:g} / {work.per_ldmatrix:g} / "
            f"{work.per_copy_part:g} / {work.per_step:g} | {fitted_error:.2f} | "
            f"{committed_error:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=48)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    body = report(args.sample, args.seed)
    print(body)
    if args.write:
        write_section(
            "model-issue-sass",
            "Model: the generated kernels' K-step instructions, counted in their SASS",
            body,
        )


if __name__ == "__main__":
    main()
