"""Commands that talk to a pipetune service through the SDK (clients.sdk):

    pipetune schedule gemm --m 1024 --n 64 --k 2048 --gpu h100 [--json]
    pipetune tune gemm --m 1024 --n 64 --k 2048 --gpu h100 --budget 50 --wait [--json]
    pipetune tasks [--state running] [--json]
    pipetune curve TASK_ID [--png FILE] [--html FILE] [--json]
    pipetune tune-model bert-base|gpt2|llama2-7b|llama2-70b|resnet50 --batch B --seq S --gpu h100

Each takes --server (env PIPETUNE_SERVER) and --api-key (env PIPETUNE_API_KEY). Bad input
exits 2 before anything is sent; see clients.cli.remote for the service's errors.
`schedule`, `tasks` and `curve` only read: without a server they read the local database
(--db, default the one `pipetune serve` uses), e.g. after `pipetune.tune(...)` in Python.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipetune.clients.cli.curve_files import (
    check_curve_outputs,
    curve_title,
    write_curve_html,
    write_curve_png,
)
from pipetune.clients.cli.errors import CliError, interrupted, reported, sigterm_interrupts
from pipetune.clients.cli.output import (
    console,
    format_rate,
    print_json,
    rate_figure,
    stderr_console,
)
from pipetune.clients.cli.paths import output_file
from pipetune.clients.cli.progress_lines import ProgressLines
from pipetune.clients.cli.remote import (
    answered_by,
    api_key_option,
    cli_error,
    client,
    connection_parameters,
    db_option,
    read_server_option,
    reader,
    reader_parameters,
    server_option,
    service_errors,
)
from pipetune.clients.cli.wait_notes import WaitNotes, waiting_words
from pipetune.clients.cli.workload_options import add_workload_commands, option
from pipetune.clients.library.labels import (
    SIMULATED_LABEL,
    any_simulated,
    is_simulated,
    older_kernel_label,
    runs_whole_space,
    trials_of,
    trials_to_run,
)
from pipetune.clients.sdk.errors import TRANSIENT, PipetuneError, ServiceUnavailableError
from pipetune.clients.sdk.http import shown_url
from pipetune.model.family import parse_any_workload
from pipetune.model.hardware import DEFAULT_GPU, HardwareError, get_gpu, gpu_keys, resolve_gpu_key
from pipetune.model.hopper.space import ARCH as HOPPER_ARCH
from pipetune.model.trials import RunnerKind
from pipetune.model.wire import (
    DEFAULT_PRIORITY,
    DEFAULT_STRATEGY,
    ID_MAX,
    MAX_BATCH_SIZE,
    MAX_BUDGET,
    MAX_PRIORITY,
    MAX_SECONDS,
    MAX_TASK_PAGE,
    TASK_PAGE,
    ScheduleDoc,
    StrategyName,
    TaskDoc,
)
from pipetune.model.workloads import DTYPES, WorkloadError

STRATEGIES: tuple[str, ...] = typing.get_args(StrategyName)
# Progress goes to stderr so that --json documents on stdout stay machine-readable.

schedule_app = typer.Typer(help="The best known schedule of a workload (measured, else model).")
tune_app = typer.Typer(help="Start a tuning task for a workload on the service's GPU workers.")

_GPU = option("gpu", str, DEFAULT_GPU, help=f"GPU: {', '.join(gpu_keys())}")
_JSON = option("as_json", bool, False, "--json", help="print one JSON document")

# tune-model's options by the name pipetune.model.networks.network gives its argument in a
# WorkloadError: an error names what the user typed.
NETWORK_OPTIONS = {
    "network": "NETWORK",
    "batch": "--batch",
    "seq": "--seq",
    "batch/seq": "--batch/--seq",
    "decode": "--decode",
    "fuse_swiglu": "--fuse-swiglu",
    "fuse_bias_gelu": "--fuse-bias-gelu",
    "dtype": "--dtype",
}


# ---- helpers ---------------------------------------------------------------------------


def _check_gpu(gpu: str) -> str:
    return resolve_gpu_key(gpu)  # HardwareError: exit 2 with the known GPUs


def _check_tuning(
    budget: int, strategy: str, batch_size: int | None = None, priority: int = DEFAULT_PRIORITY
) -> None:
    if not 1 <= budget <= MAX_BUDGET:
        raise CliError(f"--budget: must be within 1..{MAX_BUDGET}, got {budget}", 2)
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise CliError(f"--batch-size: must be within 1..{MAX_BATCH_SIZE}, got {batch_size}", 2)
    if not 1 <= priority <= MAX_PRIORITY:
        raise CliError(f"--priority: must be within 1..{MAX_PRIORITY}, got {priority}", 2)
    if strategy not in STRATEGIES:
        raise CliError(f"--strategy: unknown {strategy!r}; known: {', '.join(STRATEGIES)}", 2)


# The shortest --poll: each look is a request to the service (a task's document, or every
# task's for tune-model), and 1e-9 s sent them one after another, a busy loop on both sides.
MIN_POLL_S = 0.1


def _check_poll(poll: float) -> None:
    """--poll before anything is sent: a task created and then left behind by a crash on
    its first wait is the worst time to find out (0 would poll without a pause, and a pause
    longer than MAX_SECONDS overflows the sleep)."""
    if not (math.isfinite(poll) and poll > 0):
        raise CliError(f"--poll: must be a positive number of seconds, got {poll:g}", 2)
    if poll < MIN_POLL_S:
        raise CliError(
            f"--poll: at least {MIN_POLL_S:g} s (each look is a request to the service), "
            f"got {poll:g}",
            2,
        )
    if poll > MAX_SECONDS:
        raise CliError(f"--poll: at most {MAX_SECONDS:g} s (a week), got {poll:g}", 2)


def dashboard_url(server: str) -> str:
    return f"{shown_url(server).rstrip('/')}/dashboard"


def _schedule_rows(schedule: ScheduleDoc, workload: dict[str, Any]) -> list[tuple[str, str]]:
    """The schedule's id and its family's one-cell summary (a GEMM tile, warps and pipeline
    depths; a memory-intensive operator's thread mapping). A schedule of a family, or with a
    knob value, that a newer service added and this client does not know: its knobs as sent."""
    try:
        family = schedule.family
        schedule_id = schedule.to_schedule().id
    except ValueError:
        return [("schedule", ", ".join(f"{k}={v}" for k, v in schedule.knobs().items()))]
    try:
        parsed = parse_any_workload(workload)
    except ValueError:
        parsed = None
    return [
        ("schedule", schedule_id),
        (family.schedule_heading, family.schedule_label(schedule.knobs(), parsed)),
    ]


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _label(workload: dict[str, Any]) -> str:
    try:
        return parse_any_workload(workload).label()
    except ValueError:
        return str(workload)


# ---- schedule --------------------------------------------------------------------------


def _schedule(
    workload: dict,
    gpu: str,
    as_json: bool,
    server: str | None,
    api_key: str | None,
    db: str | None,
) -> None:
    w = parse_any_workload(workload)
    gpu = _check_gpu(gpu)
    with service_errors(), reader(server, api_key, db) as c:
        doc = c.best_schedule(w, gpu)
        where = "" if server else f" ({answered_by(server, c)})"
    if as_json:
        print_json(doc.model_dump(mode="json"))
        return
    simulated = doc.source == "measured" and is_simulated(doc.runner)
    untuned = "no trial succeeded" if doc.failed_trials else "not tuned yet"
    if doc.source == "model" and doc.learned_from:
        source = f"cost model learned from {_tasks(doc.learned_from)} ({untuned})"
    elif doc.source == "model":
        source = f"analytical model ({untuned})"
    elif simulated:
        source = f"simulated trials ({SIMULATED_LABEL.removeprefix('simulated: ')})"
    elif doc.source == "measured":
        source = "measured trials"
    else:  # a source a newer service added: said as it is, not as measured trials
        source = f"service's {doc.source!r} source"
    console.print(f"{w.label()} on {doc.gpu}: best schedule, from the {source}{where}")
    if doc.source == "measured" and (
        older := older_kernel_label(w, doc.measured_generator_revision)
    ):
        console.print(f"note: the µs below is an older kernel's: {older}", soft_wrap=True)
    if doc.failed_trials:
        failed = "1 trial" if doc.failed_trials == 1 else f"{doc.failed_trials} trials"
        console.print(f"{failed} failed on {doc.gpu}: their schedules are not picked")
    table = Table(show_header=False)
    table.add_column("key")
    table.add_column("value")
    rows = [
        *_schedule_rows(doc.schedule, doc.workload),
        ("simulated µs" if simulated else "measured µs", _fmt(doc.latency_us)),
        ("predicted µs", _fmt(doc.predicted_us)),
        ("throughput", format_rate(doc.throughput, doc.throughput_unit)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


add_workload_commands(
    schedule_app,
    _schedule,
    [_GPU, _JSON, *reader_parameters()],
    "Best known schedule of:",
)


# ---- tune ------------------------------------------------------------------------------


@contextmanager
def task_progress(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr_console,
    ) as bar:
        yield bar


def _best_words(best: Any) -> str:
    """The best throughput so far, said to be simulated where it is (the progress shown
    while a task runs was the only figure without the label)."""
    words = f"best {format_rate(best.throughput, best.throughput_unit)}"
    return words + " (simulated)" if is_simulated(best.runner) else words


def _progress_line(doc: TaskDoc) -> str:
    best = f", {_best_words(doc.best)}" if doc.best else ""
    return f"task {doc.id} {doc.state}, {doc.trials_done}/{trials_to_run(doc)} trials{best}"


def wait_for_task(c: Any, task: TaskDoc, show: bool, poll_s: float) -> TaskDoc:
    """Client.wait with a progress bar of trials done out of the budget on a terminal; into
    a log, a line when the task moves (ProgressLines) and at its end; without either
    (`--json`), only why the task waits, where it does, on stderr."""
    notes = WaitNotes(stderr_console)
    lines = ProgressLines(stderr_console) if show and not stderr_console.is_terminal else None
    with task_progress(show and lines is None) as bar:
        handle = bar.add_task(f"task {task.id}", total=trials_to_run(task)) if bar else None

        def update(doc: TaskDoc) -> None:
            if bar is None or handle is None:
                notes.see([doc])
                if lines is not None:
                    final = doc.is_finished()  # (a newer service's state: not)
                    lines.see((doc.trials_done, final), _progress_line(doc), final)
                return
            best = _best_words(doc.best) if doc.best else "no result yet"
            # Why it does not move, where no live worker can take its trials (a task for a
            # GPU no worker has waited with "no result yet" and nothing else).
            best += waiting_words([doc])
            total = doc.trials_done if doc.state in ("done",) else trials_to_run(doc)
            bar.update(
                handle,
                completed=doc.trials_done,
                total=max(total, 1),
                description=f"task {doc.id} {doc.state}: {best}",
            )

        return c.wait(task.id, progress=update, poll_s=poll_s)


def strategy_label(doc: TaskDoc) -> str:
    """The strategy column (as the dashboard's): a warm start names its prior task; a
    dataset imported as a task was not tuned here; a priority above 1 is said."""
    return _with_priority(_search_label(doc), doc)


def _with_priority(label: str, doc: TaskDoc) -> str:
    """`label`, and the task's priority where it is above the default (a share of its GPU's
    workers that a reader of a task's line should know of)."""
    return f"{label}, priority {doc.priority}" if doc.priority > DEFAULT_PRIORITY else label


def _search_label(doc: TaskDoc) -> str:
    if doc.imported_from is not None:
        return "imported dataset"
    if doc.prior_task is not None:
        return f"{doc.strategy} (prior: task {doc.prior_task})"
    if doc.learned_from is not None:
        return f"{doc.strategy} (prior: learned from {_tasks(doc.learned_from)})"
    return doc.strategy


def _tasks(ids: list[int]) -> str:
    return f"task {ids[0]}" if len(ids) == 1 else f"{len(ids)} tasks"


def print_task(doc: TaskDoc, server: str) -> None:
    title = (
        f"task {doc.id}: {_label(doc.workload)} on {doc.gpu}, {_with_priority(doc.strategy, doc)}, "
        f"{trials_of(doc)} trials ({doc.trials_failed} failed), {doc.state}"
    )
    if doc.prior_task is not None:
        title += f", warm-started from task {doc.prior_task}"
    if doc.learned_from is not None:
        title += f", prior learned from {_tasks(doc.learned_from)}"
    if doc.imported_from is not None:
        title += f", imported from {doc.imported_from}"
    console.print(title)
    if doc.best is None:
        console.print("no successful trial" + (f": {doc.error}" if doc.error else ""))
    else:
        simulated = is_simulated(doc.best.runner)
        table = Table(show_header=False)
        table.add_column("key")
        table.add_column("value")
        for key, value in (
            # (Trials are numbered from 0, as the API and the dashboard number them.)
            ("best trial", f"{doc.best.trial} (numbered from 0)"),
            *_schedule_rows(doc.best.schedule, doc.workload),
            ("simulated µs" if simulated else "latency µs", f"{doc.best.latency_us:.2f}"),
            ("throughput", format_rate(doc.best.throughput, doc.best.throughput_unit)),
        ):
            table.add_row(key, value)
        console.print(table)
        if simulated:
            console.print(f"runner {SIMULATED_LABEL}")
    console.print(f"dashboard: {dashboard_url(server)}")


def _curve_command(task_id: int, server: str) -> str:
    """The command that shows a task's curve at `server` (without --server, `curve` read the
    local database, and showed another task of the same number there, or none)."""
    return f"`pipetune curve {task_id} --server {shown_url(server)}`"


def _say_created(
    task: TaskDoc, w: Any, gpu: str, budget: int, strategy: str, server: str, as_json: bool
) -> None:
    """What `pipetune tune` without --wait says of the task it created."""
    if as_json:
        print_json(task.model_dump(mode="json"))
        return
    # The strategy as the task runs it: its prior, which the service chose where the request
    # left it out (a learned one, or prior_gpu's task), said.
    console.print(
        f"task {task.id} {task.state}: {w.label()} on {gpu}, budget {budget}, "
        f"{strategy_label(task)}; see its progress with {_curve_command(task.id, server)} or "
        f"{dashboard_url(server)}"
    )
    if task.no_worker:
        stderr_console.print(f"warning: task {task.id} waits: {task.no_worker}")


def _tune(
    workload: dict,
    gpu: str,
    budget: int,
    strategy: str,
    seed: int,
    prior_task: int | None,
    prior_gpu: str | None,
    learned_prior: bool | None,
    batch_size: int | None,
    runner: str | None,
    priority: int,
    wait: bool,
    poll: float,
    as_json: bool,
    server: str,
    api_key: str | None,
) -> None:
    w = parse_any_workload(workload)
    gpu = _check_gpu(gpu)
    _check_tuning(budget, strategy, batch_size, priority)
    _check_poll(poll)
    kinds = [k.value for k in RunnerKind]
    if runner is not None and runner not in kinds:
        raise CliError(f"--runner: must be one of {', '.join(kinds)}, got {runner!r}", 2)
    # From the request on: a SIGTERM (or Ctrl-C) while it was on its way ended the command
    # without a word, though the service may have created the task. The message is said
    # inside sigterm_interrupts, where a second signal cannot cut it off.
    with service_errors(), client(server, api_key) as c, sigterm_interrupts():
        task: TaskDoc | None = None
        try:
            task = c.tune(
                w.canonical(),
                gpu,
                budget=budget,
                strategy=strategy,  # type: ignore[arg-type]
                seed=seed,
                prior_task=prior_task,
                prior_gpu=prior_gpu,
                learned_prior=learned_prior,
                batch_size=batch_size,
                runner=runner,
                priority=priority,
            )
            if not wait:
                _say_created(task, w, gpu, budget, strategy, server, as_json)
                return
            final = wait_for_task(c, task, show=not as_json, poll_s=poll)
        except KeyboardInterrupt as exc:
            # The task is the service's: it goes on without this command (said, where the
            # command used to end without a word; on SIGTERM too, a CI job's time limit).
            what, code = interrupted(exc)
            if task is None:
                stderr_console.print(
                    f"{what} before the service answered: {_maybe_created(server)}"
                )
            else:
                stderr_console.print(f"{what}: {_goes_on(task.id, server)}")
            raise typer.Exit(code) from None
        except PipetuneError as exc:
            # The answer lost (a proxy's timeout, a connection cut) or the wait given up: the
            # task may exist, or does and goes on. Said as on a signal; the line named neither,
            # and a script that ran the command again made a second task.
            if task is not None:
                note = _goes_on(task.id, server)
            elif isinstance(exc, ServiceUnavailableError) and exc.maybe_acted:
                note = _maybe_created(server)
            else:
                raise
            error = cli_error(exc)
            raise CliError(f"{error}; {note}", error.code) from None
    if as_json:
        print_json(final.model_dump(mode="json"))
    else:
        print_task(final, server)
    if final.state != "done":
        raise CliError(
            f"task {final.id} {final.state}" + (f": {final.error}" if final.error else "")
        )
    if final.best is None:  # (a script's `tune --wait && ...` carried on)
        trials = final.trials_done
        raise CliError(f"task {final.id} done, but none of its {trials} trials succeeded")


def _maybe_created(server: str) -> str:
    return (
        f"it may have created the task; `pipetune tasks --server {shown_url(server)} --limit 5` "
        "lists the newest"
    )


def _goes_on(task_id: int, server: str) -> str:
    return (
        f"task {task_id} goes on at the service; see its progress with "
        f"{_curve_command(task_id, server)}, or cancel it with DELETE "
        f"{shown_url(server)}/v1/tasks/{task_id}"
    )


add_workload_commands(
    tune_app,
    _tune,
    [
        _GPU,
        option("budget", int, 50, help=f"trials to measure (1..{MAX_BUDGET})"),
        option("strategy", str, DEFAULT_STRATEGY, help=f"one of {', '.join(STRATEGIES)}"),
        option("seed", int, 0, help="the tuner's seed"),
        option(
            "prior_task",
            int | None,  # type: ignore[arg-type]
            None,
            help="a finished task of the same workload on another GPU, or of its twin in the "
            "other element type (float16, bfloat16) on any GPU: its trials warm-start the search",
        ),
        option(
            "prior_gpu",
            str | None,  # type: ignore[arg-type]
            None,
            help="instead of --prior-task: the finished task of the workload on this GPU of the "
            "newest generator revision, with the most successful trials of those",
        ),
        option(
            "learned_prior",
            bool | None,  # type: ignore[arg-type]
            None,
            "--learned-prior/--no-learned-prior",
            help="instead of --prior-task: a cost model of every finished task of the kernel "
            "family measured on a GPU (other shapes, other GPUs) is the prior (default: the "
            "family's choice: tensor-core GEMMs and memory-intensive operators learn where such "
            "tasks of 8 or more shapes exist)",
        ),
        option(
            "batch_size",
            int | None,  # type: ignore[arg-type]
            None,
            help=f"trials per proposal round (1..{MAX_BATCH_SIZE}; default: the service's, "
            "8 unless PIPETUNE_BATCH_SIZE says otherwise); 1 where one GPU serves the task: "
            "each proposal then sees every result before it",
        ),
        option(
            "runner",
            str | None,  # type: ignore[arg-type]
            None,
            help="only workers of this runner measure the task (cupy: GPU measurements only; "
            "default: any worker of the GPU)",
        ),
        option(
            "priority",
            int,
            DEFAULT_PRIORITY,
            help="the task's share of its GPU's workers while other tasks wait for them too "
            f"(1..{MAX_PRIORITY}: p trials to a priority-1 task's one; default 1)",
        ),
        option("wait", bool, False, "--wait", help="follow the task to its end"),
        option("poll", float, 1.0, "--poll", help="seconds between checks with --wait"),
        _JSON,
        *connection_parameters(),
    ],
    "Tune:",
)


# ---- tasks -----------------------------------------------------------------------------


@reported
def tasks(
    state: str | None = typer.Option(None, "--state", help="queued|running|done|failed|cancelled"),
    limit: int = typer.Option(
        TASK_PAGE, "--limit", help=f"tasks to list, newest first (1..{MAX_TASK_PAGE})"
    ),
    offset: int = typer.Option(0, "--offset", help="skip this many of the newest first"),
    before: int | None = typer.Option(
        None, "--before", help="only tasks with ids below this one (the next page's cursor)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    server: str | None = read_server_option(),
    api_key: str | None = api_key_option(),
    db: str | None = db_option(),
) -> None:
    """Tuning tasks, newest first (the service's, or the local database's without one)."""
    if not 1 <= limit <= MAX_TASK_PAGE:
        raise CliError(f"--limit: must be within 1..{MAX_TASK_PAGE}, got {limit}", 2)
    if offset < 0:
        raise CliError(f"--offset: must be at least 0, got {offset}", 2)
    if before is not None and not 1 <= before <= ID_MAX:
        raise CliError(f"--before: must be within 1..{ID_MAX}, got {before}", 2)
    with service_errors(), reader(server, api_key, db) as c:
        docs = c.tasks(state=state, limit=limit, offset=offset, before=before)
        where = answered_by(server, c)
    # A full page may not be all: said, where the list was silently the newest 100.
    more = len(docs) == limit
    if as_json:
        doc = {"tasks": [d.model_dump(mode="json") for d in docs], "limit": limit}
        print_json({**doc, "offset": offset, "before": before, "more": more})
        return
    table = Table(title=f"tasks at {where}")
    for col in ("id", "state", "workload", "gpu", "strategy", "trials", "failed"):
        table.add_column(col, justify="right" if col in ("id", "trials", "failed") else None)
    for col in ("best µs", "throughput", "runner", "updated (UTC)"):
        table.add_column(col, justify="right")
    for d in docs:
        table.add_row(
            str(d.id),
            d.state,
            _label(d.workload),
            d.gpu,
            strategy_label(d),
            f"{d.trials_done}/{d.trials_target}*"
            if runs_whole_space(d)
            else f"{d.trials_done}/{d.budget}",
            str(d.trials_failed),
            _fmt(d.best.latency_us if d.best else None),
            format_rate(d.best.throughput, d.best.throughput_unit) if d.best else "-",
            (d.best.runner if d.best else None) or "-",
            d.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)
    if any(runs_whole_space(d) for d in docs):
        console.print("*: the task's whole space, smaller than its budget")
    if more:
        console.print(
            f"{limit} tasks, newest first; there may be more: --before {docs[-1].id} for the "
            "next ones"
        )
    for d in docs:  # a task nobody can take says why, where its row says only "queued"
        if d.no_worker:
            console.print(f"task {d.id} waits: {d.no_worker}")
    if not docs:
        console.print("no tasks")
    elif any_simulated(d.best.runner for d in docs if d.best):
        console.print(f"runner simulated: best µs and throughput are {SIMULATED_LABEL}")


# ---- curve -----------------------------------------------------------------------------

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = hi - lo or 1.0
    return "".join(
        " " if v is None else SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))]
        for v in values
    )


def milestones(n: int) -> list[int]:
    """Trial counts worth a table row: 1, 2, 5, 10, 20, 50, ... and the last."""
    ks, base = [], 1
    while base <= n:
        ks += [k for k in (base, 2 * base, 5 * base) if k <= n]
        base *= 10
    if n and n not in ks:
        ks.append(n)
    return ks


@reported
def curve(
    task_id: int = typer.Argument(..., help="the task's id"),
    png: Path | None = typer.Option(
        None,
        "--png",
        parser=output_file,
        help="write the curve as a PNG image (matplotlib: the `plot` extra)",
    ),
    html: Path | None = typer.Option(
        None,
        "--html",
        parser=output_file,
        help="write an interactive plotly page (self-contained, no CDN)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the curve as JSON"),
    server: str | None = read_server_option(),
    api_key: str | None = api_key_option(),
    db: str | None = db_option(),
) -> None:
    """A task's best-so-far curve: the best throughput (TFLOP/s, GB/s for memory-intensive
    operators) found after each trial."""
    check_curve_outputs(png, html)  # before anything is fetched
    with service_errors(), reader(server, api_key, db) as c:
        task = c.task(task_id)
        doc = c.curve(task_id)
        trials = c.all_trials(task_id)
    simulated = any_simulated(t.runner for t in trials)
    if as_json:
        print_json(doc.model_dump(mode="json"))
    if png is not None:
        write_curve_png(png, task, doc, simulated)
        stderr_console.print(f"wrote {png}")
    if html is not None:
        write_curve_html(html, task, doc, simulated)
        stderr_console.print(f"wrote {html}")
    if as_json or png is not None or html is not None:
        return
    console.print(curve_title(task) + f", {task.state}")
    if simulated:
        console.print(f"trials from the {SIMULATED_LABEL.replace(':', ' runner:', 1)}")
    if not doc.points:
        console.print("no trials yet")
        return
    unit = doc.throughput_unit
    console.print(f"best {unit}  {sparkline([p.best_throughput for p in doc.points])}")
    table = Table()
    for col in ("trials", "best µs", f"best {unit}"):
        table.add_column(col, justify="right")
    for k in milestones(len(doc.points)):
        p = doc.points[k - 1]
        table.add_row(str(k), _fmt(p.best_latency_us), rate_figure(p.best_throughput, unit))
    console.print(table)


# ---- tune-model ------------------------------------------------------------------------


def _interrupted_tune_model(exc: KeyboardInterrupt, started: list[TaskDoc], server: str) -> None:
    """Ctrl-C or SIGTERM in tune-model: the tasks created are the service's and go on without
    this command (said, where it used to end without a word, and a second run queued every
    shape again); exit 130 or 143."""
    what, code = interrupted(exc)
    if started:
        ids = ", ".join(str(t.id) for t in started)
        stderr_console.print(
            f"{what}: tasks {ids} go on at the service; follow them again by running this "
            f"command with --resume, or cancel each with DELETE {shown_url(server)}/v1/tasks/ID"
        )
    else:
        stderr_console.print(f"{what}: no task was created")
    raise typer.Exit(code) from None


@reported
def tune_model(
    network: str = typer.Argument(..., help="bert-base, gpt2, llama2-7b, llama2-70b or resnet50"),
    batch: int | None = typer.Option(None, "--batch", help="batch (default 1; resnet50: 64)"),
    seq: int | None = typer.Option(
        None,
        "--seq",
        help="sequence length (default / most: bert-base 512 / 512, gpt2 1024 / 1024, "
        "llama2-7b and llama2-70b 2048 / 4096); with --decode, the context",
    ),
    decode: bool = typer.Option(
        False,
        "--decode",
        help="one decode step instead of the whole sequence (gpt2, llama2-7b, llama2-70b): "
        "each of the batch's sequences adds one token, which attends to --seq cached "
        "positions, its own included",
    ),
    fuse_swiglu: bool = typer.Option(
        False,
        "--fuse-swiglu",
        help="llama2-7b, llama2-70b: the gate+up GEMM with the SwiGLU in its epilogue "
        "(gemm_swiglu, one kernel; its weights interleaved by pipetune.interleave_gate_up) "
        "instead of the GEMM and the silu_mul kernel",
    ),
    fuse_bias_gelu: bool = typer.Option(
        False,
        "--fuse-bias-gelu",
        help="bert-base, gpt2: FC1 with its bias and GELU in its epilogue (gemm_bias_gelu, one "
        "kernel) instead of the GEMM and the bias_gelu kernel",
    ),
    dtype: str = typer.Option(
        "float16",
        "--dtype",
        help="every operator's element type: float16 or bfloat16",
    ),
    gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help=f"GPU: {', '.join(gpu_keys())}"),
    budget: int = typer.Option(16, "--budget", help="trials per distinct layer shape"),
    strategy: str = typer.Option(DEFAULT_STRATEGY, "--strategy", help=", ".join(STRATEGIES)),
    seed: int = typer.Option(0, "--seed", help="the tuner's seed"),
    prior_gpu: str | None = typer.Option(
        None,
        "--prior-gpu",
        help="warm-start each shape from its best-measured finished task on this GPU (not "
        "--gpu; a strategy that takes a prior; a task measured on a GPU first, then a "
        "simulated one); a shape without one there starts cold",
    ),
    learned_prior: bool | None = typer.Option(
        None,
        "--learned-prior/--no-learned-prior",
        help="instead of --prior-gpu: each shape's prior is a cost model of the measured "
        "tasks of its kernel family (other shapes, other GPUs), where there are any (default: "
        "each family's choice: tensor-core GEMMs and memory-intensive operators learn where "
        "measured tasks of 8 or more shapes exist)",
    ),
    batch_size: int | None = typer.Option(
        None,
        "--batch-size",
        help=f"each shape's trials per proposal round (1..{MAX_BATCH_SIZE}; default: the "
        "service's, 8 unless PIPETUNE_BATCH_SIZE says otherwise); small where few GPUs serve "
        "the network's tasks",
    ),
    priority: int = typer.Option(
        DEFAULT_PRIORITY,
        "--priority",
        help=f"each shape's share of the GPU's workers while other tasks wait for them too "
        f"(1..{MAX_PRIORITY}: p trials to a priority-1 task's one)",
    ),
    wgmma: bool = typer.Option(
        False,
        "--wgmma",
        help="the GEMMs and BMMs on the Hopper warpgroup-MMA family (hopper_gemm, hopper_bmm, "
        "and the fused hopper_gemm_swiglu and hopper_gemm_bias_gelu; H100 and H200) instead of "
        "the mma.sync family",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="follow the tasks an earlier run of this command left at the service (the same "
        "shape, --gpu, --strategy, --budget, --seed and prior; queued, running or done) instead of "
        "queuing those shapes again; the others are queued",
    ),
    poll: float = typer.Option(1.0, "--poll", help="seconds between checks"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    server: str = server_option(),
    api_key: str | None = api_key_option(),
) -> None:
    """Tune every distinct operator of a network (its GEMMs, BMMs and convolutions, and its
    softmax, norms and bias+GELU); report each one's tuned latency against its family's
    baseline (non-pipelined; one row per block), each family's share of the network's time
    and the end-to-end speedup (ALCOP Table 3's view)."""
    from pipetune.clients import tune_model as tm
    from pipetune.model.networks import network as build_network

    gpu = _check_gpu(gpu)
    _check_tuning(budget, strategy, batch_size, priority)
    _check_poll(poll)
    if network == "resnet50" and seq is not None:
        raise CliError("--seq: resnet50 takes images (224x224), not sequences", 2)
    if learned_prior and prior_gpu is not None:
        raise CliError("--learned-prior: give --prior-gpu or --learned-prior, not both", 2)
    if prior_gpu is not None:
        # Every shape's task would be refused alike: refused here, before any is created.
        problem = tm.prior_gpu_problem(prior_gpu, gpu, strategy)
        if problem:
            raise CliError(f"--prior-gpu: {problem}", 2)
        try:
            prior_gpu = resolve_gpu_key(prior_gpu)
        except HardwareError as exc:
            raise CliError(f"--prior-gpu: {exc}", 2) from None
    if dtype not in DTYPES:
        raise CliError(f"--dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}", 2)
    try:
        net = build_network(network, batch, seq, decode, fuse_swiglu, dtype, fuse_bias_gelu)
    except WorkloadError as exc:  # named as the command line names it, not as the function
        raise CliError(f"{NETWORK_OPTIONS.get(exc.field, exc.field)}: {exc.reason}", 2) from None
    if wgmma:
        if get_gpu(gpu).arch != HOPPER_ARCH:
            raise CliError(f"--wgmma: the Hopper wgmma family runs on H100 and H200, not {gpu}", 2)
        net = net.on_hopper()
    shapes = net.distinct()
    with service_errors(), client(server, api_key) as c:
        resumed = (
            tm.resumable_tasks(
                c, shapes, gpu, budget, strategy, seed, batch_size, prior_gpu, learned_prior
            )
            if resume
            else {}
        )
        if resume:
            ids = ", ".join(str(t.id) for t in resumed.values())
            stderr_console.print(
                f"resuming {len(resumed)} of {len(shapes)} shapes"
                + (f" (tasks {ids})" if resumed else "")
                + (f"; queuing {len(shapes) - len(resumed)}" if len(resumed) < len(shapes) else "")
            )
        # Filled as each task is created: a signal while they are queued says which exist
        # (it ended without a word, the tasks running on).
        started: list[TaskDoc] = []
        cold: list[str] = []
        with sigterm_interrupts():
            try:
                tm.launch(
                    c,
                    shapes,
                    gpu,
                    budget,
                    strategy,  # type: ignore[arg-type]
                    seed,
                    prior_gpu,
                    learned_prior,
                    batch_size,
                    resumed,
                    priority,
                    started=started,
                    cold=cold,
                )
            except KeyboardInterrupt as exc:
                _interrupted_tune_model(exc, started, server)
        if cold:
            # (A prior asked for and given to none, or to some: it said nothing, exit 0.)
            asked = "--prior-gpu" if prior_gpu is not None else "--learned-prior"
            stderr_console.print(
                f"note: {asked}: {len(cold)} of {len(shapes) - len(resumed)} shapes start cold: "
                + "; ".join(cold)
            )
        log = not as_json and not stderr_console.is_terminal
        lines = ProgressLines(stderr_console) if log else None
        with task_progress(not as_json and not log) as bar:
            total = sum(trials_to_run(t) for t in started)
            handle = bar.add_task(f"{net.name}: {len(shapes)} shapes", total=total) if bar else None

            notes = WaitNotes(stderr_console)

            def update(docs: list[TaskDoc]) -> None:
                # Why the shapes do not move, where no worker can take their trials (a GPU no
                # worker serves showed "0/9 shapes tuned" and nothing else until killed).
                if bar is None or handle is None:
                    notes.see(docs)
                    if lines is not None:
                        finished = sum(d.is_finished() for d in docs)
                        done = sum(d.trials_done for d in docs)
                        lines.see(
                            (done, finished),
                            f"{net.name}: {finished}/{len(docs)} shapes tuned, "
                            f"{done}/{sum(trials_to_run(d) for d in docs)} trials",
                            finished == len(docs),
                        )
                    return
                finished = sum(d.is_finished() for d in docs)
                bar.update(
                    handle,
                    completed=sum(d.trials_done for d in docs),
                    description=f"{net.name}: {finished}/{len(docs)} shapes tuned"
                    + waiting_words(docs),
                )

            # The message is said inside sigterm_interrupts: a second signal cannot cut it off.
            with sigterm_interrupts():
                try:
                    finals = tm.wait_all(c, started, update, poll_s=poll)
                except TRANSIENT:
                    # Unreachable for longer than a restart takes: the error says why, and this
                    # what became of the tasks.
                    ids = ", ".join(str(t.id) for t in started)
                    stderr_console.print(
                        f"tasks {ids} go on at the service if it comes back; follow them again "
                        "by running this command with --resume"
                    )
                    raise
                except KeyboardInterrupt as exc:
                    _interrupted_tune_model(exc, started, server)
        results = tm.collect(c, shapes, finals, gpu, poll_s=poll)
    doc = tm.document(net, gpu, budget, strategy, results)
    if as_json:
        print_json(doc)
    else:
        _print_model_report(doc)
    if problem := tm.unfinished_problem(doc):
        raise CliError(problem)


def _print_model_report(doc: dict[str, Any]) -> None:
    from pipetune.clients import tune_model as tm

    tm.print_report(doc, console)


def register(app: typer.Typer) -> None:
    """Add `schedule`, `tune`, `tasks`, `curve` and `tune-model` to the `pipetune` app."""
    app.add_typer(schedule_app, name="schedule")
    app.add_typer(tune_app, name="tune")
    app.command("tasks")(tasks)
    app.command("curve")(curve)
    app.command("tune-model")(tune_model)
