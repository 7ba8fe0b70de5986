"""`pipetune campaign ...`: what a lent GPU runs (workers.campaign), and its two helpers.

    pipetune campaign --gpu h100 --out-dir DIR [--minutes M] [--have DIR|ARCHIVE]
        [--operators alcop,memops,...] [--runner cupy|simulated] [--pack FILE]
    pipetune campaign plan [--gpu h100] [--operators alcop,memops] [--calls 3] [--minutes 8]
        [--json]
    pipetune campaign unpack ARCHIVE [--data-dir benchmarks/data] [--profile-dir DIR]
        (the profile's default folder: the user's, hardware.user_profile_dir())

The campaign's modules load inside the commands: the GPU machine imports only what a
campaign needs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, reported
from pipetune.clients.cli.output import console, print_json
from pipetune.clients.cli.paths import (
    check_output_dir,
    check_output_file,
    check_tar_archive,
    output_file,
)
from pipetune.model.hardware import DEFAULT_GPU, GPUSpec, get_gpu, gpu_keys
from pipetune.model.operators import SUITES

if TYPE_CHECKING:
    from pipetune.workers.campaign import CampaignOptions

campaign_app = typer.Typer(
    help=(
        "The GPU campaign: probe, correctness, calibration, vendor baselines and exhaustive "
        "sweeps, each its own file, resumable with --have, packed into one archive."
    ),
    invoke_without_command=True,
    no_args_is_help=False,
)

_RUNNER_HELP = "cupy (a real GPU) or simulated (compiled kernels, simulated launches; CI only)"


def _print_outcome(outcome: object) -> None:
    summary = outcome.summary  # type: ignore[attr-defined]
    table = Table(title=f"campaign: {outcome.state}")  # type: ignore[attr-defined]
    table.add_column("phase")
    table.add_column("this call")
    table.add_column("seconds", justify="right")
    table.add_column("overall")
    this_call = (summary.get("calls") or [{}])[-1].get("phases", [])
    overall = summary.get("phases", {})
    for record in this_call:
        table.add_row(
            record["phase"],
            record["status"],
            f"{record['seconds']:.1f}",
            overall.get(record["phase"], ""),
        )
    console.print(table)
    sweeps = summary.get("sweeps", {})
    console.print(
        f"sweeps: {len(sweeps.get('done', []))} done, {len(sweeps.get('partial', {}))} "
        f"partial, {len(sweeps.get('left', []))} not started"
    )
    if summary.get("simulated"):
        console.print("note: SIMULATED campaign: compiled kernels, simulated launches; no data")


# The default lives with the campaign (workers/campaign/operators.DEFAULT_OPERATORS), which
# loads only inside the commands: an unset option means it.
_OPERATORS_HELP = (
    f"suites ({', '.join(SUITES)}) and operators, comma-separated (alcop,MM_RN50_FC); "
    "default: the ALCOP suite, then the memops suite (hopper: the ALCOP GEMMs and BMMs on "
    "the Hopper wgmma family, hopper_fused: the swiglu and bias_gelu suites' fused GEMMs "
    "on it, and attention: Q·Kᵀ over keys stored N x K on both GEMM families and the causal "
    "softmax; H100 and H200 only)"
)


def unrunnable_reason(operators: dict[str, Any], gpu: GPUSpec) -> str | None:
    """Why some of the operators have no valid schedule on the GPU (the Hopper suite on an
    A100), in their family's words, as `pipetune model suite` gives them; None when every
    operator can run. Without this the campaign would probe, then "check" zero schedules."""
    from pipetune.model.family import family_of

    empty = [op for op, w in operators.items() if not len(family_of(w).enumerate(w, gpu))]
    if not empty:
        return None
    first = operators[empty[0]]
    names = ", ".join(empty[:3]) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
    return f"{names}: {family_of(first).no_schedule_reason(first, gpu)}"


def _check_runnable(operators: dict[str, Any], gpu: GPUSpec, option: str) -> None:
    reason = unrunnable_reason(operators, gpu)
    if reason is not None:
        raise CliError(f"{option}: cannot run {reason}", 2)


def _check_campaign_paths(options: CampaignOptions) -> None:
    """What check_options leaves to the write: a folder under a file, a directory in the
    archive's place, an --have archive that tarfile cannot read (whose own error is one
    line per compression tried, and comes only after the out-dir was made)."""
    check_output_dir(options.out_dir, "--out-dir")
    if options.pack is not None:
        check_output_file(options.pack, "--pack", create_parent=True)
    if options.have is not None and options.have.is_file():
        check_tar_archive(options.have, "--have")


@campaign_app.callback()
@reported
def campaign_main(
    ctx: typer.Context,
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"GPU ({', '.join(gpu_keys())}); default: the probed device's"
    ),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="folder for the campaign files"),
    minutes: float = typer.Option(8.0, "--minutes", help="stop cleanly before this many minutes"),
    have: Path | None = typer.Option(
        None, "--have", help="an earlier call's folder or archive: its phases are skipped"
    ),
    operators: str | None = typer.Option(None, "--operators", help=_OPERATORS_HELP),
    runner: str = typer.Option("cupy", "--runner", help=_RUNNER_HELP),
    pack: Path | None = typer.Option(
        None,
        "--pack",
        parser=output_file,
        help="write everything into this .tar.gz (kept current after each part)",
    ),
) -> None:
    """Run the GPU campaign (`pipetune campaign --out-dir DIR ...`)."""
    if ctx.invoked_subcommand is not None:
        return
    if out_dir is None:
        raise CliError("--out-dir: required (a new folder for the campaign's files)", 2)
    from pipetune.workers.campaign import CampaignOptions, CampaignUsageError, run_campaign
    from pipetune.workers.campaign.operators import DEFAULT_OPERATORS, resolve_operators
    from pipetune.workers.campaign.run import check_options

    options = CampaignOptions(
        out_dir=out_dir,
        gpu=gpu,
        minutes=minutes,
        have=have,
        # (None: the option not given; an empty value names no operator and is refused,
        # not read as the default's whole campaign)
        operators=DEFAULT_OPERATORS if operators is None else operators,
        runner=runner,
        pack=pack,
        command=tuple(sys.argv),
    )
    try:
        # Every refusal before anything is made or measured: the options, the paths, and
        # (when --gpu names it; else the probed device decides) what the GPU cannot run.
        check_options(options)
        _check_campaign_paths(options)
        if gpu is not None:
            _check_runnable(resolve_operators(options.operators), get_gpu(gpu), f"--gpu {gpu}")
        outcome = run_campaign(options)
    except CampaignUsageError as exc:
        raise CliError(str(exc), 2) from None
    if outcome.summary:  # (none where a usage mistake was refused before anything was written)
        _print_outcome(outcome)
    if outcome.pack_bytes is not None:
        console.print(f"archive: {pack} ({outcome.pack_bytes / 2**20:.2f} MiB)")
    if outcome.exit_code:
        raise CliError(outcome.message, outcome.exit_code)
    if outcome.state == "paused":
        console.print(f"paused: {outcome.message}; continue with --have {pack or out_dir}")
    elif outcome.summary.get("quarantine"):  # complete, without what correctness left out
        console.print(outcome.message)


@campaign_app.command("plan")
@reported
def campaign_plan(
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help=f"GPU: {', '.join(gpu_keys())}"),
    operators: str | None = typer.Option(None, "--operators", help=_OPERATORS_HELP),
    calls: int = typer.Option(3, "--calls", help="device calls available"),
    minutes: float = typer.Option(8.0, "--minutes", help="minutes per call"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """The time plan: trials, kernels, compile and GPU time, and what each call sweeps."""
    from pipetune.workers.campaign.operators import DEFAULT_OPERATORS, resolve_operators
    from pipetune.workers.campaign.plan import plan_document
    from pipetune.workers.campaign.run import minutes_problem

    if calls < 1:
        raise CliError(f"--calls: must be at least 1, got {calls}", 2)
    if problem := minutes_problem(minutes):
        raise CliError(f"--minutes: {problem}", 2)
    try:
        chosen = resolve_operators(DEFAULT_OPERATORS if operators is None else operators)
    except ValueError as exc:
        raise CliError(f"--operators: {exc}", 2) from None
    spec = get_gpu(gpu, calibrated=False)
    _check_runnable(chosen, spec, f"--gpu {gpu}")
    document = plan_document(spec, chosen, calls=calls, minutes=minutes)
    if as_json:
        print_json(document)
        return
    table = Table(title=f"campaign plan on {document['gpu']} (model times, assumed GPU costs)")
    for col in ("operator", "variant", "trials", "model kernel s", "GPU s (5..10 repeats)"):
        table.add_column(col, justify="left" if col in ("operator", "variant") else "right")
    for row in document["operators"]:
        table.add_row(
            row["operator"],
            row["variant"],
            f"{row['trials']:,}",
            f"{row['model_kernel_s']:.2f}",
            f"{row['gpu_s_low']:.0f}..{row['gpu_s_high']:.0f}",
        )
    console.print(table)
    console.print(
        f"{document['trials']:,} trials, {document['distinct_kernels']:,} distinct kernels "
        f"(compile {document['compile_s_all_kernels']:.0f} s on "
        f"{document['costs']['compile_threads']} threads), GPU "
        f"{document['gpu_s_low']:.0f}..{document['gpu_s_high']:.0f} s"
    )
    for call in document["calls"]:
        ops = ", ".join(
            f"{s['operator']}[{s['trials'][0]}:{s['trials'][1]}]" for s in call["sweeps"]
        )
        console.print(
            f"call {call['call']}: phases {call['phases_s']:.0f} s, compiles "
            f"{call['compiled_kernels']:,} kernels, ends at {call['end_s']:.0f} of "
            f"{call['budget_s']:.0f} s: {ops}"
        )
    console.print("fits" if document["fits"] else f"does not fit: left {document['left']}")


@campaign_app.command("unpack")
@reported
def campaign_unpack(
    archive: Path = typer.Argument(..., help="the archive a campaign packed (--pack)"),
    data_dir: Path = typer.Option(
        Path("benchmarks/data"), "--data-dir", help="datasets go to DATA_DIR/<gpu>/"
    ),
    profile_dir: Path | None = typer.Option(
        None,
        "--profile-dir",
        help="the profile goes to PROFILE_DIR/<gpu>.json (default: your profile folder, "
        "$PIPETUNE_PROFILE_DIR or the user data dir's profiles/, which the model reads first; "
        "the project's checkout commits campaigns' profiles with --profile-dir model/profiles)",
    ),
    allow_simulated: bool = typer.Option(
        False, "--allow-simulated", help="unpack a simulated campaign too (for trying it out)"
    ),
    force: bool = typer.Option(False, "--force", help="overwrite existing files"),
) -> None:
    """Turn a campaign archive into DATA_DIR/<gpu>/ and a hardware profile <gpu>.json that
    the model applies."""
    from pipetune.model.hardware import user_profile_dir
    from pipetune.workers.campaign.unpack import UnpackError, unpack

    check_tar_archive(archive, "ARCHIVE")
    check_output_dir(data_dir, "--data-dir")
    if profile_dir is None:
        check_output_dir(user_profile_dir(), "--profile-dir (default)")
    else:
        check_output_dir(profile_dir, "--profile-dir")
    try:
        result = unpack(
            archive, data_dir, profile_dir, allow_simulated=allow_simulated, force=force
        )
    except UnpackError as exc:
        raise CliError(str(exc), 2) from None
    for path in [*result.datasets, *result.documents]:
        print(path)
    if result.profile is not None:
        print(result.profile)
    if result.profile_left_out is not None:
        print(f"profile not written: {result.profile_left_out}", file=sys.stderr)
    print(
        f"unpacked {len(result.datasets)} datasets of {result.gpu} ({result.runner})"
        + (
            f"; parts of unfinished operators kept: {len(result.parts)}, in "
            f"{result.parts[0].parent} (a call with --have {data_dir / result.gpu} goes on "
            "from them)"
            if result.parts
            else ""
        ),
        file=sys.stderr,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(campaign_app, name="campaign")
