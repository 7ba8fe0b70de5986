"""`pipetune tune-model --prior-gpu`: a prior GPU no shape could use (unknown, the tuned GPU
itself, a strategy that takes no prior) is refused before any task is created; only a shape
without a finished task on that GPU starts cold, and the command says which did (of either
prior); a signal while the shapes are queued says which tasks exist."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.local_service import free_port
from pipetune.clients.sdk import ApiError
from pipetune.clients.tune_model import launch
from pipetune.model.networks import network

runner = CliRunner()
TUNE = ["tune-model", "bert-base", "--seq", "64", "--budget", "2"]


@pytest.fixture(autouse=True)
def no_ambient_service(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--prior-gpu", "v100"], "unknown GPU 'v100'"),
        (["--prior-gpu", "H100"], "h100 is the GPU being tuned"),
        (["--gpu", "a100", "--prior-gpu", "a100"], "a100 is the GPU being tuned"),
        (["--prior-gpu", "h200", "--strategy", "grid"], "strategy 'grid' takes no prior"),
    ],
    ids=["unknown", "tuned GPU", "tuned GPU a100", "grid"],
)
def test_a_prior_gpu_no_shape_can_use_exits_2_before_anything_is_sent(args, reason):
    # Nothing listens at the server: had a task been asked for, the command would exit 1.
    result = runner.invoke(app, [*TUNE, *args, "--server", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --prior-gpu: "), result.stderr
    assert reason in lines[0]


class Recording:
    """A client that records the tasks asked for; shapes in `cold` have no prior task."""

    def __init__(self, cold: set[str] | None = None):
        self.calls: list[str | None] = []
        self.batch_sizes: list[int | None] = []
        self.cold = cold or set()

    def tune(
        self, workload, gpu, *, budget, strategy, seed, batch_size=None, priority=1, prior_gpu=None
    ):  # type: ignore[no-untyped-def]
        self.calls.append(prior_gpu)
        self.batch_sizes.append(batch_size)
        if prior_gpu is not None and str(workload) in self.cold:
            raise ApiError(422, "prior_gpu: no finished task", field="prior_gpu")
        return workload


def test_launch_refuses_an_unusable_prior_gpu_before_the_first_task():
    shapes = network("bert-base", batch=1, seq=64).distinct()[:2]
    for prior, strategy in (("v100", "auto"), ("h200", "auto"), ("a100", "random")):
        client = Recording()
        with pytest.raises(ValueError):
            launch(client, shapes, "h200", 8, strategy, 0, prior_gpu=prior)  # type: ignore[arg-type]
        assert client.calls == []
    launch(Recording(), shapes, "h200", 8, "bo", 0, prior_gpu="a100")  # type: ignore[arg-type]


def test_a_shape_without_a_prior_task_still_starts_cold():
    shapes = network("bert-base", batch=1, seq=64).distinct()[:2]
    client = Recording(cold={str(shapes[0].workload.canonical())})
    started = launch(client, shapes, "h200", 8, "auto", 0, prior_gpu="h100")  # type: ignore[arg-type]
    assert len(started) == 2 and client.calls == ["h100", None, "h100"]


def test_every_shape_and_its_cold_retry_take_the_batch_size():
    shapes = network("bert-base", batch=1, seq=64).distinct()[:2]
    client = Recording(cold={str(shapes[0].workload.canonical())})
    launch(client, shapes, "h200", 8, "auto", 0, prior_gpu="h100", batch_size=2)  # type: ignore[arg-type]
    assert client.calls == ["h100", None, "h100"] and client.batch_sizes == [2, 2, 2]
    plain = Recording()
    launch(plain, shapes, "h200", 8, "auto", 0)  # type: ignore[arg-type]
    assert plain.batch_sizes == [None, None]  # the service's own


def test_launch_says_which_shapes_started_cold_though_a_prior_was_asked_for():
    """`tune-model --learned-prior` where nothing measured could teach one: every shape
    started cold, exit 0, without a word (`tune` refuses the same request, exit 2)."""
    shapes = network("bert-base", batch=1, seq=64).distinct()[:2]
    client = Recording(cold={str(shapes[1].workload.canonical())})
    cold: list[str] = []
    launch(client, shapes, "h200", 8, "auto", 0, prior_gpu="h100", cold=cold)  # type: ignore[arg-type]
    assert cold == [f"{shapes[1].workload.label()}: prior_gpu: no finished task (HTTP 422)"]


class Interrupted(Recording):
    """Ctrl-C arrives while the second task is being created."""

    def tune(self, workload, gpu, **kwargs):  # type: ignore[no-untyped-def]
        if self.calls:
            raise KeyboardInterrupt
        return super().tune(workload, gpu, **kwargs)


def test_a_signal_while_the_shapes_are_queued_says_which_tasks_exist(monkeypatch):
    """Ctrl-C (or SIGTERM) after the first shape's task was created and before the wait:
    exit 130 without a word, the created tasks running on at the service unsaid."""
    from types import SimpleNamespace

    import pipetune.clients.tune_model as tm

    shapes = network("bert-base", batch=1, seq=64).distinct()[:2]
    started: list = []
    with pytest.raises(KeyboardInterrupt):
        launch(Interrupted(), shapes, "h200", 8, "auto", 0, started=started)  # type: ignore[arg-type]
    assert len(started) == 1  # the caller's list holds the task that exists

    def created_one_then_interrupted(*args, started, **kwargs):  # type: ignore[no-untyped-def]
        started.append(SimpleNamespace(id=41))
        raise KeyboardInterrupt

    monkeypatch.setattr(tm, "launch", created_one_then_interrupted)
    server = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, [*TUNE, "--server", server])
    assert result.exit_code == 130, result.output
    assert "tasks 41 go on at the service" in result.output
    assert "--resume" in result.output


def test_tune_model_says_when_shapes_start_cold_though_a_prior_was_asked_for(monkeypatch):
    import re
    from types import SimpleNamespace

    import pipetune.clients.tune_model as tm

    def one_cold(*args, started, cold, **kwargs):  # type: ignore[no-untyped-def]
        started.append(SimpleNamespace(id=7, budget=2, trials_target=2))
        cold.append("gemm 64x2304x768: learned_prior: no measured task to learn from")
        return started

    def interrupted_wait(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # (the note is said before the wait)

    monkeypatch.setattr(tm, "launch", one_cold)
    monkeypatch.setattr(tm, "wait_all", interrupted_wait)
    server = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, [*TUNE, "--learned-prior", "--server", server])
    assert result.exit_code == 130 and "tasks 7 go on" in result.output, result.output
    said = " ".join(result.output.split())
    assert re.search(r"note: --learned-prior: 1 of \d+ shapes start cold: gemm 64x2304x768", said)
