"""`pipetune kernel ...`: generate the CUDA kernels and compile them with NVRTC (no GPU).

Every operator of every kernel family, with the family's generator (workers.families).
A tensor-core GEMM kernel takes its shape as arguments, so both commands work without one:
`source` prints the kernel of the operator's variant, and `compile` samples every schedule
valid on the GPU (the space of a shape that no shape rule limits, workers/codegen/sample.py).
A memory-intensive operator's valid schedules depend on its rows and columns, so it needs
its shape. Given a shape, the schedules are those valid for it, sampled by the family's
generator (``stratified_sample``: GEMM pipeline strata; every knob value for the
memory-intensive family).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from pipetune.clients.cli.errors import CliError
from pipetune.clients.cli.output import console, print_json
from pipetune.clients.cli.workload_options import add_workload_commands, option, shape_fields
from pipetune.model.errors import InvalidArgumentError
from pipetune.model.family import family_for_op, family_of, parse_any_workload, schedule_of_id
from pipetune.model.hardware import DEFAULT_GPU, get_gpu, gpu_keys
from pipetune.model.knobs import ScheduleError
from pipetune.workers.codegen.sample import UNCONSTRAINED_SHAPES, unconstrained_workload
from pipetune.workers.datasets.files import repeated_key
from pipetune.workers.families import codegen_for

kernel_app = typer.Typer(help="The CUDA kernels: source and NVRTC compilation (no GPU needed).")
source_app = typer.Typer(help="Print the CUDA C++ source of one schedule.")
compile_app = typer.Typer(help="Compile a stratified sample of a workload's valid schedules.")
kernel_app.add_typer(source_app, name="source")
kernel_app.add_typer(compile_app, name="compile")

_GPU = option(
    "gpu", str, DEFAULT_GPU, help=f"GPU whose valid space applies: {', '.join(gpu_keys())}"
)
_JSON = option("as_json", bool, False, "--json", help="print one JSON document")


def parse_schedule(text: str, op: str = "gemm") -> Any:
    """A --schedule JSON object of the op's family's knobs, or a schedule id of the family's
    (what `pipetune tasks`, `schedule` and export show: "s-2-2-1-1-8-6-2"); any fault in it is
    a usage error that names the option (a knob the family lacks read "unknown knob(s)"
    without saying which option held it)."""
    fam = family_for_op(op)
    try:
        by_id = fam.parse_schedule_id(text.strip())
        if by_id is not None:
            return by_id
        if schedule_of_id(text.strip()) is not None:  # another family's id
            raise CliError(
                f"--schedule: {text.strip()!r} is a schedule of another kernel family than "
                f"{op}'s ({fam.name})",
                code=2,
            )
    except ScheduleError as exc:
        raise CliError(f"--schedule: {exc}", code=2) from None
    try:
        data = json.loads(text, object_pairs_hook=_knobs_once)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("{"):  # meant as JSON: where the JSON breaks
            raise CliError(f"--schedule: not valid JSON ({exc.msg})", code=2) from None
        # Meant as an id (a JSON parser's "Expecting value" said nothing of that).
        raise CliError(
            f"--schedule: {text.strip()!r} is no schedule id of {op}'s family ({fam.name}; "
            "the ids `pipetune tasks` and `schedule` show) nor a JSON object of knob values",
            code=2,
        ) from None
    except RecursionError:  # (json's decoder recurses per level: a crash, not a message)
        raise CliError("--schedule: not valid JSON (nested too deeply)", code=2) from None
    try:
        return fam.parse_schedule(data)
    except ScheduleError as exc:
        raise CliError(f"--schedule: {exc}", code=2) from None


def _knobs_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: {"chunk": 2, "chunk": 4} kept the last value
    without a word, and the kernel printed was not the one the user read in their own text."""
    repeated = repeated_key(pairs)
    if repeated is not None:
        raise CliError(f"--schedule: the knob {json.dumps(repeated)} is given twice", code=2)
    return dict(pairs)


def resolve_workload(data: dict[str, Any]) -> tuple[Any, str | None]:
    """(the workload whose space applies, its label or None when no shape was given). With
    no shape options: the operator on a shape whose space is every schedule valid on the
    GPU; with some but not all of them: an error naming the missing ones."""
    op = data["op"]
    shape = shape_fields(op)
    missing = [name for name in shape if data.get(name) is None]
    if len(missing) < len(shape):
        if missing:
            flags = ", ".join(f"--{name.replace('_', '-')}" for name in missing)
            raise CliError(f"{flags}: give the whole shape or none of it", code=2)
        w = parse_any_workload(data)
        return w, w.label()
    if op not in UNCONSTRAINED_SHAPES:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in shape)
        raise CliError(f"{op}: give the shape ({flags}): its valid schedules depend on it", code=2)
    options = {k: v for k, v in data.items() if k not in (*shape, "op")}
    return unconstrained_workload(op, **options), None


def _source(workload: dict, schedule: str, gpu: str, launch: bool = False) -> None:
    w, label = resolve_workload(workload)
    if launch and label is None:
        raise CliError("--launch: give the shape: a launch is of one shape", code=2)
    family = family_of(w)
    s = parse_schedule(schedule, w.op)
    spec = get_gpu(gpu)
    codegen = codegen_for(family)
    problems = family.schedule_problems(s, w, spec)
    if problems:
        where = label or f"{codegen.kernel_kind(w)} kernels (any shape)"
        raise CliError(
            f"--schedule: {s.id} is outside the valid space of {where} on {spec.key}: "
            + "; ".join(problems),
            code=2,
        )
    if launch:
        # What `pipetune export` writes beside a tuned kernel (<stem>.launch.json, where the
        # kernels' names end in the GPU), for any schedule: the launch of a model pick or of
        # one's own, without tuning it first; its kernel names are this source's.
        from pipetune.clients.library.kernel import TunedKernel

        print_json(TunedKernel(w, spec.key, s).launch_document())
        return
    sys.stdout.write(codegen.generate(w, s).code)


add_workload_commands(
    source_app,
    _source,
    [
        option(
            "schedule",
            str,
            ...,
            help='JSON object of the operator\'s knobs, e.g. {"chunk": 2, ...} for gemm',
        ),
        _GPU,
        option(
            "launch",
            bool,
            False,
            "--launch",
            help="print the launch document instead (grid, block, dynamic shared memory, "
            "arguments in order, buffers, notes: what `pipetune export` writes as "
            "<stem>.launch.json, whose kernel names add the GPU); needs the shape",
        ),
    ],
    "CUDA source (the shape is optional for the GEMM family: its kernels take it as "
    "arguments; --launch: how to launch it on the shape) for:",
    shape_optional=True,
)


def compile_document(
    workload_data: dict, arch: str | None, sample: int, seed: int, gpu: str, workers: int | None
) -> dict[str, Any]:
    # Imported here: NVRTC loads only for the commands that compile.
    from pipetune.workers.compile import CompileError, check_arch, compile_many, kernel_arch

    if sample < 1:
        raise CliError("--sample: must be at least 1", code=2)
    if seed < 0:  # (numpy's generators take none: a ValueError after the space is built)
        raise CliError(f"--seed: must be at least 0, got {seed}", code=2)
    if workers is not None and workers < 1:
        raise CliError("--workers: must be at least 1", code=2)
    w, label = resolve_workload(workload_data)
    family = family_of(w)
    codegen = codegen_for(family)
    spec = get_gpu(gpu)
    arch = spec.arch if arch is None else arch  # (an empty --arch is not "the default")
    try:
        check_arch(arch)
    except InvalidArgumentError as exc:
        raise CliError(f"--arch: {exc.reason}", code=2) from None
    space = family.enumerate(w, spec)
    if not len(space):
        raise CliError(f"no valid schedule for {label or w.label()} on {spec.key}", code=2)
    schedules = codegen.stratified_sample(space, sample, seed)
    kernels = [codegen.generate(w, s) for s in schedules]
    target = arch
    for kernel in kernels:
        # Arch-specific instructions (wgmma) run on that one arch: every kernel would fail.
        # (kernel_arch is the one rule of which target a kernel builds for.)
        try:
            target = kernel_arch(kernel, arch)
        except ValueError:
            raise CliError(
                f"--arch: {family.name} kernels use {spec.arch}{kernel.arch_suffix}-only "
                f"instructions on {spec.key}; give --arch {spec.arch} or leave it out, not {arch}",
                code=2,
            ) from None
    outcomes = compile_many(kernels, arch, workers, return_exceptions=True)
    results = []
    for kernel, out in zip(kernels, outcomes, strict=True):
        row: dict[str, Any] = {
            "schedule": kernel.schedule.as_dict(),
            "schedule_id": kernel.schedule.id,
            "kernel": kernel.name,
            "entries": list(getattr(kernel, "entries", None) or (kernel.name,)),
            # The space's: a memory-intensive kernel's row cache depends on the shape.
            "smem_bytes": int(space.smem_bytes[space.index(kernel.schedule)]),
            "threads": kernel.threads,
        }
        if isinstance(out, CompileError):
            first = next((ln for ln in out.log.splitlines() if "error" in ln), str(out))
            row.update(ok=False, error=first.strip())
        else:
            row.update(
                ok=True,
                registers=out.registers,
                spills=out.spill_bytes,
                stack_bytes=out.stack_bytes,
                compile_ms=out.compile_ms,
                cached=out.cached,
            )
        results.append(row)
    return {
        # None without a shape: the sample is of every schedule valid on the GPU, drawn from
        # the space of `space_workload`, a shape that no shape rule limits.
        "workload": w.canonical() if label is not None else None,
        "family": family.name,
        "variant": codegen.kernel_kind(w),
        "space_workload": w.canonical(),
        "gpu": spec.key,
        # The target the cubins are built for (sm_90 -> sm_90a for wgmma), as the launch
        # document says.
        "arch": target,
        "space_size": len(space),
        "sampled": len(schedules),
        "results": results,
    }


def _compile(
    workload: dict,
    arch: str | None,
    sample: int,
    seed: int,
    gpu: str,
    workers: int | None,
    as_json: bool,
) -> None:
    doc = compile_document(workload, arch, sample, seed, gpu, workers)
    failed = [r for r in doc["results"] if not r["ok"]]
    if as_json:
        print_json(doc)
    else:
        _print_table(doc)
    if failed:
        raise CliError(f"{len(failed)} of {doc['sampled']} schedules failed to compile", code=1)


def _print_table(doc: dict[str, Any]) -> None:
    workload = parse_any_workload(doc["space_workload"])
    family = family_of(workload)
    if doc["workload"] is not None:
        label = workload.label()
    else:
        label = f"{doc['variant']} kernels (any shape; valid on {doc['gpu']})"
    table = Table(
        title=f"{label}: {doc['sampled']} of {doc['space_size']} schedules, {doc['arch']}"
    )
    for col in ("schedule", family.schedule_heading, "regs", "spills B"):
        table.add_column(col, justify="right")
    for col in ("smem KiB", "compile ms"):
        table.add_column(col, justify="right")
    for r in doc["results"]:
        s = family.parse_schedule(r["schedule"])
        common = [s.id, family.schedule_label(r["schedule"], workload)]
        if r["ok"]:
            spills = Text(str(r["spills"]), style="red" if r["spills"] else "")
            cached = " (cached)" if r["cached"] else ""
            table.add_row(
                *common,
                str(r["registers"]),
                spills,
                f"{r['smem_bytes'] / 1024:.1f}",
                f"{r['compile_ms']:.0f}{cached}",
            )
        else:
            error = Text("error", style="red")
            table.add_row(*common, error, "-", f"{r['smem_bytes'] / 1024:.1f}", "-")
    console.print(table)
    spilled = sum(1 for r in doc["results"] if r["ok"] and r["spills"])
    console.print(f"{spilled} schedule(s) spill registers")


add_workload_commands(
    compile_app,
    _compile,
    [
        option("arch", str | None, None, help="target, e.g. sm_80, sm_90 (default: the GPU's)"),
        option("sample", int, 24, help="how many schedules (stratified; the whole space if less)"),
        option("seed", int, 0, help="sampling seed"),
        _GPU,
        option("workers", int | None, None, help="parallel compiles (default: CPU count)"),
        _JSON,
    ],
    # Only the tensor-core GEMM family compiles without a shape (UNCONSTRAINED_SHAPES): the
    # others' valid schedules depend on it, and resolve_workload asks for it.
    "Compile a sample of the valid schedules (the shape is optional for "
    f"{', '.join(UNCONSTRAINED_SHAPES)}: without one, of every shape) of:",
    shape_optional=True,
)
