"""`pipetune tune-model --prior-gpu`: a prior GPU no shape could use (unknown, the tuned GPU
itself, a strategy that takes no prior) is refused before any task is created; only a shape
without a finished task on that GPU starts cold."""

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
