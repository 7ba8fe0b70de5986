"""Benchmark: the Hopper wgmma family's analytical model (model/hopper/analytical.py) against
the wgmma probe's measurements (benchmarks/data/<gpu>/wgmma-probe-*.json, measured on lent
GPUs), before the family has a campaign of its own.

    python -m benchmarks.bench_hopper_model [--write]

The probe timed, per GEMM and BMM operator of the ALCOP suite, the kernel shapes it was given;
those with the TMA loader and the staged epilogue, unsplit, are schedules of the family (one
block per tile, and on the H100 persistent). Per operator and GPU: Spearman's rank correlation
of predicted and measured latency over those shapes, and top-1 (the measured time of the
fastest shape over that of the model's first choice). A shape measured in several probe files
counts with its fastest time (each file is one call; their cuBLAS times differ by 1-3%).
"""

from __future__ import annotations

import argparse
import glob
import json

import numpy as np
from scipy.stats import spearmanr

from benchmarks.campaign_data import campaign_gpu
from benchmarks.results import write_section
from pipetune.model.hopper.analytical import evaluate
from pipetune.model.hopper.space import KNOB_NAMES, HopperSpace
from pipetune.model.hopper.workloads import as_hopper
from pipetune.model.workloads import parse_workload

GPUS = ("h100", "h200")
# The probe's id suffixes of the family's three tile loops (TMA loader, staged epilogue).
LOOPS = {"": 0, "_p": 1, "_sk": 2}


def probe_measurements(gpu: str) -> dict[str, tuple[dict, dict[tuple[int, ...], float]]]:
    """Per operator: its workload (the tensor-core family's) and the fastest median time (ms)
    of each schedule (tile_m, tile_n, stages, tile_loop) the probe files of ``gpu`` measured
    correct."""
    out: dict[str, tuple[dict, dict[tuple[int, ...], float]]] = {}
    for path in sorted(glob.glob(f"benchmarks/data/{gpu}/wgmma-probe-*.json")):
        with open(path, encoding="utf-8") as f:
            runs = json.load(f)["runs"]
        for shape, per_operator in runs.items():
            head, staged, loop = shape.partition("_tma_st")
            if not staged or loop not in LOOPS:
                continue  # another kind (cp.async, direct epilogue, split-K)
            m, rest = head.removeprefix("wg").split("x")
            n, stages = rest.split("s")
            key = (int(m), int(n), int(stages), LOOPS[loop])
            for operator, run in per_operator.items():
                if run.get("correct") and run.get("samples_ms"):
                    _, times = out.setdefault(operator, (run["workload"], {}))
                    ms = float(np.median(run["samples_ms"]))
                    times[key] = min(times.get(key, ms), ms)
    return out


def operator_rows(gpu: str) -> list[tuple[str, int, float, float]]:
    """(operator, shapes, Spearman, top-1) per operator the probe measured on ``gpu``, the
    model calibrated by the shipped profile (campaign_gpu: the probe's device's, not the
    user's own)."""
    rows = []
    for operator, (workload, times) in probe_measurements(gpu).items():
        keys = list(times)
        knobs = {k: np.array([key[i] for key in keys]) for i, k in enumerate(KNOB_NAMES)}
        space = HopperSpace(as_hopper(parse_workload(workload)), campaign_gpu(gpu), knobs)
        predicted = evaluate(space).T_kernel
        measured = np.array([times[key] for key in keys])
        rho = float(spearmanr(predicted, measured).statistic)
        rows.append((operator, len(keys), rho, measured.min() / measured[np.argmin(predicted)]))
    return rows


def report() -> str:
    lines = [
        "Command: `python -m benchmarks.bench_hopper_model --write` (no GPU: the model against",
        "the committed probe measurements of benchmarks/data/<gpu>/wgmma-probe-*.json).",
        "",
        "| GPU | operator | shapes | Spearman | top-1 |",
        "|---|---|---:|---:|---:|",
    ]
    summary = []
    for gpu in GPUS:
        rows = operator_rows(gpu)
        for operator, shapes, rho, top1 in rows:
            lines.append(f"| {gpu} | {operator} | {shapes} | {rho:.2f} | {top1:.2f} |")
        rhos, tops = [r[2] for r in rows], [r[3] for r in rows]
        summary.append(
            f"{gpu.upper()}: mean Spearman {np.mean(rhos):.2f} (lowest {min(rhos):.2f}), top-1"
            f" geomean {np.exp(np.mean(np.log(tops))):.2f} over {len(rows)} operators"
        )
    return "\n".join([*lines, "", "; ".join(summary) + "."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS.md")
    args = parser.parse_args()
    body = report()
    print(body)
    if args.write:
        write_section(
            "hopper-model-probe",
            "Hopper wgmma family: its model against the probe's measured shapes (issue 15)",
            body,
        )


if __name__ == "__main__":
    main()
