"""`pipetune sweep ...` (measure whole schedule spaces into T4 datasets) and
`pipetune calibrate` (measure the GPU's constants into a hardware profile).

    pipetune sweep gemm --m 1024 --n 1024 --k 1024 --runner cupy --gpu h100 \\
        --out benchmarks/data/h100/gemm_1k.t4.json.gz
    pipetune sweep softmax --rows 4096 --cols 768 --runner cupy --gpu h100 --out sm.t4.json.gz
    pipetune sweep --operators alcop --runner cupy --gpu h100 --out-dir benchmarks/data/h100/
    pipetune sweep --operators memops --runner cupy --gpu h100 --out-dir benchmarks/data/h100/

Every kernel family's operators, each swept over its family's space (model/family.py).

Files are written atomically (a temporary file renamed into place). ``--runner simulated``
gives the analytical model plus noise, labelled simulated in every record: for trying the
plumbing, never for results.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pipetune.clients.cli.errors import CliError, one_line, reported, runner_failure
from pipetune.clients.cli.output import console, print_json, stderr_console
from pipetune.clients.cli.paths import check_output_dir, check_output_file, output_file
from pipetune.clients.cli.workload_options import add_workload_commands, option
from pipetune.model.family import all_ops, family_of, parse_any_workload
from pipetune.model.hardware import (
    DEFAULT_GPU,
    GPUSpec,
    get_gpu,
    gpu_keys,
    resolve_gpu_key,
    user_profile_dir,
)
from pipetune.model.operators import SUITES
from pipetune.model.trials import MAX_SAMPLES, RunnerKind
from pipetune.workers.datasets import summary, write_t4
from pipetune.workers.runners import MeasureSettings, Runner, RunnerError, make_runner
from pipetune.workers.runners.sweep import select_schedules, sweep

SWEEP_RUNNERS: tuple[str, ...] = (RunnerKind.CUPY, RunnerKind.SIMULATED)
# Progress bars go to stderr so that --json documents on stdout stay machine-readable.

sweep_app = typer.Typer(
    help=(
        "Measure every valid schedule of a workload (or of a benchmark suite with "
        "--operators) and write T4 datasets."
    ),
    invoke_without_command=True,
    no_args_is_help=False,
)

_RUNNER_HELP = "cupy (a real GPU) or simulated (analytical model + noise; demos/CI only)"


def _check_common(runner: str, limit: int | None, seed: int, repeats: int, warmup: int) -> None:
    if runner not in SWEEP_RUNNERS:
        raise CliError(f"--runner: must be one of {', '.join(SWEEP_RUNNERS)}, got {runner!r}", 2)
    if limit is not None and limit < 1:
        raise CliError("--limit: must be at least 1", 2)
    if seed < 0:  # (numpy's generators take none: a ValueError mid-sweep)
        raise CliError(f"--seed: must be at least 0, got {seed}", 2)
    # A result carries at most MAX_SAMPLES timings; more repeats would be measured for
    # nothing (and a huge count failed allocating its array, after the set-up).
    if not 1 <= repeats <= MAX_SAMPLES:
        raise CliError(f"--repeats: must be within 1..{MAX_SAMPLES}, got {repeats}", 2)
    if not 0 <= warmup <= MAX_SAMPLES:
        raise CliError(f"--warmup: must be within 0..{MAX_SAMPLES}, got {warmup}", 2)


def _open_runner(name: str, gpu: GPUSpec, seed: int, repeats: int, warmup: int) -> Runner:
    settings = MeasureSettings(warmup=warmup, repeats=repeats, seed=seed)
    try:
        return make_runner(name, gpu=gpu, seed=seed, settings=settings)
    except RunnerError as exc:
        raise runner_failure(exc) from None


@contextlib.contextmanager
def _progress() -> Iterator[Progress]:
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr_console,
    ) as bar:
        yield bar


def _has_compile_step(runner: Runner) -> bool:
    return type(runner).prepare is not Runner.prepare


def _sweep_to_file(
    runner: Runner,
    workload: Any,
    gpu: GPUSpec,
    out: Path,
    limit: int | None,
    seed: int,
    bar: Progress,
    label: str,
) -> dict[str, Any]:
    space = family_of(workload).enumerate(workload, gpu)
    if not len(space):
        raise CliError(f"no valid schedule for {workload.label()} on {gpu.key}", 2)
    schedules = select_schedules(space, limit, seed)
    task = bar.add_task(f"measure {label}", total=len(schedules))
    try:
        dataset = sweep(
            runner,
            workload,
            gpu,
            schedules,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    except RunnerError as exc:
        raise runner_failure(exc) from None
    write_t4(dataset, out)
    doc = summary(dataset)
    return {
        "path": str(out),
        "workload": doc["workload"],
        "label": workload.label(),
        "runner": runner.name,
        "space_size": len(space),
        "schedules": doc["configurations"],
        "valid": doc["valid"],
        "failed": doc["failed"],
        "best": doc["best"],
        "best_us": None if doc["best_time_ms"] is None else doc["best_time_ms"] * 1e3,
    }


def _report(rows: list[dict[str, Any]], as_json: bool, name_key: str = "label") -> None:
    if as_json:
        print_json({"datasets": rows})
        return
    table = Table(title="sweep results")
    for col in ("workload", "runner", "measured", "valid", "failed", "best µs", "file"):
        table.add_column(col, justify="right" if col in ("measured", "valid", "failed") else None)
    for row in rows:
        best = "-" if row["best_us"] is None else f"{row['best_us']:.2f}"
        table.add_row(
            row[name_key],
            row["runner"],
            f"{row['schedules']}/{row['space_size']}",
            str(row["valid"]),
            str(row["failed"]),
            best,
            row["path"],
        )
    console.print(table)
    if any(row["runner"] == "simulated" for row in rows):
        console.print("note: simulated = analytical model + noise, not measurements")


def sweep_workload(
    workload_data: dict[str, Any],
    runner: str,
    gpu: str,
    out: Path,
    limit: int | None,
    seed: int,
    repeats: int,
    warmup: int,
    profile: Path | None,
    as_json: bool,
) -> None:
    _check_common(runner, limit, seed, repeats, warmup)
    # The parent folder is made if missing (write_t4 does), as the sweep always did.
    check_output_file(out, "--out", create_parent=True)
    workload = parse_any_workload(workload_data)
    spec = get_gpu(gpu, profile=profile)
    family = family_of(workload)
    if not len(family.enumerate(workload, spec)):
        # Refused before the progress display opens (said after an empty progress line,
        # naming no option), as --operators does.
        why = family.no_schedule_reason(workload, spec) or "no schedule of its space is valid"
        raise CliError(f"--gpu {gpu}: cannot run {workload.label()}: {why}", 2)
    with _open_runner(runner, spec, seed, repeats, warmup) as measuring, _progress() as bar:
        if _has_compile_step(measuring):
            space = family.enumerate(workload, spec)
            task = bar.add_task("compile", total=len(space))
            try:
                measuring.prepare(
                    workload,
                    select_schedules(space, limit, seed),
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
            except RunnerError as exc:
                raise runner_failure(exc) from None
        row = _sweep_to_file(measuring, workload, spec, out, limit, seed, bar, workload.label())
    _report([row], as_json)


add_workload_commands(
    sweep_app,
    sweep_workload,
    [
        option("runner", str, "cupy", help=_RUNNER_HELP),
        option("gpu", str, DEFAULT_GPU, help=f"GPU: {', '.join(gpu_keys())}"),
        option(
            "out",
            Path,
            ...,
            parser=output_file,
            help="T4 file to write, e.g. benchmarks/data/NAME.t4.json.gz",
        ),
        option("limit", int | None, None, help="measure a seeded random sample of N schedules"),
        option("seed", int, 0, help="seed of the inputs, the sample and the simulated noise"),
        option("repeats", int, 30, help="timed repeats per schedule"),
        option("warmup", int, 3, help="untimed launches before the repeats"),
        option("profile", Path | None, None, help="hardware profile JSON to apply"),
        option("as_json", bool, False, "--json", help="print one JSON document"),
    ],
    "Sweep the schedule space of:",
)


def _check_suite_outputs(out_dir: Path, operators: dict[str, Any]) -> None:
    """Before measuring anything: the folder can be made and no operator's file is taken
    by a directory."""
    check_output_dir(out_dir, "--out-dir")
    for name in operators:
        check_output_file(out_dir / f"{name}.t4.json.gz", "--out-dir", create_parent=True)


def sweep_suite(
    suite_name: str,
    runner: str,
    gpu: str,
    out_dir: Path,
    limit: int | None,
    seed: int,
    repeats: int,
    warmup: int,
    profile: Path | None,
    as_json: bool,
) -> None:
    from pipetune.clients.cli.campaign_cmds import unrunnable_reason
    from pipetune.workers.campaign.operators import resolve_operators

    _check_common(runner, limit, seed, repeats, warmup)
    try:
        # Suites and operator names, comma-separated, as `pipetune campaign --operators`
        # takes them (an operator's name was refused as "unknown operator suite").
        operators = resolve_operators(suite_name)
    except ValueError as exc:
        raise CliError(f"--operators: {exc}", 2) from None
    if not operators:
        raise CliError("--operators: name at least one suite or operator", 2)
    _check_suite_outputs(out_dir, operators)
    spec = get_gpu(gpu, profile=profile)
    reason = unrunnable_reason(operators, spec)
    if reason is not None:  # (said after an empty progress line, naming neither option)
        raise CliError(f"--gpu {gpu}: cannot run {reason}", 2)
    rows = []
    with _open_runner(runner, spec, seed, repeats, warmup) as measuring, _progress() as bar:
        plan = {}
        for name, workload in operators.items():
            space = family_of(workload).enumerate(workload, spec)
            plan[name] = (workload, select_schedules(space, limit, seed) if len(space) else [])
        if _has_compile_step(measuring):
            # Compile everything first: a (variant, schedule) cubin shared by several
            # operators is built once, and the GPU then runs without waiting on NVRTC.
            total = sum(len(s) for _, s in plan.values())
            task = bar.add_task("compile", total=total)
            done = 0
            for workload, schedules in plan.values():
                try:
                    measuring.prepare(
                        workload,
                        schedules,
                        progress=lambda d, _t, base=done: bar.update(task, completed=base + d),
                    )
                except RunnerError as exc:
                    raise runner_failure(exc) from None
                done += len(schedules)
        for name, (workload, _) in plan.items():
            out = out_dir / f"{name}.t4.json.gz"
            row = _sweep_to_file(measuring, workload, spec, out, limit, seed, bar, name)
            rows.append({**row, "operator": name})
    _report(rows, as_json, name_key="operator")


# The options the group and every operator command share. Given before the operator name
# (`pipetune sweep --gpu a100 gemm ...`) they are the operator command's defaults.
_SHARED_OPTIONS: tuple[str, ...] = (
    "runner",
    "gpu",
    "limit",
    "seed",
    "repeats",
    "warmup",
    "profile",
    "as_json",
)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave the option (on the command line or through its environment
    variable) rather than leaving its default. By the source's name: typer carries its own
    copy of click, whose ParameterSource is not click's (compared with click's, every option
    read as given)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def _pass_on_shared_options(ctx: typer.Context) -> None:
    """Hand the shared options the user gave before the operator name to the operator
    command. Through click's default_map, read when the subcommand's context is made, so the
    same option given after the name still wins."""
    given = {name: ctx.params[name] for name in _SHARED_OPTIONS if _given(ctx, name)}
    if not given:
        return
    command = ctx.invoked_subcommand
    assert command is not None
    defaults = dict(ctx.default_map or {})
    defaults[command] = {**defaults.get(command, {}), **given}
    ctx.default_map = defaults


@sweep_app.callback()
@reported
def sweep_main(
    ctx: typer.Context,
    operators: str | None = typer.Option(
        None,
        "--operators",
        help=f"sweep benchmark suites ({', '.join(SUITES)}) and operators by name, "
        "comma-separated (alcop,MM_RN50_FC)",
    ),
    runner: str = typer.Option("cupy", "--runner", help=_RUNNER_HELP),
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help=f"GPU: {', '.join(gpu_keys())}"),
    out_dir: Path | None = typer.Option(
        None, "--out-dir", help="folder for <Operator>.t4.json.gz files (with --operators)"
    ),
    limit: int | None = typer.Option(
        None, "--limit", help="measure a seeded random sample of N schedules per operator"
    ),
    seed: int = typer.Option(0, "--seed", help="seed of the inputs, samples and noise"),
    repeats: int = typer.Option(30, "--repeats", help="timed repeats per schedule"),
    warmup: int = typer.Option(3, "--warmup", help="untimed launches before the repeats"),
    profile: Path | None = typer.Option(None, "--profile", help="hardware profile JSON"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Sweep one workload (`pipetune sweep gemm ...`, `pipetune sweep softmax ...`) or a suite
    (`--operators alcop`, `--operators memops`)."""
    if ctx.invoked_subcommand is not None:
        if operators is not None or out_dir is not None:
            raise CliError("--operators/--out-dir sweep a suite; not with an operator command", 2)
        _pass_on_shared_options(ctx)
        return
    if operators is None:
        raise CliError(
            f"name an operator (pipetune sweep {'|'.join(all_ops())} ...) or a suite "
            f"(pipetune sweep --operators {'|'.join(SUITES)} --out-dir DIR)",
            2,
        )
    if out_dir is None:
        raise CliError("--out-dir: required with --operators", 2)
    sweep_suite(operators, runner, gpu, out_dir, limit, seed, repeats, warmup, profile, as_json)


@reported
def calibrate(
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU spec to calibrate (default: the device's own)"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        parser=output_file,
        help="profile to write (default: <gpu>.json in your profile folder, "
        "$PIPETUNE_PROFILE_DIR or the user data dir's profiles/, which the model reads first)",
    ),
    device: int = typer.Option(0, "--device", help="CUDA device index"),
    as_json: bool = typer.Option(False, "--json", help="print the profile document"),
) -> None:
    """Measure this GPU's memory, clock and mma.sync constants into a hardware profile.

    DRAM and L2 bandwidth and latency, the SM clock and mma.sync throughput (CuPy
    microbenchmarks); the profile overrides the spec sheet wherever the model reads it.
    """
    from pipetune.workers.calibrate import (
        CalibrationError,
        CalibrationUsageError,
        run_calibration,
        write_profile,
    )

    if gpu is not None:
        resolve_gpu_key(gpu)  # an unknown name is the user's mistake (exit 2), GPU or not
    if device < 0:
        raise CliError(f"--device: must be at least 0, got {device}", 2)
    # Where the profile goes is checked before the GPU is measured, not after.
    if out is not None:
        check_output_file(out, "--out")
    elif gpu is not None:
        default = user_profile_dir() / f"{resolve_gpu_key(gpu)}.json"
        check_output_file(default, "--out (default)", create_parent=True)
    else:  # the device names the file: its folder at least is checked now
        check_output_dir(user_profile_dir(), "--out (default)")
    try:
        document = run_calibration(gpu, device=device)
    except CalibrationUsageError as exc:  # a --gpu that is not the device: exit 2, as campaign
        raise CliError(one_line(exc), 2) from None
    except CalibrationError as exc:
        raise CliError(one_line(exc), 1) from None
    if out is None:  # the user's profile folder, made on first use
        out = user_profile_dir() / f"{document['gpu']}.json"
        check_output_file(out, "--out (default)", create_parent=True)
        out.parent.mkdir(parents=True, exist_ok=True)
    path = write_profile(document, out)
    if as_json:
        print_json({**document, "path": str(path)})
        return
    table = Table(title=f"{document['device_name']} ({document['gpu']}) -> {path}")
    table.add_column("field")
    table.add_column("measured", justify="right")
    table.add_column("spec sheet", justify="right")
    spec = get_gpu(document["gpu"], calibrated=False).as_dict()
    for field, value in document["overrides"].items():
        table.add_row(field, f"{value:.4g}", f"{spec[field]:.4g}")
    console.print(table)
    print(f"wrote {path}", file=sys.stderr)
