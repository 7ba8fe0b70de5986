"""Report: what a GPU campaign measured (issue 15's evidence), from benchmarks/data/<gpu>/.

    python -m benchmarks.bench_campaign --gpu h200 [--data-dir benchmarks/data] [--write]
    python -m benchmarks.bench_campaign --gpu h100 --data-dir benchmarks/data/hopper --write

Sections (one RESULTS.md section per GPU, `campaign-<gpu>`; a campaign of the Hopper wgmma
family alone, unpacked into a folder of its own, `campaign-hopper-<gpu>`):

- the device and the correctness of every kernel variant (campaign/correctness.json);
- per tensor-core operator: the best measured schedule's TFLOP/s, the best non-pipelined
  (smem_stages 1, reg_stages 1) and the best double-buffer-only (2, 1) schedule's, the vendor
  library's (cuBLAS or cuDNN, timed the same way), the pipelining speedups and the ratio to
  the library; per memory-intensive operator the best schedule's GB/s, the best fixed
  one-row-per-block mapping's and PyTorch's;
- per Hopper wgmma operator (the `hopper` suite): the best schedule's TFLOP/s, the best with one
  block per tile (no persistent or stream-K loop), the mma.sync family's best on the same shape
  (the ALCOP operator's dataset in `--compare-dir`, benchmarks/data by default, where it has
  one) and the library's; the geomean ratio to the library of each family's best and of the
  better of the two per operator (issue 15's 0.9x of cuBLAS);
- the analytical model against the measurements, per operator: Spearman's rank correlation
  of predicted and measured latency (spec-sheet and calibrated profiles), best-in-top-k of
  the model's ranking (the fastest measured among the model's k first over the fastest of
  all), and where it errs most (the knob value whose schedules it mispredicts most, after
  taking out the operator's overall scale); over the operators, its error by pipelining class
  and by co-resident blocks, and per K chunk and stage count how far that class's fastest
  schedule lies behind the best, measured and as the model ranks it (where its first choices
  go and where the optima are).

Every figure is computed from the committed measurements; nothing here is simulated.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from benchmarks.campaign_data import Campaign, OperatorData, campaign
from benchmarks.results import write_section
from pipetune.model.family import family_of
from pipetune.model.hardware import GPUSpec
from pipetune.model.operators import (
    ALCOP,
    ATTENTION,
    HOPPER,
    HOPPER_FUSED,
    HOPPER_PREFIX,
    MEMOPS,
)
from pipetune.model.pipelining import double_buffer_only, non_pipelined
from pipetune.tuner import metrics
from pipetune.workers.campaign.correctness import quarantine_note
from pipetune.workers.campaign.layout import sweep_operator

TOP_K = (1, 10, 50)


def geomean(values: Iterable[float]) -> float:
    """The tuner benchmark's geomean (0 where any value is 0), nan over no values."""
    v = list(values)
    return metrics.geomean(v) if v else float("nan")


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean, nan over no values (as geomean): a campaign without operators of
    a kind (the memops suite alone) reported numpy's "mean of empty slice" warning."""
    v = list(values)
    return float(np.mean(v)) if v else float("nan")


def operators_count(n: int) -> str:
    return f"{n} operator" if n == 1 else f"{n} operators"


def geomean_text(
    values: Iterable[float], fmt: str = ".2f", unit: str = "", largest: bool = False
) -> str:
    """A geomean as the report prints it, with how many operators it is over (``largest``:
    and the largest value), or "none measured" where no operator gave a value: a paused
    campaign's report, or one without operators of a kind, printed nan."""
    v = list(values)
    if not v:
        return "none measured"
    most = f"; max {max(v):{fmt}}{unit}" if largest else ""
    return f"{geomean(v):{fmt}}{unit} ({operators_count(len(v))}{most})"


def model_line(what: str, agg: dict[str, list[float]], spec_top10: bool = True) -> str:
    """The model's top-k geomeans and mean Spearman over the operators of ``agg``
    (model_table's), with how many they are; where none was measured, that said."""
    if not agg["top1"]:
        return f"{what}: none measured, so no top-k or Spearman."
    spec = f" (spec profile top-10 {geomean(agg['top10_spec']):.3f})" if spec_top10 else ""
    return (
        f"{what}, geomean of top-k over {operators_count(len(agg['top1']))}: "
        + ", ".join(f"top-{k} {geomean(agg[f'top{k}']):.3f}" for k in TOP_K)
        + f"{spec}; mean Spearman {mean(agg['rho_spec']):.3f} spec,"
        f" {mean(agg['rho_cal']):.3f} calibrated."
    )


def best_in_top_k(op: OperatorData, predicted_us: np.ndarray, k: int) -> float:
    """Fastest measured among the model's k best-ranked schedules over the fastest measured
    (1.0: the model's top k hold the optimum). A failed schedule counts as a slot."""
    order = np.argsort(predicted_us, kind="stable")[:k]
    top = op.measured_us[order]
    return float(op.measured_us[op.ok].min() / top.min()) if np.isfinite(top).any() else 0.0


def spearman(op: OperatorData, predicted_us: np.ndarray) -> float:
    ok = op.ok & np.isfinite(predicted_us)
    return float(spearmanr(predicted_us[ok], op.measured_us[ok]).statistic)


def worst_knob_value(op: OperatorData) -> tuple[str, float, int]:
    """The knob value whose schedules the calibrated model mispredicts most: the median of
    log(predicted / measured) over its schedules, less the operator's median (its scale).
    Returns (knob=value, the factor the model is off by there, schedules)."""
    ok = op.ok & np.isfinite(op.predicted_us)
    error = np.log(op.predicted_us[ok] / op.measured_us[ok])
    error -= np.median(error)
    worst = ("-", 1.0, 0)
    for knob, values in op.space.knobs.items():
        values = np.asarray(values)[ok]
        distinct = np.unique(values)
        if distinct.size < 2:
            continue
        for v in distinct:
            mask = values == v
            m = float(np.median(error[mask]))
            if abs(m) > abs(math.log(worst[1])):
                worst = (f"{knob}={int(v)}", math.exp(m), int(mask.sum()))
    return worst


def pipelining_class_errors(ops: list[OperatorData]) -> list[str]:
    """Over the tensor-core operators: per (smem_stages, reg_stages) class, the median of the
    calibrated model's log error after each operator's scale, and the class's share of each
    operator's optimum."""
    # Per operator once: its log errors less its scale, its stages, where its optimum is.
    per_op = []
    for op in ops:
        ok = op.ok & np.isfinite(op.predicted_us)
        error = np.log(op.predicted_us / op.measured_us)
        error -= np.median(error[ok])
        best = op.best[1] if op.best is not None else -1
        per_op.append(
            (ok, error, op.space.knobs["smem_stages"], op.space.knobs["reg_stages"], best)
        )
    rows = []
    for smem in range(1, 7):
        for reg in (1, 2):
            errors, wins = [], 0
            for ok, error, smem_stages, reg_stages, best in per_op:
                mask = ok & (smem_stages == smem) & (reg_stages == reg)
                errors.extend(error[mask].tolist())
                wins += int(best >= 0 and bool(mask[best]))
            if errors:
                m = float(np.median(errors))
                rows.append(f"| {smem} | {reg} | {len(errors):,} | {math.exp(m):.2f} | {wins} |")
    return [
        "| smem_stages | reg_stages | schedules | model / measured (median, scale removed) "
        "| operators whose optimum is here |",
        "|---:|---:|---:|---:|---:|",
        *rows,
    ]


# Blocks per SM, grouped where the schedules thin out (a wave's first wave, as the model
# counts them: reading 7's last wave aside).
BLOCKS_PER_SM_GROUPS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 8), (9, 12), (13, 10_000))


def blocks_per_sm_errors(ops: list[OperatorData]) -> list[str]:
    """Over the tensor-core operators: per number of co-resident blocks (the model's
    N_threadblk_per_SM of a full wave), the median of the calibrated model's log error after
    each operator's scale, and how many operators have their optimum there. A whole class of
    schedules the model gets wrong shows as a trend down the rows."""
    errors: dict[tuple[int, int], list[float]] = {group: [] for group in BLOCKS_PER_SM_GROUPS}
    wins = dict.fromkeys(BLOCKS_PER_SM_GROUPS, 0)
    for op in ops:
        ok = op.ok & np.isfinite(op.predicted_us)
        error = np.log(op.predicted_us / op.measured_us)
        error -= np.median(error[ok])
        blocks = np.asarray(op.prediction.N_threadblk_per_SM)
        best = op.best[1] if op.best is not None else -1
        for low, high in BLOCKS_PER_SM_GROUPS:
            mask = ok & (blocks >= low) & (blocks <= high)
            errors[(low, high)].extend(error[mask].tolist())
            wins[(low, high)] += int(best >= 0 and bool(mask[best]))
    rows = []
    for (low, high), values in errors.items():
        if values:
            label = str(low) if low == high else f"{low}+" if high >= 10_000 else f"{low}-{high}"
            median = math.exp(float(np.median(values)))
            rows.append(f"| {label} | {len(values):,} | {median:.2f} | {wins[(low, high)]} |")
    return [
        "| blocks per SM | schedules | model / measured (median, scale removed) "
        "| operators whose optimum is here |",
        "|---:|---:|---:|---:|",
        *rows,
    ]


def chunk_stage_classes(ops: list[OperatorData]) -> list[str]:
    """Over the tensor-core operators: per (chunk, smem_stages) class, how far its best
    schedule lies behind the operator's best, measured and as the model ranks it (medians over
    the operators that have the class; 1.00: the class holds the best), and how many
    operators have their optimum and the model's first choice in it. Where the two columns
    part, the model prefers the wrong kind of pipeline for the fastest schedules (errors over
    whole spaces, as the tables above, can hide that)."""
    behind: dict[tuple[int, int], list[tuple[float, float]]] = {}
    best_in: Counter[tuple[int, int]] = Counter()
    first_in: Counter[tuple[int, int]] = Counter()
    for op in ops:
        ok = op.ok & np.isfinite(op.predicted_us)
        if not ok.any():
            continue
        measured, predicted = op.measured_us, op.predicted_us
        chunk, stages = op.space.knobs["chunk"], op.space.knobs["smem_stages"]
        best_measured, best_predicted = measured[ok].min(), predicted[ok].min()
        best, first = int(np.argmin(np.where(ok, measured, np.inf))), int(np.argmin(predicted))
        for key in sorted({(int(c), int(s)) for c, s in zip(chunk[ok], stages[ok], strict=True)}):
            mask = ok & (chunk == key[0]) & (stages == key[1])
            behind.setdefault(key, []).append(
                (best_measured / measured[mask].min(), best_predicted / predicted[mask].min())
            )
        best_in[(int(chunk[best]), int(stages[best]))] += 1
        first_in[(int(chunk[first]), int(stages[first]))] += 1
    rows = []
    for key, pairs in sorted(behind.items()):
        m, p = np.median(np.array(pairs), axis=0)
        rows.append(
            f"| {key[0]} | {key[1]} | {len(pairs)} | {m:.2f} | {p:.2f} | {best_in[key]} "
            f"| {first_in[key]} |"
        )
    return [
        "| chunk | smem_stages | operators | class best / best, measured | the same, model "
        "| operators whose optimum is here | operators whose model first choice is here |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]


def correctness_table(c: Campaign) -> list[str]:
    doc = c.correctness
    lines = ["| family | variant | schedules | passed | failed |", "|---|---|---:|---:|---:|"]
    for family, fam in doc["families"].items():
        for variant, counts in fam["by_variant"].items():
            total = sum(counts.values())
            ok = counts.get("ok", 0)
            lines.append(f"| {family} | {variant} | {total} | {ok} | {total - ok} |")
    lines.append(
        f"| all | | {doc['schedules']} | {doc['passed']} | {doc['failed']} |"
        f" (verdict: {doc['verdict']})"
    )
    later = [
        f"{', '.join(entry['families'])} ({entry.get('device_name') or '?'})"
        for entry in doc.get("added_later", [])
    ]
    if later:
        lines += [
            "",
            "Checked in later calls, each family's latest check replacing its earlier one: "
            + "; ".join(later)
            + ".",
        ]
    note = quarantine_note(doc)
    if note is not None:
        lines += ["", note[0].upper() + note[1:] + "."]
    return lines


def _cell(op: OperatorData, best: tuple[float, int] | None) -> str:
    return "-" if best is None else f"{op.throughput(best[0]):,.1f}"


def gemm_table(ops: list[OperatorData]) -> tuple[list[str], dict[str, list[float]]]:
    lines = [
        "| operator | shape | best TFLOP/s | schedule | non-pipelined | double-buffer only "
        "| library | best / non-pipelined | best / double-buffer | best / library |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[str, list[float]] = {
        "np": [],
        "db": [],
        "lib": [],
        "lib_gemm": [],
        "lib_gemm_only": [],
        "lib_bmm": [],
        "lib_conv": [],
    }
    for op in ops:
        best = op.best
        flat = op.best_in(non_pipelined(op.space))
        double = op.best_in(double_buffer_only(op.space))
        lib_us = (op.library or {}).get("latency_us")
        if best is None:
            continue
        schedule = op.family.schedule_label(op.space[best[1]].as_dict(), op.workload)
        # speedups: the baseline's time over the best's
        cells = [
            f"{flat[0] / best[0]:.2f}x" if flat else "-",
            f"{double[0] / best[0]:.2f}x" if double else "-",
            f"{lib_us / best[0]:.2f}" if lib_us else "-",
        ]
        if flat:
            ratios["np"].append(flat[0] / best[0])
        if double:
            ratios["db"].append(double[0] / best[0])
        if lib_us:
            ratios["lib"].append(lib_us / best[0])
            if op.workload.op in ("gemm", "bmm"):
                ratios["lib_gemm"].append(lib_us / best[0])
            kind = {"gemm": "lib_gemm_only", "bmm": "lib_bmm"}.get(op.workload.op, "lib_conv")
            ratios[kind].append(lib_us / best[0])
        lib = f"{op.throughput(lib_us):,.1f}" if lib_us else "-"
        lines.append(
            f"| {op.name} | {op.workload.label()} | {_cell(op, best)} | {schedule} "
            f"| {_cell(op, flat)} | {_cell(op, double)} | {lib} | " + " | ".join(cells) + " |"
        )
    return lines, ratios


def memops_table(ops: list[OperatorData]) -> tuple[list[str], dict[str, list[float]]]:
    lines = [
        "| operator | shape | best GB/s | mapping | one row per block | PyTorch "
        "| best / one-row | best / PyTorch |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    ratios: dict[str, list[float]] = {"fixed": [], "lib": []}
    for op in ops:
        best = op.best
        _, mask = op.family.baseline(op.space)
        fixed = op.best_in(mask)
        lib_us = (op.library or {}).get("latency_us")
        if best is None:
            continue
        mapping = op.family.schedule_label(op.space[best[1]].as_dict(), op.workload)
        if fixed:
            ratios["fixed"].append(fixed[0] / best[0])
        if lib_us:
            ratios["lib"].append(lib_us / best[0])
        lines.append(
            f"| {op.name} | {op.workload.rows}x{op.workload.cols} | {_cell(op, best)} "
            f"| {mapping} | {_cell(op, fixed)} "
            f"| {f'{op.throughput(lib_us):,.1f}' if lib_us else '-'} "
            f"| {f'{fixed[0] / best[0]:.2f}x' if fixed else '-'} "
            f"| {f'{lib_us / best[0]:.2f}x' if lib_us else '-'} |"
        )
    return lines, ratios


def model_table(ops: list[OperatorData]) -> tuple[list[str], dict[str, list[float]]]:
    ks = " | ".join(f"top-{k}" for k in TOP_K)
    lines = [
        f"| operator | schedules | failed | Spearman spec | Spearman calibrated | {ks} "
        "| top-10 spec | errs most at (model / measured) |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(TOP_K) + "---:|---|",
    ]
    agg: dict[str, list[float]] = {"rho_spec": [], "rho_cal": [], "top10_spec": []}
    for k in TOP_K:
        agg[f"top{k}"] = []
    for op in ops:
        rho_spec, rho_cal = spearman(op, op.predicted_spec_us), spearman(op, op.predicted_us)
        tops = [best_in_top_k(op, op.predicted_us, k) for k in TOP_K]
        top10_spec = best_in_top_k(op, op.predicted_spec_us, 10)
        where, factor, n = worst_knob_value(op)
        agg["rho_spec"].append(rho_spec)
        agg["rho_cal"].append(rho_cal)
        agg["top10_spec"].append(top10_spec)
        for k, t in zip(TOP_K, tops, strict=True):
            agg[f"top{k}"].append(t)
        lines.append(
            f"| {op.name} | {len(op.measured_us):,} | {int((~op.ok).sum())} | {rho_spec:.3f} "
            f"| {rho_cal:.3f} | " + " | ".join(f"{t:.3f}" for t in tops) + f" | {top10_spec:.3f} "
            f"| {where} ({factor:.2f}x, {n} schedules) |"
        )
    return lines, agg


def hopper_table(
    ops: list[OperatorData], mma_sync: Campaign | None
) -> tuple[list[str], dict[str, list[float]]]:
    """The wgmma family's operators against one block per tile, the mma.sync family's best on
    the same shape (where ``mma_sync`` has its dataset) and the library."""
    lines = [
        "| operator | shape | best TFLOP/s | schedule | one block per tile | mma.sync best "
        "| library | best / one block per tile | best / library | mma.sync / library "
        "| better of the two / library |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[str, list[float]] = {"per_tile": [], "lib": [], "mma_lib": [], "both_lib": []}
    theirs: dict[str, OperatorData] = {}
    if mma_sync is not None:
        names = [op.name.removeprefix(HOPPER_PREFIX) for op in ops]
        theirs = {op.name: op for op in mma_sync.operators(names) if op.name in names}
    for op in ops:
        best = op.best
        if best is None:
            continue
        _, mask = op.family.baseline(op.space)
        per_tile = op.best_in(mask)
        lib_us = (op.library or {}).get("latency_us")
        other = theirs.get(op.name.removeprefix(HOPPER_PREFIX))
        other_best = other.best if other is not None else None
        schedule = op.family.schedule_label(op.space[best[1]].as_dict(), op.workload)
        if per_tile:
            ratios["per_tile"].append(per_tile[0] / best[0])
        cells = [f"{per_tile[0] / best[0]:.2f}x" if per_tile else "-"]
        if lib_us:
            ratios["lib"].append(lib_us / best[0])
            cells.append(f"{lib_us / best[0]:.2f}")
            if other_best:
                ratios["mma_lib"].append(lib_us / other_best[0])
                ratios["both_lib"].append(lib_us / min(best[0], other_best[0]))
                cells += [
                    f"{lib_us / other_best[0]:.2f}",
                    f"{lib_us / min(best[0], other_best[0]):.2f}",
                ]
            else:
                cells += ["-", "-"]
        else:
            cells += ["-", "-", "-"]
        mma = f"{op.throughput(other_best[0]):,.1f}" if other_best else "-"
        lib = f"{op.throughput(lib_us):,.1f}" if lib_us else "-"
        lines.append(
            f"| {op.name} | {op.workload.label()} | {_cell(op, best)} | {schedule} "
            f"| {_cell(op, per_tile)} | {mma} | {lib} | " + " | ".join(cells) + " |"
        )
    return lines, ratios


def hopper_report(c: Campaign, mma_sync: Campaign | None) -> list[str]:
    """The Hopper wgmma family's part of a report (empty without its operators)."""
    # (the fused GEMMs' and the attention suite's sweeps beside the hopper suite's)
    names = [*HOPPER, *HOPPER_FUSED, *(n for n in ATTENTION if n.startswith(HOPPER_PREFIX))]
    ops = [op for op in c.operators(names) if op.name in names]
    if not ops:
        return []
    table, r = hopper_table(ops, mma_sync)
    model_lines, a = model_table(ops)
    where = f"`{mma_sync.folder}`" if mma_sync is not None else "no folder"
    return [
        "### Hopper wgmma operators: tuned against one block per tile, the mma.sync family and"
        " the library",
        "",
        f"(the mma.sync family's best from its operator of the same shape (the name without"
        f" {HOPPER_PREFIX!r}) in {where},"
        " measured in another call: compare the ratios, each against its own call's library)",
        "",
        *table,
        "",
        f"Geomean: best / one block per tile {geomean_text(r['per_tile'], unit='x')}; best /"
        f" library {geomean_text(r['lib'])}; the mma.sync family's"
        f" {geomean_text(r['mma_lib'])} and the better of the two"
        f" {geomean_text(r['both_lib'])}, over the operators both measured.",
        "",
        "The analytical model of the wgmma family against the measurements:",
        "",
        *model_lines,
        "",
        model_line("The wgmma family", a, spec_top10=False),
    ]


def parse_model_set(items: Iterable[str]) -> dict[str, float]:
    """--model-set FIELD=VALUE pairs (GPUSpec fields), for model ablations."""
    known = {f.name for f in fields(GPUSpec)}
    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise ValueError(f"--model-set {item!r}: expected FIELD=VALUE with a GPU spec field")
        try:
            overrides[name] = float(value)
        except ValueError:
            raise ValueError(f"--model-set {item!r}: {value!r} is not a number") from None
    return overrides


def with_model_gpu(op: OperatorData, overrides: dict[str, float]) -> OperatorData:
    """The operator with the model evaluated on a changed GPU spec (ablation; the
    measurements are untouched). Zero is allowed here: it removes a term."""
    if not overrides:
        return op
    gpu = replace(op.space.gpu, **overrides, profile=f"{op.space.gpu.profile}+ablation")
    return replace(op, space=op.family.space_of(op.workload, gpu, op.space.knobs))


def report(
    c: Campaign, model_set: dict[str, float] | None = None, mma_sync: Campaign | None = None
) -> str:
    overrides = model_set or {}
    alcop = [with_model_gpu(op, overrides) for op in c.operators(list(ALCOP)) if op.name in ALCOP]
    # (the attention suite's causal softmax beside the memops suite's plain ones)
    mem_names = [*MEMOPS, *(n for n, w in ATTENTION.items() if family_of(w).name == "memops")]
    memops = [
        with_model_gpu(op, overrides) for op in c.operators(mem_names) if op.name in mem_names
    ]
    hopper_lines = hopper_report(c, mma_sync)
    if hopper_lines and not alcop and not memops:
        return "\n".join(
            [*header(c), "### Correctness", "", *correctness_table(c), "", *hopper_lines]
        )
    gemm_lines, r = gemm_table(alcop)
    mem_lines, rm = memops_table(memops)
    model_gemm, ag = model_table(alcop)
    model_mem, am = model_table(memops)
    missing = sorted(set(MEMOPS) - {op.name for op in memops})
    lines = [
        *header(c),
        "### Correctness",
        "",
        *correctness_table(c),
        "",
        "### Tensor-core operators: tuned against non-pipelined, double-buffered and the library",
        "",
        *gemm_lines,
        "",
        f"Geomean: best / non-pipelined {geomean_text(r['np'], unit='x', largest=True)},"
        f" best / double-buffer only {geomean_text(r['db'], unit='x')}; best / library over"
        f" the GEMM and BMM operators {geomean_text(r['lib_gemm'])}: GEMM"
        f" {geomean_text(r['lib_gemm_only'])}, BMM {geomean_text(r['lib_bmm'])}, convolutions"
        f" {geomean_text(r['lib_conv'])}; over all {geomean_text(r['lib'])}.",
        "",
        "### Memory-intensive operators: tuned mapping against one row per block and PyTorch",
        "",
        *mem_lines,
        "",
        f"Geomean: best / one-row-per-block {geomean_text(rm['fixed'], unit='x')}, best /"
        f" PyTorch {geomean_text(rm['lib'], unit='x')}."
        + (f" Not swept: {', '.join(missing)}." if missing else ""),
        "",
        "### The analytical model against the measurements",
        "",
        "Spearman: rank correlation of predicted and measured latency over the schedules that",
        "ran. top-k: the fastest measured schedule among the model's k best-ranked (calibrated",
        "profile) over the fastest of all. Errs most: the knob value whose schedules the",
        "calibrated model mispredicts most, after taking out the operator's overall scale.",
        "",
        *model_gemm,
        "",
        model_line("Tensor-core operators", ag),
        "",
        "By pipelining class (tensor-core operators):",
        "",
        *pipelining_class_errors(alcop),
        "",
        "By co-resident blocks (tensor-core operators):",
        "",
        *blocks_per_sm_errors(alcop),
        "",
        "The fastest schedule of each K chunk and stage count (tensor-core operators):",
        "",
        *chunk_stage_classes(alcop),
        "",
        *model_mem,
        "",
        model_line("Memory-intensive operators", am),
        "",
        absolute_error_line(memops),
    ]
    if hopper_lines:
        lines += ["", *hopper_lines]
    return "\n".join(lines)


def absolute_error_line(operators: list[OperatorData]) -> str:
    """How far the calibrated model's latency is from the measured one, where users read it:
    at each operator's fastest measured schedule (`model rank`'s pick is near it), and at its
    family's baseline (tune-model's "model" baseline: the fastest baseline schedule, e.g. one
    row per block). Ratios predicted / measured: their median over the operators, and the
    median and largest |log| of them."""
    at_best, at_baseline = [], []
    for op in operators:
        if op.best is None:
            continue
        measured, row = op.best
        at_best.append(math.log(op.predicted_us[row] / measured))
        _, mask = op.family.baseline(op.space)
        fixed = op.best_in(mask)
        if fixed is not None:
            at_baseline.append(math.log(float(op.predicted_us[mask].min()) / fixed[0]))

    def said(logs: list[float]) -> str:
        if not logs:
            return "none measured"
        magnitude = np.abs(logs)
        return (
            f"median {math.exp(float(np.median(logs))):.3f}, median |log| "
            f"{float(np.median(magnitude)):.3f}, largest |log| {float(magnitude.max()):.3f}"
        )

    return (
        "Predicted / measured latency (calibrated profile), at the fastest measured schedule: "
        f"{said(at_best)}; at the fastest baseline schedule: {said(at_baseline)} "
        f"({len(at_best)} operators)."
    )


def operator_kinds(names: list[str]) -> str:
    """Operator names in a few words: how many of each kind (the name's first part)."""
    kinds: dict[str, int] = {}
    for name in names:
        kind = name.split("_")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{kind} x{n}" if n > 1 else kind for kind, n in kinds.items())


def sweep_dates_line(c: Campaign) -> str:
    """When the sweeps were measured, where more than one day holds them."""
    dates = c.sweep_dates()
    if len(dates) < 2:
        return ""
    parts = [f"{day}: {len(names)} ({operator_kinds(names)})" for day, names in dates.items()]
    return (
        "The sweeps were measured on more than one day (each operator's on one): "
        + "; ".join(parts)
        + ". An operator swept again replaces its earlier dataset, which stays in git."
    )


def unfinished_line(c: Campaign) -> str:
    """What a campaign that is not complete (paused at a call's deadline, stopped, cut off)
    has swept, so that no figure below passes for the whole campaign's."""
    summary = c.summary
    state = summary.get("state")
    if state == "complete":
        return ""
    operators = [op for op in summary.get("operators") or [] if isinstance(op, str)]
    swept = {sweep_operator(path.name) for path in c.dataset_paths()}
    left = [op for op in operators if op not in swept]
    reason = f" ({summary['reason']})" if summary.get("reason") else ""
    return (
        f"The campaign is {state}{reason}: {len(operators) - len(left)} of"
        f" {operators_count(len(operators))} swept. Every figure below is over the operators"
        " measured, their count beside it"
        + (f"; not swept yet: {', '.join(left)}." if left else ".")
    )


def header(c: Campaign) -> list[str]:
    """Where the figures come from: the command, the device, the timing floor and the
    days the sweeps were measured."""
    probe = c.probe
    device = probe.get("device", {}) if isinstance(probe.get("device"), dict) else {}
    floor = c.baselines.get("timing_floor_us")
    data_dir = c.folder.parent
    option = "" if data_dir == Path("benchmarks/data") else f" --data-dir {data_dir}"
    return [
        f"Command: `python -m benchmarks.bench_campaign --gpu {c.gpu}{option} --write`, over the",
        f"committed campaign data in `{c.folder}/` (`pipetune campaign unpack`).",
        f"Measured on: {c.baselines.get('device_name') or device.get('name', '?')} (the line"
        " above says where the analysis ran); every trial and baseline timed with a flush",
        "of >= 2x L2 before each launch, one CUDA event pair around it, median of 5-10 repeats;",
        f"the timing floor (an empty kernel timed the same way) is {floor:.2f} µs."
        if floor
        else "",
        sweep_dates_line(c),
        *filter(None, [unfinished_line(c)]),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", required=True, help="the campaign's GPU key (h100, h200)")
    parser.add_argument("--data-dir", type=Path, default=Path("benchmarks/data"))
    parser.add_argument(
        "--compare-dir",
        type=Path,
        default=Path("benchmarks/data"),
        help="where the mma.sync family's campaign of the same GPU is (for the wgmma table)",
    )
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS.md")
    parser.add_argument(
        "--model-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="ablation: evaluate the model with a GPU spec field replaced (k_step_cycles=0);"
        " printed only, never written",
    )
    args = parser.parse_args()
    try:
        model_set = parse_model_set(args.model_set)
    except ValueError as exc:
        parser.error(str(exc))
    if model_set and args.write:
        parser.error("--model-set is an ablation: it is printed, never written to RESULTS.md")
    c = campaign(args.gpu, args.data_dir)
    compare = args.compare_dir / args.gpu
    mma_sync = (
        campaign(args.gpu, args.compare_dir)
        if compare != c.folder and (compare / "campaign" / "campaign.json").exists()
        else None
    )
    body = report(c, model_set, mma_sync)
    print(body)
    if args.write:
        names = {op.name for op in c.operators()}
        if names and names <= set(HOPPER):  # a campaign of the wgmma family alone
            name = f"campaign-hopper-{args.gpu}"
            title = f"GPU campaign on {args.gpu.upper()}: the Hopper wgmma family, measured"
        else:
            name, title = f"campaign-{args.gpu}", f"GPU campaign on {args.gpu.upper()}: measured"
        write_section(name, f"{title} (issue 15)", body)


if __name__ == "__main__":
    main()
