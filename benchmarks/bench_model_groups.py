"""Benchmark: how well the analytical model ranks the measured spaces, by group, and how well
it predicts schedules that differ only in their shared-memory stages (issue 15's model
corrections are judged on both).

    python -m benchmarks.bench_model_groups [--data-dir benchmarks/data]

Groups (each a set of committed sweeps): `shapes` the H200's held-out GEMM and BMM shapes
(benchmarks/data/h200/shapes), `h200` and `h100` each GPU's ALCOP GEMM and BMM operators,
`conv` the convolutions of both. Per group: the geomean over its operators of best-in-top-1
and best-in-top-10 of the model's ranking (the fastest measured among the model's k first
over the fastest of all) and the mean Spearman correlation of predicted and measured latency.
Per GPU (its 23 ALCOP operators) and pair of stage counts (1-2, 2-3, 3-4): over the twins (schedules equal in every
other knob, at equal occupancy, both measured), the median measured log ratio, the median
error of the predicted one, and their rank correlation. Per GPU, the same over arrangement
twins: schedules of one block tile, warp count, chunk and stages at equal occupancy whose
warps are arranged differently, the one with more warps side by side along N against the
other (the model's terms see the block and warp counts, not the arrangement: it predicts
them alike, and the measured ratio is what it misses).

Every figure comes from the committed measurements and `model.analytical.evaluate` (the
calibrated profiles); nothing is simulated.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from benchmarks.bench_campaign import best_in_top_k, geomean, spearman
from benchmarks.campaign_data import OperatorData, load_operator

DATA = Path(__file__).resolve().parent / "data"
GEMM_PATTERNS = ("MM_*.t4.json.gz", "BMM_*.t4.json.gz")
CONV_PATTERNS = ("Conv2D_*.t4.json.gz", "Conv3D_*.t4.json.gz")
STAGE_PAIRS = ((1, 2), (2, 3), (3, 4))


def group_files(data_dir: Path) -> dict[str, list[Path]]:
    """The committed sweeps of each group (see the module's docstring): the convolutions per
    GPU, which the `conv` group joins and each GPU's stage twins count with its GEMMs (the 23
    ALCOP operators, as tests/test_measured_data.py pairs them)."""

    def matching(folder: Path, patterns: tuple[str, ...]) -> list[Path]:
        return [p for pattern in patterns for p in sorted(folder.glob(pattern))]

    return {
        "shapes": matching(data_dir / "h200" / "shapes", GEMM_PATTERNS),
        "h200": matching(data_dir / "h200", GEMM_PATTERNS),
        "h100": matching(data_dir / "h100", GEMM_PATTERNS),
        "conv-h200": matching(data_dir / "h200", CONV_PATTERNS),
        "conv-h100": matching(data_dir / "h100", CONV_PATTERNS),
    }


def ranking(ops: list[OperatorData]) -> tuple[float, float, float]:
    """Geomean best-in-top-1 and top-10, and mean Spearman, of the model over `ops`."""
    top1 = geomean(best_in_top_k(op, op.predicted_us, 1) for op in ops)
    top10 = geomean(best_in_top_k(op, op.predicted_us, 10) for op in ops)
    return top1, top10, float(np.mean([spearman(op, op.predicted_us) for op in ops]))


def stage_twins(
    ops: list[OperatorData], fewer: int, more: int, knob: str = "smem_stages"
) -> Iterator[tuple[int, int, OperatorData]]:
    """(row with `fewer` stages of `knob`, row with `more`, operator) of every pair of
    measured schedules equal in every other knob, at equal occupancy."""
    for op in ops:
        knobs = op.space.knobs
        others = [name for name in knobs if name != knob]
        rows: dict[tuple, dict[int, int]] = {}
        for i, count in enumerate(knobs[knob].tolist()):
            rows.setdefault(tuple(knobs[n][i] for n in others), {})[count] = i
        blocks = op.space.blocks_per_sm
        for pair in rows.values():
            a, b = pair.get(fewer), pair.get(more)
            if a is None or b is None or blocks[a] != blocks[b]:
                continue
            if op.ok[a] and op.ok[b]:
                yield a, b, op


def arrangement_twins(ops: list[OperatorData]) -> Iterator[tuple[int, int, OperatorData]]:
    """(row with fewer warps along N, row with more, operator) of every pair of measured
    schedules with the same block tile, warps, chunk and stages at equal occupancy, whose
    warps are arranged differently (e.g. 4 x 1 warps of 1 x 4 MMA tiles against 1 x 4 warps
    of 4 x 1 tiles: one 64 x 64 block)."""
    for op in ops:
        knobs, space = op.space.knobs, op.space
        same = zip(
            space.block_m.tolist(),
            space.block_n.tolist(),
            space.warps.tolist(),
            knobs["chunk"].tolist(),
            knobs["smem_stages"].tolist(),
            knobs["reg_stages"].tolist(),
            space.blocks_per_sm.tolist(),
            strict=True,
        )
        groups: dict[tuple, list[int]] = {}
        for i, key in enumerate(same):
            if op.ok[i]:
                groups.setdefault(key, []).append(i)
        along_n = knobs["block_col_warps"]
        for rows in groups.values():
            for x, a in enumerate(rows):
                for b in rows[x + 1 :]:
                    if along_n[a] != along_n[b]:
                        yield (a, b, op) if along_n[a] < along_n[b] else (b, a, op)


def twin_errors(ops: list[OperatorData], fewer: int, more: int) -> tuple[int, float, float, float]:
    """Pairs, median measured log ratio (fewer over more stages), the median absolute error
    of the predicted one, and Spearman of predicted against measured ratios."""
    return pair_errors(stage_twins(ops, fewer, more))


def pair_errors(pairs: Iterable[tuple[int, int, OperatorData]]) -> tuple[int, float, float, float]:
    """Over pairs (a, b, operator): their number, the median measured log ratio a over b, the
    median absolute error of the predicted one, and Spearman of predicted against measured
    ratios (NaN below three pairs)."""
    from scipy.stats import spearmanr

    measured, predicted = [], []
    for a, b, op in pairs:
        measured.append(np.log(op.measured_us[a] / op.measured_us[b]))
        predicted.append(np.log(op.predicted_us[a] / op.predicted_us[b]))
    if len(measured) < 3:
        return len(measured), float("nan"), float("nan"), float("nan")
    m, p = np.array(measured), np.array(predicted)
    if np.ptp(p) == 0.0:  # predicted all alike (the model does not tell them apart)
        return len(m), float(np.median(m)), float(np.median(np.abs(p - m))), float("nan")
    return len(m), float(np.median(m)), float(np.median(np.abs(p - m))), float(spearmanr(m, p)[0])


def report(ops: dict[str, list[OperatorData]]) -> list[str]:
    """The two tables, from the operators of each file group (`group_files`' keys)."""
    groups = {
        "shapes": ops["shapes"],
        "h200": ops["h200"],
        "h100": ops["h100"],
        "conv": ops["conv-h200"] + ops["conv-h100"],
    }
    lines = [
        "| group | operators | top-1 | top-10 | Spearman |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, members in groups.items():
        if members:
            top1, top10, rho = ranking(members)
            lines.append(f"| {name} | {len(members)} | {top1:.3f} | {top10:.3f} | {rho:.3f} |")
    lines += [
        "",
        "| GPU | stages | twins | measured log ratio | median error | Spearman |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for gpu in ("h100", "h200"):
        alcop = ops[gpu] + ops[f"conv-{gpu}"]
        for fewer, more in STAGE_PAIRS:
            n, m, err, rho = twin_errors(alcop, fewer, more)
            if n:
                lines.append(
                    f"| {gpu} | {fewer} vs {more} | {n} | {m:+.3f} | {err:.3f} | {rho:.2f} |"
                )
    lines += [
        "",
        "| GPU | arrangement twins | measured log ratio | median error | Spearman |",
        "|---|---:|---:|---:|---:|",
    ]
    for gpu in ("h100", "h200"):
        n, m, err, rho = pair_errors(arrangement_twins(ops[gpu] + ops[f"conv-{gpu}"]))
        if n:
            lines.append(f"| {gpu} | {n} | {m:+.3f} | {err:.3f} | {rho:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=DATA)
    args = parser.parse_args(argv)
    files = group_files(args.data_dir)
    ops = {name: [load_operator(p, {}) for p in paths] for name, paths in files.items()}
    print("\n".join(report(ops)))


if __name__ == "__main__":
    main()
