"""Report: the same sweeps measured twice, how far the measurements themselves agree.

    python -m benchmarks.bench_repeat --gpu h100 \
        --repeat benchmarks/data/h100/repeat-2026-11-26 [--write]

`--repeat` is a second campaign's folder (its archive extracted: campaign.json, baselines.json
and sweeps/), run later on the same kind of GPU with the same settings over some of the
operators of benchmarks/data/<gpu>/. Per operator, with the first sweep as A and the second
as B, both aligned row by row with the operator's space:

- the typical change of one schedule's time (median and 90th percentile of |ln(B/A)|) and
  the overall drift (geomean of B/A);
- Spearman's rank correlation of A and B;
- best-in-top-k of A's ranking judged by B's times (and B's by A's): how far a perfect
  predictor of the first sweep lands from the optimum of the second, the ceiling that noise
  puts on any ranking's top-k score;
- the analytical model's best-in-top-k judged by A and by B, the spread of the figures that
  issue 15's goals are read from;
- the vendor library's time in each campaign.

Every figure is computed from the committed measurements; nothing here is simulated.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from benchmarks.bench_campaign import best_in_top_k, geomean
from benchmarks.campaign_data import (
    DATA_DIR,
    OperatorData,
    campaign,
    load_operator,
    read_json,
)
from benchmarks.results import write_section

TOP_K = (1, 10)
SECTION = "repeat-{gpu}"


@dataclass(frozen=True)
class Pair:
    """One operator measured twice, aligned with the same space rows."""

    first: OperatorData
    second: OperatorData

    def __post_init__(self) -> None:
        if len(self.first.measured_us) != len(self.second.measured_us):
            raise ValueError(f"{self.first.name}: the two sweeps cover different spaces")

    @property
    def both(self) -> np.ndarray:
        return self.first.ok & self.second.ok

    def log_ratios(self) -> np.ndarray:
        both = self.both
        return np.log(self.second.measured_us[both] / self.first.measured_us[both])

    def spearman(self) -> float:
        both = self.both
        a, b = self.first.measured_us[both], self.second.measured_us[both]
        return float(spearmanr(a, b).statistic)

    def ranking_judged(self, k: int) -> tuple[float, float]:
        """(A's ranking judged by B, B's ranking judged by A) at best-in-top-k."""
        return (
            best_in_top_k(self.second, self.first.measured_us, k),
            best_in_top_k(self.first, self.second.measured_us, k),
        )

    def model_judged(self, k: int) -> tuple[float, float]:
        """The calibrated model's best-in-top-k judged by A and by B."""
        return (
            best_in_top_k(self.first, self.first.predicted_us, k),
            best_in_top_k(self.second, self.first.predicted_us, k),
        )


def pairs(gpu: str, repeat: Path, data_dir: Path = DATA_DIR) -> list[Pair]:
    first = campaign(gpu, data_dir)
    second_baselines = read_json(repeat / "baselines.json")
    found = []
    for path in sorted((repeat / "sweeps").glob("*.t4.json.gz")):
        name = path.name.split(".")[0]
        original = first.folder / path.name
        if not original.exists():
            raise SystemExit(f"error: {name} is in {repeat} but not in {first.folder}")
        found.append(
            Pair(load_operator(original, first.baselines), load_operator(path, second_baselines))
        )
    if not found:
        raise SystemExit(f"error: no sweeps in {repeat / 'sweeps'}")
    return found


def _library_us(op: OperatorData) -> float | None:
    return None if op.library is None else float(op.library["latency_us"])


def report(gpu: str, repeat: Path, data_dir: Path = DATA_DIR) -> str:
    found = pairs(gpu, repeat, data_dir)
    settings = read_json(repeat / "campaign.json").get("settings", {})
    device = read_json(repeat / "probe.json").get("device", {}).get("name", "?")
    lines = [
        f"Command: `python -m benchmarks.bench_repeat --gpu {gpu} --repeat {repeat} --write`.",
        f"First sweeps: `benchmarks/data/{gpu}/`; second: `{repeat}/sweeps/` ({device}, the "
        f"campaign's settings {settings}). A = the first sweep's times, B = the second's, "
        "over the schedules that ran in both.",
        "",
        "| operator | schedules | median \\|ln B/A\\| | p90 \\|ln B/A\\| | drift B/A | Spearman "
        "| A's top-1 by B | A's top-10 by B | B's top-1 by A | same optimum | model top-1 by A "
        "/ by B | model top-10 by A / by B | library A / B (µs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    summary: dict[str, list[float]] = {
        key: [] for key in ("a1", "a10", "b1", "m1a", "m1b", "m10a", "m10b")
    }
    for pair in found:
        r = np.abs(pair.log_ratios())
        a1, b1 = pair.ranking_judged(1)
        a10, _ = pair.ranking_judged(10)
        m1a, m1b = pair.model_judged(1)
        m10a, m10b = pair.model_judged(10)
        for key, value in zip(summary, (a1, a10, b1, m1a, m1b, m10a, m10b), strict=True):
            summary[key].append(value)
        assert pair.first.best is not None and pair.second.best is not None
        same = "yes" if pair.first.best[1] == pair.second.best[1] else "no"
        lib_a, lib_b = _library_us(pair.first), _library_us(pair.second)
        library = "-" if lib_a is None or lib_b is None else f"{lib_a:.1f} / {lib_b:.1f}"
        lines.append(
            f"| {pair.first.name} | {int(pair.both.sum()):,} | {np.median(r):.3f} | "
            f"{np.quantile(r, 0.9):.3f} | {float(np.exp(pair.log_ratios().mean())):.3f} | "
            f"{pair.spearman():.3f} | {a1:.3f} | {a10:.3f} | {b1:.3f} | {same} | "
            f"{m1a:.3f} / {m1b:.3f} | {m10a:.3f} / {m10b:.3f} | {library} |"
        )
    g = {key: geomean(values) for key, values in summary.items()}
    lines += [
        "",
        f"Geomean over the {len(found)} operators: the first sweep's ranking judged by the "
        f"second holds {g['a1']:.3f} of its optimum at top-1 and {g['a10']:.3f} at top-10 "
        f"(the second's judged by the first: {g['b1']:.3f} at top-1); the model's top-1 reads "
        f"{g['m1a']:.3f} by A and {g['m1b']:.3f} by B, its top-10 {g['m10a']:.3f} and "
        f"{g['m10b']:.3f}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--repeat", type=Path, required=True, help="the second campaign's folder")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--write", action="store_true", help="into benchmarks/RESULTS.md")
    args = parser.parse_args()
    body = report(args.gpu, args.repeat, args.data_dir)
    print(body)
    if args.write:
        title = f"GPU campaign on {args.gpu.upper()}: the same sweeps measured twice (issue 15)"
        write_section(SECTION.format(gpu=args.gpu), title, body)


if __name__ == "__main__":
    main()
