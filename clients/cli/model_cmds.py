"""`pipetune model ...`: the analytical model without a service or a GPU."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, reported
from pipetune.clients.cli.output import console, print_json
from pipetune.clients.cli.workload_options import add_workload_commands, option
from pipetune.model.analytical import evaluate, rank
from pipetune.model.hardware import get_gpu, gpu_keys
from pipetune.model.operators import suite as operator_suite
from pipetune.model.pipelining import pipelining_gain
from pipetune.model.space import Schedule, Space
from pipetune.model.workloads import parse_workload

model_app = typer.Typer(help="The ALCOP analytical performance model (no GPU needed).")
rank_app = typer.Typer(help="Rank a workload's valid schedules by predicted latency.")
model_app.add_typer(rank_app, name="rank")

_GPU = option("gpu", str, "h100", help=f"GPU to model: {', '.join(gpu_keys())}")
_PROFILE = option("profile", Path | None, None, help="hardware profile JSON to apply")
_JSON = option("as_json", bool, False, "--json", help="print one JSON document")


def tile_label(schedule: Schedule) -> str:
    return f"{schedule.block_m}x{schedule.block_n}x{schedule.block_k}"


def rank_document(
    workload_data: dict[str, Any], gpu_name: str, top: int, profile: Path | None
) -> dict:
    if top < 1:
        raise CliError("--top: must be at least 1", code=2)
    workload = parse_workload(workload_data)
    gpu = get_gpu(gpu_name, profile=profile)
    space, _, ranked = rank(workload, gpu, top=top)
    if not len(space):
        raise CliError(f"no valid schedule for {workload.label()} on {gpu.key}", code=2)
    return {
        "workload": workload.canonical(),
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
    label = parse_workload(doc["workload"]).label()
    table = Table(
        title=f"{label} on {doc['gpu_name']}: top {len(doc['schedules'])} of {doc['space_size']}"
    )
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
            f"{s['predicted_tflops']:.1f}",
            s["bottleneck"],
            str(s["waves"]),
            str(s["blocks_per_sm"]),
        )
    console.print(table)


add_workload_commands(
    rank_app,
    _rank,
    [
        option(
            "top", int, 10, help="how many schedules (more than the space gives the whole space)"
        ),
        _GPU,
        _PROFILE,
        _JSON,
    ],
    "Rank the schedules of:",
)


def suite_document(name: str, gpu_name: str, profile: Path | None) -> dict:
    try:
        operators = operator_suite(name)
    except KeyError as exc:
        raise CliError(str(exc.args[0]), code=2) from None
    gpu = get_gpu(gpu_name, profile=profile)
    rows = []
    for op_name, workload in operators.items():
        space = Space.enumerate(workload, gpu)
        prediction = evaluate(space)
        best = int(prediction.order[0])
        gain = pipelining_gain(space, prediction.T_kernel)
        speedup = gain.speedup_over_non_pipelined
        rows.append(
            {
                "operator": op_name,
                "workload": workload.canonical(),
                "space_size": len(space),
                "best": {"schedule": space[best].as_dict(), **prediction.terms(best)},
                "pipelining_speedup": None if math.isnan(speedup) else speedup,
            }
        )
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
    name: str = typer.Argument("alcop", help="operator suite"),
    gpu: str = typer.Option("h100", "--gpu"),
    profile: Path | None = typer.Option(None, "--profile"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The model's best schedule for every operator of a benchmark suite."""
    doc = suite_document(name, gpu, profile)
    if as_json:
        print_json(doc)
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
            f"{row['best']['predicted_tflops']:.1f}",
            row["best"]["bottleneck"],
            "-" if speedup is None else f"{speedup:.2f}x",
        )
    console.print(table)


@model_app.command("gpus")
@reported
def gpus(as_json: bool = typer.Option(False, "--json")) -> None:
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
