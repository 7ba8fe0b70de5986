"""`pipetune model ...`: the analytical model without a service or a GPU."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, reported
from pipetune.clients.cli.output import console, print_json, rate_figure
from pipetune.clients.cli.workload_options import add_workload_commands, option
from pipetune.model.family import KernelFamily, family_for_op, family_of
from pipetune.model.hardware import DEFAULT_GPU, get_gpu, gpu_keys
from pipetune.model.memops.space import KNOBS as MEM_KNOBS
from pipetune.model.operators import SUITES
from pipetune.model.operators import suite as operator_suite
from pipetune.model.space import Schedule

model_app = typer.Typer(
    help="The analytical performance models: ALCOP's for the tensor-core GEMM family, the "
    "wave/bandwidth model for memory-intensive operators, the warpgroup-MMA model for the "
    "Hopper GEMM family (no GPU needed)."
)
rank_app = typer.Typer(help="Rank a workload's valid schedules by predicted latency.")
model_app.add_typer(rank_app, name="rank")

_GPU = option("gpu", str, DEFAULT_GPU, help=f"GPU to model: {', '.join(gpu_keys())}")
_PROFILE = option("profile", Path | None, None, help="hardware profile JSON to apply")
_JSON = option("as_json", bool, False, "--json", help="print one JSON document")


def tile_label(schedule: Schedule) -> str:
    return f"{schedule.block_m}x{schedule.block_n}x{schedule.block_k}"


_MEM_LABELS = {k.name: k for k in MEM_KNOBS}


def _workload(document: dict[str, Any]) -> Any:
    """A workload of any family from its canonical document."""
    return family_for_op(document.get("op")).parse_workload(document)


def rank_document(
    workload_data: dict[str, Any], gpu_name: str, top: int, profile: Path | None
) -> dict:
    if top < 1:
        raise CliError("--top: must be at least 1", code=2)
    family = family_for_op(workload_data.get("op"))
    workload = family.parse_workload(workload_data)
    gpu = get_gpu(gpu_name, profile=profile)
    space, _, ranked = family.rank(workload, gpu, top=top)
    if not len(space):
        raise CliError(f"{workload.label()}: {family.no_schedule_reason(workload, gpu)}", code=2)
    return {
        "workload": workload.canonical(),
        "family": family.name,
        "gpu": gpu.key,
        "gpu_name": gpu.name,
        "hardware_profile": gpu.profile,
        "space_size": len(space),
        "schedules": [
            {"rank": n, "schedule": r.schedule, "schedule_id": r.schedule_id, **r.terms}
            for n, r in enumerate(ranked, start=1)
        ],
    }


def _rank(workload: dict, gpu: str, top: int, profile: Path | None, as_json: bool) -> None:
    doc = rank_document(workload, gpu, top, profile)
    if as_json:
        print_json(doc)
        return
    family = family_for_op(doc["workload"]["op"])
    label = _workload(doc["workload"]).label()
    title = f"{label} on {doc['gpu_name']}: top {len(doc['schedules'])} of {doc['space_size']}"
    if family.name == "memops":
        _print_memops_rank(doc, title)
        return
    if family.name != "tensor_gemm":
        _print_family_rank(doc, title, family)
        return
    table = Table(title=title)
    for col in (
        "#",
        "tile MxNxK",
        "warps",
        "stages smem/reg",
        "pred µs",
        "TFLOP/s",
        "bound",
        "waves",
        "blk/SM",
    ):
        table.add_column(col, justify="right")
    for s in doc["schedules"]:
        k = s["schedule"]
        tile = tile_label(Schedule.from_dict(k))
        table.add_row(
            str(s["rank"]),
            tile,
            f"{k['block_row_warps']}x{k['block_col_warps']}",
            f"{k['smem_stages']}/{k['reg_stages']}",
            f"{s['predicted_us']:.2f}",
            rate_figure(s["predicted_tflops"], "TFLOP/s"),
            s["bottleneck"],
            str(s["waves"]),
            str(s["blocks_per_sm"]),
        )
    console.print(table)


def _print_family_rank(doc: dict[str, Any], title: str, family: KernelFamily) -> None:
    """Any other family's ranking: its own schedule label, the predicted latency and
    throughput in its unit, and the model's bottleneck and blocks per SM where it gives them."""
    table = Table(title=title + " (model predictions)")
    unit = family.throughput_unit
    for col in ("#", "schedule", "pred µs", unit, "bound", "blk/SM"):
        table.add_column(col, justify="right")
    workload = _workload(doc["workload"])
    for s in doc["schedules"]:
        table.add_row(
            str(s["rank"]),
            family.schedule_label(s["schedule"], workload),
            f"{s['predicted_us']:.2f}",
            rate_figure(family.throughput_of(workload, s["predicted_us"]), unit),
            str(s.get("bottleneck", "-")),
            str(s.get("blocks_per_sm", "-")),
        )
    console.print(table)


def _print_memops_rank(doc: dict[str, Any], title: str) -> None:
    table = Table(title=title + " (model predictions)")
    columns = ("#", "threads/row x rows/block", "blocks/row", "vec", "row kept", "split",
               "wave bound", "pred µs", "GB/s", "bound", "waves", "blk/SM")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    # An element-wise chain's split blocks never join: no split mode to show.
    joins = _workload(doc["workload"]).has_reduction
    for s in doc["schedules"]:
        k = s["schedule"]
        split = k["blocks_per_row"] > 1 and joins
        table.add_row(
            str(s["rank"]),
            f"{k['threads_per_row']}x{k['rows_per_block']}",
            str(k["blocks_per_row"]),
            str(k["vector_width"]),
            _MEM_LABELS["row_cache"].label(k["row_cache"]),
            _MEM_LABELS["split_mode"].label(k["split_mode"]) if split else "-",
            _MEM_LABELS["max_waves"].label(k["max_waves"]),
            f"{s['predicted_us']:.2f}",
            rate_figure(s["predicted_gbs"], "GB/s"),
            s["bottleneck"],
            str(s["waves"]),
            str(s["blocks_per_sm"]),
        )
    console.print(table)


_RANK_OPTIONS = [
    option("top", int, 10, help="how many schedules (more than the space gives the whole space)"),
    _GPU,
    _PROFILE,
    _JSON,
]
add_workload_commands(rank_app, _rank, _RANK_OPTIONS, "Rank the schedules of:")


def _baseline_speedup(family: KernelFamily, space: Any, latency: Any) -> tuple[str, float | None]:
    """The family's fixed baseline (non-pipelined GEMMs, one row per block) over the best."""
    label, mask = family.baseline(space)
    if not mask.any():
        return label, None
    speedup = float(latency[mask].min() / latency.min())
    return label, None if math.isnan(speedup) else speedup


def suite_document(name: str, gpu_name: str, profile: Path | None) -> dict:
    try:
        operators = operator_suite(name)
    except KeyError as exc:
        raise CliError(str(exc.args[0]), code=2) from None
    gpu = get_gpu(gpu_name, profile=profile)
    rows = []
    for op_name, workload in operators.items():
        family = family_of(workload)
        space = family.enumerate(workload, gpu)
        if not len(space):
            reason = family.no_schedule_reason(workload, gpu)
            raise CliError(f"suite {name}: {op_name}: {reason}", code=2)
        prediction = family.evaluate(space)
        best = int(prediction.order[0])
        baseline, speedup = _baseline_speedup(family, space, prediction.T_kernel)
        row = {
            "operator": op_name,
            "family": family.name,
            "workload": workload.canonical(),
            "space_size": len(space),
            "best": {"schedule": space[best].as_dict(), **prediction.terms(best)},
            "baseline": baseline,
            "speedup_over_baseline": speedup,
        }
        if family.name == "tensor_gemm":
            row["pipelining_speedup"] = speedup
        rows.append(row)
    return {
        "suite": name,
        "gpu": gpu.key,
        "gpu_name": gpu.name,
        "hardware_profile": gpu.profile,
        "operators": rows,
    }


@model_app.command("suite")
@reported
def suite(
    name: str = typer.Argument("alcop", help=f"operator suite: {', '.join(SUITES)}"),
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="GPU the model predicts for"),
    profile: Path | None = typer.Option(None, "--profile", help="hardware profile JSON"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """The model's best schedule for every operator of a benchmark suite."""
    doc = suite_document(name, gpu, profile)
    if as_json:
        print_json(doc)
        return
    if doc["operators"] and doc["operators"][0]["family"] == "memops":
        _print_memops_suite(doc, name)
        return
    if doc["operators"] and doc["operators"][0]["family"] != "tensor_gemm":
        _print_family_suite(doc, name)
        return
    table = Table(title=f"suite {name} on {doc['gpu_name']} (analytical model predictions)")
    for col in (
        "operator",
        "space",
        "best tile",
        "stages",
        "pred µs",
        "TFLOP/s",
        "bound",
        "pipelined / non-pipelined",
    ):
        table.add_column(col, justify="right")
    for row in doc["operators"]:
        k = row["best"]["schedule"]
        tile = tile_label(Schedule.from_dict(k))
        speedup = row["pipelining_speedup"]
        table.add_row(
            row["operator"],
            str(row["space_size"]),
            tile,
            f"{k['smem_stages']}/{k['reg_stages']}",
            f"{row['best']['predicted_us']:.1f}",
            rate_figure(row["best"]["predicted_tflops"], "TFLOP/s"),
            row["best"]["bottleneck"],
            "-" if speedup is None else f"{speedup:.2f}x",
        )
    console.print(table)


def _print_family_suite(doc: dict[str, Any], name: str) -> None:
    """Any other family's suite: each operator's best schedule by its family's label, the
    predicted latency and throughput, and the best over the family's fixed baseline."""
    table = Table(title=f"suite {name} on {doc['gpu_name']} (analytical model predictions)")
    rows = doc["operators"]
    family = family_for_op(rows[0]["workload"]["op"])
    columns = ("operator", "shape", "space", "best schedule", "pred µs",
               family.throughput_unit, "bound", f"best / {rows[0]['baseline']}")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        best = row["best"]
        workload = _workload(row["workload"])
        speedup = row["speedup_over_baseline"]
        table.add_row(
            row["operator"],
            workload.label(),
            str(row["space_size"]),
            family.schedule_label(best["schedule"], workload),
            f"{best['predicted_us']:.1f}",
            rate_figure(
                family.throughput_of(workload, best["predicted_us"]), family.throughput_unit
            ),
            str(best.get("bottleneck", "-")),
            "-" if speedup is None else f"{speedup:.2f}x",
        )
    console.print(table)


def _print_memops_suite(doc: dict[str, Any], name: str) -> None:
    table = Table(title=f"suite {name} on {doc['gpu_name']} (analytical model predictions)")
    columns = ("operator", "shape", "space", "best mapping", "pred µs", "GB/s", "bound",
               "best / one row per block")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for row in doc["operators"]:
        best = row["best"]
        speedup = row["speedup_over_baseline"]
        w = row["workload"]
        table.add_row(
            row["operator"],
            f"{w['rows']}x{w['cols']}",
            str(row["space_size"]),
            family_for_op(w["op"]).schedule_label(best["schedule"], _workload(w)),
            f"{best['predicted_us']:.1f}",
            rate_figure(best["predicted_gbs"], "GB/s"),
            best["bottleneck"],
            "-" if speedup is None else f"{speedup:.2f}x",
        )
    console.print(table)


@model_app.command("gpus")
@reported
def gpus(
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """The GPUs the model knows, with the values in use (spec sheet or calibrated profile)."""
    specs = [get_gpu(key).as_dict() for key in gpu_keys()]
    if as_json:
        print_json({"gpus": specs})
        return
    table = Table(title="GPUs")
    for col in ("key", "name", "arch", "SMs", "clock MHz", "peak FP16 TF", "DRAM GB/s", "profile"):
        table.add_column(col)
    for key in gpu_keys():
        g = get_gpu(key)
        table.add_row(
            g.key,
            g.name,
            g.arch,
            str(g.sm_count),
            f"{g.boost_clock_mhz:.0f}",
            f"{g.peak_tensor_tflops:.0f}",
            f"{g.dram_bandwidth_gbs:.0f}",
            g.profile,
        )
    console.print(table)
