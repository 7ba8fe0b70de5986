"""Report: how well what was measured on one GPU ranks another GPU's schedules (issue 15,
item 4: the cross-GPU warm start), from two unpacked campaigns in benchmarks/data/.

    python -m benchmarks.bench_cross_gpu --source h200 --target h100 [--write]

For every operator swept on both GPUs, four rankings of the target GPU's schedules are
judged against the target's measurements (Spearman of predicted and measured latency over
the schedules that ran; best-in-top-k: the fastest measured among the ranking's k first over
the fastest of all):

- `analytical`: the analytical model with the target's calibrated profile (no measurement);
- `source measured`: the same operator's measurements on the source GPU, schedule by
  schedule (what an exhaustive prior from the other GPU says; a schedule the source did not
  run ranks last);
- `xgb, same shape`: the cost model (model/cost_model.py: the schedule's features plus the
  analytical model's terms, here for the target GPU) trained on every source operator's
  measurements, this one's included: a tuning history of the same shapes on the other GPU;
- `xgb, unseen shape`: the same trained on the other source operators only (leave one
  operator out): a new shape on a new GPU, from another GPU's history of other shapes.

One booster per kernel family (their features differ). Every figure is computed from the
committed measurements; nothing here is simulated.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.bench_campaign import TOP_K, best_in_top_k, geomean, spearman
from benchmarks.campaign_data import OperatorData, campaign
from benchmarks.results import write_section
from pipetune.model.cost_model import CostModel
from pipetune.model.operators import ALCOP, MEMOPS

RANKINGS = ("analytical", "source measured", "xgb, same shape", "xgb, unseen shape")


def source_latency_on_target(source: OperatorData, target: OperatorData) -> np.ndarray:
    """The source GPU's measured latency of each of the target's schedules (inf where the
    source has no successful measurement of it)."""
    by_id = dict(zip(source.space.ids, source.measured_us, strict=True))
    return np.array([by_id.get(i, np.inf) for i in target.space.ids], dtype=np.float64)


def xgb_predicted_us(
    train: Sequence[OperatorData], target: OperatorData, seed: int = 0
) -> np.ndarray:
    """Latency (µs) the cost model trained on `train`'s measurements predicts for the target's
    schedules (the rank is what matters; the scale follows from log throughput)."""
    model = CostModel(seed=seed, use_analytical=True, params={"nthread": 2})
    # A failed schedule's latency is never read (its target is the cost model's penalty).
    model.fit_corpus(
        [(op.space, np.where(op.ok, op.measured_us, 1.0) * 1e-6, ~op.ok) for op in train]
    )
    return 1.0 / np.exp(model.predict(target.space).astype(np.float64))


def rankings(source_ops: dict[str, OperatorData], target: OperatorData) -> dict[str, np.ndarray]:
    others = [op for name, op in source_ops.items() if name != target.name]
    return {
        "analytical": target.predicted_us,
        "source measured": source_latency_on_target(source_ops[target.name], target),
        "xgb, same shape": xgb_predicted_us(list(source_ops.values()), target),
        "xgb, unseen shape": xgb_predicted_us(others, target),
    }


def family_table(
    source_ops: dict[str, OperatorData], target_ops: list[OperatorData]
) -> tuple[list[str], dict[str, dict[str, list[float]]]]:
    head = "| operator | " + " | ".join(
        f"{r}: Spearman / top-1 / top-10 / top-50" for r in RANKINGS
    )
    lines = [head + " |", "|---|" + "---:|" * len(RANKINGS)]
    summary: dict[str, dict[str, list[float]]] = {
        r: {"rho": [], **{f"top{k}": [] for k in TOP_K}} for r in RANKINGS
    }
    for op in target_ops:
        cells = []
        for name, predicted in rankings(source_ops, op).items():
            rho = spearman(op, predicted)
            tops = [best_in_top_k(op, predicted, k) for k in TOP_K]
            summary[name]["rho"].append(rho)
            for k, t in zip(TOP_K, tops, strict=True):
                summary[name][f"top{k}"].append(t)
            cells.append(f"{rho:.2f} / " + " / ".join(f"{t:.3f}" for t in tops))
        lines.append(f"| {op.name} | " + " | ".join(cells) + " |")
    return lines, summary


def summary_lines(label: str, summary: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = [
        f"{label}, over the operators above (geomean of best-in-top-k, mean Spearman):",
        "",
        "| ranking | mean Spearman | " + " | ".join(f"top-{k}" for k in TOP_K) + " |",
        "|---|---:|" + "---:|" * len(TOP_K),
    ]
    for name, s in summary.items():
        tops = " | ".join(f"{geomean(s[f'top{k}']):.3f}" for k in TOP_K)
        lines.append(f"| {name} | {np.mean(s['rho']):.3f} | {tops} |")
    return lines


def report(source: str, target: str, data_dir: Path) -> str:
    src, tgt = campaign(source, data_dir), campaign(target, data_dir)
    lines = [
        f"Command: `python -m benchmarks.bench_cross_gpu --source {source} --target {target}"
        " --write`, over the committed campaigns in"
        f" `benchmarks/data/{source}/` ({src.baselines.get('device_name', '?')}) and"
        f" `benchmarks/data/{target}/` ({tgt.baselines.get('device_name', '?')}).",
        "Rankings of the target GPU's schedules, judged against its measurements: the",
        "analytical model (target's calibrated profile); the source GPU's measurements of the",
        "same operator; the cost model (schedule features + analytical terms, XGBoost, 150",
        "rounds) trained on the source's measurements of every operator (same shape) or of the",
        "others only (unseen shape). Spearman of predicted and measured latency; top-k: the",
        "fastest measured among the ranking's k first over the fastest of all.",
    ]
    for suite, label in ((ALCOP, "Tensor-core operators"), (MEMOPS, "Memory-intensive operators")):
        names = list(suite)
        source_ops = {op.name: op for op in src.operators(names) if op.name in suite}
        target_ops = [
            op for op in tgt.operators(names) if op.name in suite and op.name in source_ops
        ]
        if not target_ops:
            continue
        table, summary = family_table(source_ops, target_ops)
        lines += ["", f"### {label}: {source.upper()} -> {target.upper()}", "", *table, ""]
        lines += summary_lines(label, summary)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True, help="the GPU whose data ranks (h200)")
    parser.add_argument("--target", required=True, help="the GPU ranked (h100)")
    parser.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.source == args.target:
        parser.error("--source and --target must be different GPUs")
    body = report(args.source, args.target, args.data_dir)
    print(body)
    if args.write:
        write_section(
            f"cross-gpu-{args.source}-{args.target}",
            f"Cross-GPU: {args.source.upper()} measurements ranking {args.target.upper()}'s"
            " schedules (issue 15)",
            body,
        )


if __name__ == "__main__":
    main()
