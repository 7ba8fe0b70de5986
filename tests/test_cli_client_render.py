"""How the curve command draws: the PNG (matplotlib), the HTML page (plotly's bundle inlined
from the installed package, no CDN), the simulated label, the sparkline and the milestone
rows, and the one-line exit 2 when matplotlib is missing."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import time
from pathlib import Path

import numpy as np
import plotly
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from pipetune.clients.cli import curve_files
from pipetune.clients.cli.client_cmds import milestones, sparkline
from pipetune.clients.cli.main import app
from pipetune.clients.cli.output import format_rate as _rate
from pipetune.clients.cli.output import rate_figure
from pipetune.model.states import TaskState
from pipetune.model.wire import Curve, CurvePoint, TaskDoc

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
TASK = TaskDoc(
    id=7,
    state="done",
    workload={"op": "gemm", "m": 1024, "n": 64, "k": 2048},
    gpu="h100",
    strategy="random",
    budget=10,
    seed=0,
    trials_done=10,
    trials_failed=0,
    created_at=NOW,
    updated_at=NOW,
)
LATENCIES = [None, 9.0, 9.0, 6.0, 6.0, 6.0, 4.0, 4.0, 4.0, 3.9]
CURVE = Curve(
    points=[
        CurvePoint(
            trial=i, best_latency_us=v, best_tflops=None if v is None else 0.268 / (v * 1e-6)
        )
        for i, v in enumerate(LATENCIES)
    ]
)
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def test_png_is_900_by_540_with_the_curve_drawn(tmp_path: Path):
    path = tmp_path / "c.png"
    curve_files.write_curve_png(path, TASK, CURVE, simulated=False)
    image = imread(path)
    assert image.shape[:2] == (540, 900)
    rgb = (image[..., :3] * 255).round().astype(int)
    blue = np.all(rgb == (31, 119, 180), axis=2)  # the line's colour, #1f77b4
    rows, cols = np.nonzero(blue)
    assert rows.size > 300 and cols.max() - cols.min() > 500  # across the plot


def test_a_png_that_fails_to_render_leaves_the_file_there_as_it_was(tmp_path, monkeypatch):
    """savefig wrote straight to the path: a drawing that failed part-way (or was
    interrupted) left a partial PNG over the old one. It is written whole or not at all."""
    from matplotlib.figure import Figure

    path = tmp_path / "c.png"
    path.write_bytes(b"the earlier curve")
    drawn = Figure.savefig

    def fails_after_writing(self, fname, *args, **kwargs):
        drawn(self, fname, *args, **kwargs)
        raise OSError("No space left on device")

    monkeypatch.setattr(Figure, "savefig", fails_after_writing)
    with pytest.raises(OSError, match="No space left"):
        curve_files.write_curve_png(path, TASK, CURVE, simulated=False)
    assert path.read_bytes() == b"the earlier curve"
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]  # no temporary file left


def test_html_inlines_plotly_from_the_installed_package(tmp_path: Path):
    path = tmp_path / "c.html"
    curve_files.write_curve_html(path, TASK, CURVE, simulated=True)
    page = path.read_text()
    assert 'src="http' not in page  # no script from a CDN (the bundle names one for maps)
    bundle = PLOTLY_JS.read_text()
    assert bundle[2000:2400] in page  # the bundle itself, not a link to it
    assert "task 7: gemm 1024x64x2048 on h100 (random)" in page
    assert "simulated: analytical model + noise, not measurements" in page


def test_titles_say_when_the_trials_are_simulated():
    simulated = curve_files._subtitle(True, CURVE)
    assert simulated == "simulated: analytical model + noise, not measurements"
    assert "simulated" not in curve_files._subtitle(False, CURVE)


def test_an_empty_curve_is_not_called_measured(tmp_path: Path):
    """A queued task's curve (no trial finished) read "best-so-far over the measured
    trials"."""
    path = tmp_path / "c.html"
    curve_files.write_curve_html(path, TASK, Curve(points=[]), simulated=False)
    page = path.read_text()
    assert "no trial has finished yet" in page and "measured trials" not in page


def test_png_without_matplotlib_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path):
    real = curve_files.importlib.util.find_spec
    monkeypatch.setattr(
        curve_files.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    result = CliRunner().invoke(app, ["curve", "1", "--png", str(tmp_path / "c.png")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --png: drawing a PNG needs matplotlib: pip install 'pipetune[plot]'"
    )


def test_sparkline_and_milestones():
    assert sparkline([None, 1.0, 2.0, 4.0]) == " ▁▃█"
    assert sparkline([]) == ""
    assert milestones(16) == [1, 2, 5, 10, 16]
    assert milestones(50) == [1, 2, 5, 10, 20, 50]


def test_a_finished_task_says_which_task_warm_started_it(capsys: pytest.CaptureFixture[str]):
    from pipetune.clients.cli.client_cmds import print_task

    print_task(TASK, "http://x")
    assert "warm-started" not in capsys.readouterr().out
    print_task(TASK.model_copy(update={"prior_task": 3}), "http://x")
    out = " ".join(capsys.readouterr().out.split())
    assert "10/10 trials (0 failed), done, warm-started from task 3" in out
    print_task(TASK.model_copy(update={"learned_from": [1, 2, 5]}), "http://x")
    out = " ".join(capsys.readouterr().out.split())
    assert "10/10 trials (0 failed), done, prior learned from 3 tasks" in out


def test_a_finished_task_says_its_priority_beside_the_strategy(
    capsys: pytest.CaptureFixture[str],
):
    from pipetune.clients.cli.client_cmds import print_task

    print_task(TASK, "http://x")
    assert "priority" not in capsys.readouterr().out
    print_task(TASK.model_copy(update={"priority": 3}), "http://x")
    out = " ".join(capsys.readouterr().out.split())
    assert "random, priority 3, 10/10 trials (0 failed), done" in out


def test_the_strategy_column_names_a_warm_start_and_an_import():
    from pipetune.clients.cli.client_cmds import strategy_label

    assert strategy_label(TASK) == "random"
    assert strategy_label(TASK.model_copy(update={"prior_task": 3})) == "random (prior: task 3)"
    imported = TASK.model_copy(update={"imported_from": "a100.t4.json.gz"})
    assert strategy_label(imported) == "imported dataset"
    learned = TASK.model_copy(update={"learned_from": [4, 9]})
    assert strategy_label(learned) == "random (prior: learned from 2 tasks)"
    one = TASK.model_copy(update={"learned_from": [4]})
    assert strategy_label(one) == "random (prior: learned from task 4)"
    urgent = TASK.model_copy(update={"priority": 3, "prior_task": 3})
    assert strategy_label(urgent) == "random (prior: task 3), priority 3"


class _FakeService:
    """The SDK client of `pipetune tune --wait`, answering with a finished task (`final`)
    or interrupted while waiting (`interrupt`)."""

    def __init__(self, final: TaskDoc | None) -> None:
        self.final = final

    def __enter__(self) -> _FakeService:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def tune(self, *args: object, **kwargs: object) -> TaskDoc:
        return TASK.model_copy(update={"state": "queued", "trials_done": 0})

    def wait(self, task_id: int, progress=None, poll_s: float = 1.0) -> TaskDoc:  # type: ignore[no-untyped-def]
        if self.final is None:
            raise KeyboardInterrupt
        return self.final


def _tune_wait(monkeypatch: pytest.MonkeyPatch, final: TaskDoc | None):  # type: ignore[no-untyped-def]
    from pipetune.clients.cli import client_cmds

    monkeypatch.setattr(client_cmds, "client", lambda server, api_key: _FakeService(final))
    args = ["tune", "gemm", "--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]
    return CliRunner().invoke(app, [*args, "--wait", "--server", "http://svc:8000"])


def test_tune_wait_fails_when_no_trial_succeeded(monkeypatch: pytest.MonkeyPatch):
    """Every trial failed (a worker crashing on each): `tune --wait` said "done" and exited
    0, so `tune --wait && ...` carried on."""
    failed = TASK.model_copy(update={"trials_failed": 10})
    result = _tune_wait(monkeypatch, failed)
    assert result.exit_code == 1, result.output
    assert "error: task 7 done, but none of its 10 trials succeeded" in result.stderr
    knobs = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 2}
    knobs |= {"warp_col_tiles": 2, "chunk": 2, "smem_stages": 3, "reg_stages": 2}
    best = TaskDoc.model_validate(
        {
            **TASK.model_dump(exclude={"best"}),
            "best": {"trial": 3, "schedule": knobs, "latency_us": 3.9, "throughput": 68.7},
        }
    )
    assert _tune_wait(monkeypatch, best).exit_code == 0


def test_an_interrupted_tune_wait_says_the_task_goes_on(monkeypatch: pytest.MonkeyPatch):
    result = _tune_wait(monkeypatch, None)
    assert result.exit_code == 130
    said = " ".join(result.stderr.split())
    assert "interrupted: task 7 goes on at the service" in said
    assert "DELETE http://svc:8000/v1/tasks/7" in said


class _TerminatedService(_FakeService):
    """The SDK client of `pipetune tune --wait`, whose wait meets SIGTERM (a CI job's limit)."""

    def wait(self, task_id: int, progress=None, poll_s: float = 1.0) -> TaskDoc:  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here
        raise AssertionError("SIGTERM did not end the wait")


class _UnhandledError(Exception):
    pass


def test_a_tune_wait_ended_by_sigterm_says_the_task_goes_on(monkeypatch: pytest.MonkeyPatch):
    """SIGTERM killed `tune --wait` without a word (Ctrl-C said the task goes on, exit 130):
    now the same message, exit 143, and the handler before it is back afterwards."""
    from pipetune.clients.cli import client_cmds

    def unhandled(signum: int, frame: object) -> None:
        raise _UnhandledError  # stands in for the default, which would end pytest itself

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        monkeypatch.setattr(client_cmds, "client", lambda server, api_key: _TerminatedService(None))
        args = ["tune", "gemm", "--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]
        result = CliRunner().invoke(app, [*args, "--wait", "--server", "http://svc:8000"])
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 143, (result.output, result.exception)
    said = " ".join(result.stderr.split())
    assert "terminated: task 7 goes on at the service" in said
    assert "DELETE http://svc:8000/v1/tasks/7" in said


class _TerminatedWhileCreating(_FakeService):
    """SIGTERM while the task's request is on its way (the service may create it)."""

    def tune(self, *args: object, **kwargs: object) -> TaskDoc:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here
        raise AssertionError("SIGTERM did not end the request")


@pytest.mark.parametrize("wait", [True, False])
def test_a_tune_ended_by_sigterm_before_the_answer_says_the_task_may_exist(
    monkeypatch: pytest.MonkeyPatch, wait: bool
):
    """SIGTERM during the POST ended `pipetune tune` with 143 and no word, though the
    service may have created the task (seen once by a review, 6 s after the start)."""
    from pipetune.clients.cli import client_cmds

    def unhandled(signum: int, frame: object) -> None:
        raise _UnhandledError  # stands in for the default, which would end pytest itself

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        monkeypatch.setattr(
            client_cmds, "client", lambda server, api_key: _TerminatedWhileCreating(None)
        )
        args = ["tune", "gemm", "--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]
        args += ["--server", "http://svc:8000", *(["--wait"] if wait else [])]
        result = CliRunner().invoke(app, args)
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 143, (result.output, result.exception)
    said = " ".join(result.stderr.split())
    assert "terminated before the service answered: it may have created the task" in said
    assert "pipetune tasks --server http://svc:8000 --limit 5" in said


class _InterruptedModelService(_FakeService):
    """`pipetune tune-model`'s client: each shape's task queued, then Ctrl-C while waiting."""

    def __init__(self) -> None:
        super().__init__(None)
        self.created = 0

    def tune(self, *args: object, **kwargs: object) -> TaskDoc:
        self.created += 1
        return TASK.model_copy(update={"id": 100 + self.created, "state": TaskState.QUEUED})

    def task(self, task_id: int) -> TaskDoc:
        raise KeyboardInterrupt


def test_an_interrupted_tune_model_names_the_tasks_that_go_on(monkeypatch: pytest.MonkeyPatch):
    """It ended with the progress bar only: its tasks went on unsaid, and a second run
    queued every shape again beside them."""
    from pipetune.clients.cli import client_cmds

    fake = _InterruptedModelService()
    monkeypatch.setattr(client_cmds, "client", lambda server, api_key: fake)
    args = ["tune-model", "bert-base", "--seq", "128", "--server", "http://svc:8000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130, result.output
    said = " ".join(result.stderr.split())
    ids = ", ".join(str(100 + i) for i in range(1, fake.created + 1))
    assert fake.created > 1 and f"interrupted: tasks {ids} go on at the service" in said
    assert "running this command with --resume" in said
    assert "DELETE http://svc:8000/v1/tasks/ID" in said


class _UnreachableModelService(_InterruptedModelService):
    """`pipetune tune-model`'s client: each shape's task queued, then the service stays
    unreachable while it waits."""

    def task(self, task_id: int) -> TaskDoc:
        from pipetune.clients.sdk import ServiceUnavailableError

        raise ServiceUnavailableError("http://svc:8000", "connection refused")


def test_a_tune_model_that_loses_the_service_names_the_tasks_that_go_on(
    monkeypatch: pytest.MonkeyPatch,
):
    """Past the SDK's patience for an unreachable service, the error alone ended the wait:
    nothing said that the queued tasks go on, or how to follow them again."""
    from pipetune.clients.cli import client_cmds
    from pipetune.clients.sdk import client as client_module

    monkeypatch.setattr(client_module, "WAIT_THROUGH_S", 0.0)
    fake = _UnreachableModelService()
    monkeypatch.setattr(client_cmds, "client", lambda server, api_key: fake)
    args = ["tune-model", "bert-base", "--seq", "128", "--server", "http://svc:8000"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, (result.output, result.exception)
    said = " ".join(result.stderr.split())
    ids = ", ".join(str(100 + i) for i in range(1, fake.created + 1))
    assert f"tasks {ids} go on at the service if it comes back" in said
    assert "cannot reach the pipetune service" in said and "Traceback" not in said


class _QueuedWithPrior(_FakeService):
    def tune(self, *args: object, **kwargs: object) -> TaskDoc:
        return TASK.model_copy(update={"state": TaskState.QUEUED, "prior_task": 3})


def test_tune_without_wait_says_the_prior_the_service_chose(monkeypatch: pytest.MonkeyPatch):
    """--prior-gpu resolves to a task at the service (and a learned prior is the service's
    default): the line printed without --wait named the strategy only."""
    from pipetune.clients.cli import client_cmds

    monkeypatch.setattr(client_cmds, "client", lambda server, api_key: _QueuedWithPrior(None))
    args = ["tune", "gemm", "--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h200"]
    result = CliRunner().invoke(app, [*args, "--prior-gpu", "h100", "--server", "http://s:1"])
    assert result.exit_code == 0, result.output
    assert "random (prior: task 3)" in " ".join(result.stdout.split())


class _ListingService(_FakeService):
    """`pipetune tasks`'s client: one page of tasks, then none."""

    def __init__(self, tasks: list[TaskDoc]) -> None:
        super().__init__(None)
        self.listed = tasks

    def tasks(self, state=None, *, limit=None, offset=None, before=None):  # type: ignore[no-untyped-def]
        return self.listed if before is None else []


def test_data_in_brackets_is_printed_as_it_is(monkeypatch: pytest.MonkeyPatch):
    """A worker's runner "cupy:[/]" (a valid runner string) ended `pipetune tasks` for
    every user in "error: MarkupError: closing tag '[/]' ..." until the task left the page:
    the tables read data as rich markup."""
    from pipetune.clients.cli import client_cmds

    knobs = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 2}
    knobs |= {"warp_col_tiles": 2, "chunk": 2, "smem_stages": 3, "reg_stages": 2}
    best = {"trial": 3, "schedule": knobs, "latency_us": 3.9, "throughput": 68.7}
    listed = [
        TASK.model_validate({**TASK.model_dump(), "best": {**best, "runner": "cupy:[/]"}}),
        TASK.model_copy(update={"id": 8, "error": "[red]bad[/red] [/]"}),
    ]
    service = _ListingService(listed)
    monkeypatch.setattr(client_cmds, "reader", lambda server, api_key, db: service)
    result = CliRunner().invoke(app, ["tasks", "--server", "http://svc:8000"])
    assert result.exit_code == 0, result.output
    assert "cupy:[/]" in result.stdout


def test_a_second_signal_does_not_cut_off_what_the_first_one_says():
    """`timeout` sends SIGTERM to the command and again to its process group: the second,
    arriving while the first one's message was said, killed the command without a word (the
    handler was already the default again), and a second Ctrl-C raised while it was said.
    Only the first signal interrupts now; the handlers come back when the block ends."""
    from pipetune.clients.cli.errors import Terminated, sigterm_interrupts

    def unhandled(signum: int, frame: object) -> None:
        raise _UnhandledError  # stands in for the default, which would end pytest itself

    previous = signal.signal(signal.SIGTERM, unhandled)
    said = []
    try:
        with sigterm_interrupts():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs here
            except Terminated:
                os.kill(os.getpid(), signal.SIGTERM)  # the process group's copy
                os.kill(os.getpid(), signal.SIGINT)  # and an impatient Ctrl-C
                time.sleep(0.1)
                said.append("terminated: the tasks go on")
        assert said == ["terminated: the tasks go on"]
        assert signal.getsignal(signal.SIGTERM) is unhandled
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with sigterm_interrupts():
            pass  # a block that ends unsignalled restores the handler as well
        with pytest.raises(_UnhandledError):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_throughput_too_small_for_its_decimals_keeps_two_significant_digits():
    """A tiny GEMM's 0.0052 TFLOP/s read "0.0 TFLOP/s" (and 0.3 GB/s "0 GB/s")."""
    assert _rate(0.0052, "TFLOP/s") == "0.0052 TFLOP/s"
    assert _rate(0.3, "GB/s") == "0.3 GB/s"
    assert _rate(41.26, "TFLOP/s") == "41.3 TFLOP/s" and _rate(812.4, "GB/s") == "812 GB/s"
    assert _rate(0.0, "TFLOP/s") == "0.0 TFLOP/s" and _rate(None, "GB/s") == "-"
    # A table's cell, its unit in the column's name: the same figure.
    assert rate_figure(0.0052, "TFLOP/s") == "0.0052" and rate_figure(1570.8, "GB/s") == "1571"
    assert rate_figure(None, "GB/s") == "-"


def test_a_curve_table_shows_a_tiny_throughput_by_the_same_rule(monkeypatch):
    """`pipetune curve` printed a tiny softmax's 0.0034 GB/s as "0.0" (one decimal, where
    every other command shows GB/s without and two significant digits where 0 would show),
    and a fast one's 1570.8 GB/s where the others said 1571."""
    from pipetune.clients.cli import client_cmds

    curve = Curve(
        throughput_unit="GB/s",
        points=[
            CurvePoint(trial=0, best_latency_us=9.6, best_throughput=0.0034),
            CurvePoint(trial=1, best_latency_us=0.02, best_throughput=1570.8),
        ],
    )

    class FakeReader:
        def task(self, task_id):
            return TASK

        def curve(self, task_id):
            return curve

        def all_trials(self, task_id):
            return []

    @contextlib.contextmanager
    def fake_reader(*args):
        yield FakeReader()

    monkeypatch.setattr(client_cmds, "reader", fake_reader)
    shown = CliRunner().invoke(app, ["curve", "7", "--server", "http://127.0.0.1:9"])
    assert shown.exit_code == 0, shown.output
    rows = [line.split() for line in shown.stdout.splitlines() if "│" in line]
    assert ["│", "1", "│", "9.60", "│", "0.0034", "│"] in rows, shown.stdout
    assert ["│", "2", "│", "0.02", "│", "1571", "│"] in rows, shown.stdout
