"""The service-facing commands against a live service on loopback (`pipetune serve` in a
child process, API keys on) with an in-process simulated H100 worker."""

from __future__ import annotations

import io
import json
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.local_service import LocalService
from pipetune.model.hardware import get_gpu
from pipetune.workers.daemon import EventLog, Worker, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.runners import SimulatedRunner

TOKEN = "cli-worker-token"
API_KEY = "cli-api-key"
FC = ["--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]
runner = CliRunner()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    directory = tmp_path_factory.mktemp("cli")
    svc = LocalService(
        f"sqlite:///{directory / 'pipetune.db'}",
        directory / "serve.log",
        env={"PIPETUNE_WORKER_TOKENS": TOKEN, "PIPETUNE_API_KEYS": API_KEY},
    ).start(timeout_s=60)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def worker(service: LocalService) -> Iterator[Worker]:
    config = WorkerConfig(
        server=service.url,
        token=TOKEN,
        runner="simulated",
        gpu="h100",
        concurrency=4,
        name="cli-worker",
        heartbeat_s=0.5,
        lease_wait_s=1.0,
    )
    sim = SimulatedRunner(get_gpu("h100"), time_scale=0)
    w = Worker(config, sim, describe_model_gpu("h100", "simulated"), EventLog(stream=io.StringIO()))
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    w.request_stop()
    thread.join(30)
    sim.close()


@pytest.fixture
def cli(service: LocalService, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Invoke `pipetune ...` with --server and --api-key from the environment."""
    monkeypatch.setenv("PIPETUNE_SERVER", service.url)
    monkeypatch.setenv("PIPETUNE_API_KEY", API_KEY)
    return lambda *args: runner.invoke(app, list(args))


def test_schedule_json_and_table(cli):  # type: ignore[no-untyped-def]
    result = cli("schedule", "gemm", *FC, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["source"] == "model" and doc["gpu"] == "h100" and doc["schedule_id"]
    table = cli("schedule", "gemm", *FC)
    assert table.exit_code == 0 and doc["schedule_id"] in table.stdout
    assert "analytical model (not tuned yet)" in table.stdout


def test_tune_wait_prints_the_best_schedule_and_json_the_final_task(cli, worker, service):  # type: ignore[no-untyped-def]
    result = cli("tune", "gemm", *FC, "--budget", "6", "--wait", "--poll", "0.1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the final task document, nothing else on stdout
    assert doc["state"] == "done" and doc["trials_done"] == 6 and doc["best"]["latency_us"] > 0

    human = cli("tune", "gemm", *FC, "--budget", "4", "--seed", "3", "--wait", "--poll", "0.1")
    assert human.exit_code == 0, human.output
    assert "4/4 trials (0 failed), done" in human.stdout
    assert "best trial" in human.stdout and "(numbered from 0)" in human.stdout
    # Into a log (CliRunner's stderr is no terminal) rich draws no bar: plain progress lines,
    # the last at the end. Before, nothing at all until the command ended.
    task_id = json.loads(cli("tasks", "--json").stdout)["tasks"][0]["id"]
    assert f"task {task_id} done, 4/4 trials, best " in human.stderr, human.stderr
    # The simulated worker's figure is said to be simulated while it runs too.
    progress = next(line for line in human.stderr.splitlines() if "4/4 trials, best" in line)
    assert progress.endswith(" (simulated)"), progress
    assert f"dashboard: {service.url}/dashboard" in human.stdout

    after = json.loads(cli("schedule", "gemm", *FC, "--json").stdout)
    assert after["source"] == "measured" and after["runner"] == "simulated"
    table = cli("schedule", "gemm", *FC).stdout
    assert "simulated trials" in table and "simulated µs" in table and "measured µs" not in table


def test_tune_without_wait_returns_the_queued_task(cli):  # type: ignore[no-untyped-def]
    result = cli("tune", "gemm", *FC[:6], "--gpu", "a100", "--budget", "4", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["state"] == "queued" and doc["gpu"] == "a100"
    listed = json.loads(cli("tasks", "--json", "--state", "queued").stdout)
    assert doc["id"] in [t["id"] for t in listed["tasks"]]
    table = cli("tasks")
    assert table.exit_code == 0 and "gemm 1024x64x2048" in table.stdout


def test_tune_names_the_service_in_the_command_it_suggests(cli, service):  # type: ignore[no-untyped-def]
    """`pipetune curve N` without --server reads the local database: it said the task does not
    exist, or showed another task of that number there."""
    result = cli("tune", "gemm", *FC[:6], "--gpu", "a100", "--budget", "4")
    assert result.exit_code == 0, result.output
    task_id = result.stdout.split()[1]
    suggested = f"`pipetune curve {task_id} --server {service.url}`"
    assert suggested in " ".join(result.stdout.split())
    shown = cli("curve", task_id, "--server", service.url)
    assert shown.exit_code == 0 and f"task {task_id}:" in shown.stdout


def test_tune_for_gpu_measurements_only_waits_for_a_cupy_worker(cli, worker, service):  # type: ignore[no-untyped-def]
    """--runner cupy: the simulated worker of the GPU leaves the task queued; cancelled here
    (no GPU worker will come)."""
    from pipetune.clients.sdk import Client

    result = cli("tune", "gemm", *FC, "--budget", "2", "--runner", "cupy", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["runner"] == "cupy" and doc["state"] == "queued"
    time.sleep(1.5)  # the worker waits on leases a second at a time: it had its chance
    with Client(service.url, api_key=API_KEY) as c:
        assert c.task(doc["id"]).trials_done == 0
        assert c.cancel(doc["id"]).state == "cancelled"
    bad = cli("tune", "gemm", *FC, "--runner", "gpu")
    assert bad.exit_code == 2 and "--runner: must be one of cupy, replay, simulated" in bad.output


def test_tune_with_a_batch_size_of_one_runs_one_trial_per_round(cli, worker):  # type: ignore[no-untyped-def]
    result = cli("tune", "gemm", *FC, "--budget", "3", "--batch-size", "1", "--wait", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["batch_size"] == 1 and doc["strategy"] == "auto" and doc["trials_done"] == 3
    default = json.loads(cli("tune", "gemm", *FC, "--budget", "2", "--json").stdout)
    assert default["batch_size"] == 8  # the service's PIPETUNE_BATCH_SIZE


def test_tune_with_a_prior_task_from_another_gpu(cli, worker):  # type: ignore[no-untyped-def]
    done = cli("tune", "gemm", *FC, "--budget", "8", "--seed", "5", "--wait", "--json")
    assert done.exit_code == 0, done.output
    prior = json.loads(done.stdout)["id"]
    on_a100 = [*FC[:6], "--gpu", "a100", "--budget", "4", "--json"]
    result = cli("tune", "gemm", *on_a100, "--prior-task", str(prior))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["prior_task"] == prior and doc["gpu"] == "a100" and doc["state"] == "queued"
    by_gpu = cli("tune", "gemm", *on_a100, "--prior-gpu", "h100")  # the most trials there
    assert by_gpu.exit_code == 0, by_gpu.output
    assert json.loads(by_gpu.stdout)["prior_task"] == prior

    missing = cli("tune", "gemm", *on_a100, "--prior-task", "987654")
    assert missing.exit_code == 2
    assert missing.stderr.strip() == "error: --prior-task: task 987654 does not exist"
    same_gpu = cli("tune", "gemm", *FC, "--prior-task", str(prior))
    assert same_gpu.exit_code == 2 and "ran on h100 too" in same_gpu.stderr


def test_tune_with_a_learned_prior(cli, service):  # type: ignore[no-untyped-def]
    on_h200 = [*FC[:6], "--gpu", "h200", "--budget", "4", "--json", "--learned-prior"]
    nothing = cli("tune", "gemm", *on_h200)
    assert nothing.exit_code == 2
    assert nothing.stderr.startswith(
        "error: --learned-prior: no finished task of the tensor_gemm family measured on a GPU"
    )
    measured = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/BMM_BERT_QK.t4.json.gz"
    imported = runner.invoke(
        app, ["db", "import-dataset", str(measured), "--db", service.database_url, "--json"]
    )
    assert imported.exit_code == 0, imported.output
    result = cli("tune", "gemm", *on_h200)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["learned_from"] == [json.loads(imported.stdout)["id"]] and doc["gpu"] == "h200"
    both = cli("tune", "gemm", *on_h200, "--prior-gpu", "h100")
    assert both.exit_code == 2 and "give --prior-gpu or --learned-prior, not both" in both.stderr
    # Left out, the tensor GEMM family learns only from enough measured shapes (one is too
    # few: MIN_DEFAULT_SHAPES), and --no-learned-prior never does.
    plain = [*FC[:6], "--gpu", "h200", "--budget", "4", "--json"]
    default = json.loads(cli("tune", "gemm", *plain).stdout)
    assert default["learned_from"] is None
    refused = cli("tune", "gemm", *plain, "--no-learned-prior")
    assert refused.exit_code == 0, refused.output
    assert json.loads(refused.stdout)["learned_from"] is None
    # A shape nothing measured on the H200: the analytical model's pick (one shape teaches
    # no default), and the table does not say learned.
    other = ["--m", "2048", "--n", "64", "--k", "2048", "--gpu", "h200"]
    table = cli("schedule", "gemm", *other)
    assert table.exit_code == 0, table.output
    assert "cost model learned from" not in table.stdout


def test_curve_text_json_png_and_html(cli, worker, tmp_path: Path):  # type: ignore[no-untyped-def]
    done = json.loads(
        cli("tune", "gemm", *FC, "--budget", "5", "--seed", "9", "--wait", "--json").stdout
    )
    task = str(done["id"])
    points = json.loads(cli("curve", task, "--json").stdout)["points"]
    assert [p["trial"] for p in points] == list(range(5))
    assert points[-1]["best_latency_us"] == pytest.approx(done["best"]["latency_us"])

    text = cli("curve", task)
    assert text.exit_code == 0 and "best TFLOP/s" in text.stdout
    assert any(ch in text.stdout for ch in "▁▂▃▄▅▆▇█")

    png, html = tmp_path / "curve.png", tmp_path / "curve.html"
    result = cli("curve", task, "--png", str(png), "--html", str(html))
    assert result.exit_code == 0, result.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (900, 540)
    rgb = (imread(png)[..., :3] * 255).round().astype(int)
    assert np.all(rgb == (31, 119, 180), axis=2).sum() > 100  # the curve was drawn
    page = html.read_text()
    assert "plotly" in page and 'src="http' not in page  # the bundle inlined, no CDN
    assert "simulated: analytical model + noise, not measurements" in page


def test_server_errors_are_one_line_with_the_servers_reason(cli, service):  # type: ignore[no-untyped-def]
    missing = cli("curve", "987654")  # a task id the user typed: a usage mistake
    assert missing.exit_code == 2
    assert missing.stderr.strip() == "error: task 987654 does not exist (HTTP 404)"

    state = cli("tasks", "--state", "bogus")  # only the service checks the state
    assert state.exit_code == 2 and state.stderr.startswith("error: --state: ")

    seed = cli("tune", "gemm", *FC, "--seed", "-1")  # likewise the seed
    assert seed.exit_code == 2
    assert (
        seed.stderr.strip() == "error: --seed: Input should be greater than or equal to 0 (got -1)"
    )

    denied = runner.invoke(app, ["tasks", "--server", service.url, "--api-key", "wrong"])
    assert denied.exit_code == 1 and "(HTTP 401)" in denied.stderr
    assert denied.stderr.rstrip().endswith("give --api-key or set PIPETUNE_API_KEY")
    assert len(denied.stderr.strip().splitlines()) == 1

    # A URL with a path the service has no route under: "Not Found (HTTP 404)" named
    # neither the URL nor that it is the URL that is wrong.
    prefixed = runner.invoke(app, ["tasks", "--server", f"{service.url}/some/prefix"])
    assert prefixed.exit_code == 2
    (line,) = prefixed.stderr.strip().splitlines()
    assert line.startswith("error: --server: the server has no route GET /v1/tasks (HTTP 404")
    assert line.endswith("is --server the pipetune service's base URL?")


def test_tune_model_reports_layers_and_the_end_to_end_speedup(cli, worker):  # type: ignore[no-untyped-def]
    args = ["tune-model", "bert-base", "--seq", "128", "--budget", "3", "--poll", "0.1"]
    result = cli(*args, "--batch-size", "1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["latencies"].startswith("simulated")
    # 12 blocks of 10 operators: 6 tensor-core GEMMs and 4 memory-intensive ones (two layer
    # norms of one shape: one task run 24 times)
    counts = {row["family"]: 0 for row in doc["layers"]}
    for row in doc["layers"]:
        counts[row["family"]] += row["count"]
    assert counts == {"tensor_gemm": 72, "memops": 48}
    for row in doc["layers"]:
        assert row["state"] == "done" and row["tuned_us"] > 0
        assert row["baseline_source"] in ("trials", "model")
        assert row["speedup"] == pytest.approx(row["baseline_us"] / row["tuned_us"])
        unit = "GB/s" if row["family"] == "memops" else "TFLOP/s"
        assert row["throughput_unit"] == unit and row["throughput"] > 0
    e2e = doc["end_to_end"]
    total_base = sum(r["count"] * r["baseline_us"] for r in doc["layers"])
    total_tuned = sum(r["count"] * r["tuned_us"] for r in doc["layers"])
    assert e2e["complete"] and e2e["speedup"] == pytest.approx(total_base / total_tuned)
    shares = {f["family"]: f["share"] for f in doc["families"]}
    assert set(shares) == {"tensor_gemm", "memops"} and sum(shares.values()) == pytest.approx(1)

    # --batch-size reaches every shape's task (the service's default is 8)
    tasks = {t["id"]: t for t in json.loads(cli("tasks", "--json").stdout)["tasks"]}
    assert {tasks[row["task_id"]]["batch_size"] for row in doc["layers"]} == {1}

    table = cli(*args[:-2])
    assert table.exit_code == 0, table.output
    assert "latencies: simulated (analytical model + noise, not measurements)" in table.stdout
    assert "end-to-end (tensor-core GEMM layers)" in table.stdout
    assert "GB/s" in table.stdout and "TFLOP/s" in table.stdout


def test_tune_model_resume_follows_the_earlier_runs_tasks(cli, worker):  # type: ignore[no-untyped-def]
    args = ["tune-model", "gpt2", "--seq", "64", "--budget", "2", "--poll", "0.1", "--json"]
    first = cli(*args)
    assert first.exit_code == 0, first.output
    ids = sorted(row["task_id"] for row in json.loads(first.stdout)["layers"])
    listed = len(json.loads(cli("tasks", "--json").stdout)["tasks"])

    again = cli(*args, "--resume")
    assert again.exit_code == 0, again.output
    assert sorted(row["task_id"] for row in json.loads(again.stdout)["layers"]) == ids
    assert f"resuming {len(ids)} of {len(ids)} shapes" in again.stderr
    assert len(json.loads(cli("tasks", "--json").stdout)["tasks"]) == listed  # none queued

    # Another seed is another run: every shape queued anew.
    other = cli(*args, "--seed", "1", "--resume")
    assert other.exit_code == 0, other.output
    assert not set(row["task_id"] for row in json.loads(other.stdout)["layers"]) & set(ids)
    assert f"resuming 0 of {len(ids)} shapes; queuing {len(ids)}" in other.stderr


def test_tune_model_with_wgmma_tunes_the_gemms_on_the_hopper_family(cli, worker):  # type: ignore[no-untyped-def]
    args = ["tune-model", "bert-base", "--seq", "128", "--budget", "3", "--poll", "0.1"]
    result = cli(*args, "--wgmma", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    counts: dict[str, int] = {}
    for row in doc["layers"]:
        counts[row["family"]] = counts.get(row["family"], 0) + row["count"]
        assert row["state"] == "done" and row["tuned_us"] > 0
    assert counts == {"hopper_gemm": 72, "memops": 48}
    hopper = [row for row in doc["layers"] if row["family"] == "hopper_gemm"]
    assert {row["workload"]["op"] for row in hopper} == {"hopper_gemm", "hopper_bmm"}
    assert {row["baseline"] for row in hopper} == {"one block per tile"}


def test_workers_lists_the_live_worker_from_the_service(cli, worker):  # type: ignore[no-untyped-def]
    """`pipetune workers --server` (from the environment, with the API key the service
    requires): the daemon of this module, live, with the service's counts."""
    deadline = time.monotonic() + 10
    while worker.worker_id is None and time.monotonic() < deadline:
        time.sleep(0.05)
    doc = json.loads(cli("workers", "--state", "live", "--json").stdout)
    assert [w["name"] for w in doc["workers"]] == ["cli-worker"]
    assert doc["workers"][0]["state"] == "live" and doc["counts"]["live"] == 1
    table = cli("workers")
    assert table.exit_code == 0, table.output
    assert "cli-worker" in table.stdout and "1 live, 0 silent, 0 exited" in table.stdout


class _CancelWaiting:
    """Cancels the service's unfinished tasks for `gpu` once each has waited `after_s` (no
    worker of that GPU will come): the command that follows them then ends."""

    def __init__(self, service: LocalService, gpu: str, after_s: float = 1.5) -> None:
        self.service, self.gpu, self.after_s = service, gpu, after_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from pipetune.clients.sdk import Client

        seen: dict[int, float] = {}
        with Client(self.service.url, api_key=API_KEY) as c:
            while not self.stop.wait(0.2):
                for t in c.tasks(limit=100):
                    if t.gpu != self.gpu or t.state.is_final():
                        continue
                    first = seen.setdefault(t.id, time.monotonic())
                    if time.monotonic() - first > self.after_s:
                        c.cancel(t.id)

    def __enter__(self) -> _CancelWaiting:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_waits_without_a_progress_bar_say_why_on_stderr(cli, worker, service):  # type: ignore[no-untyped-def]
    """With --json there is no progress bar: `tune --wait` and `tune-model` for a GPU no
    worker serves printed nothing until killed. Each reason is said once on stderr."""
    fc = ["--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h200"]
    with _CancelWaiting(service, "h200"):
        tuned = cli("tune", "gemm", *fc, "--budget", "2", "--wait", "--poll", "0.1", "--json")
    assert tuned.exit_code == 1, tuned.output  # cancelled
    assert tuned.stderr.count("waits: no h200 worker has registered") == 1, tuned.stderr
    assert json.loads(tuned.stdout)["state"] == "cancelled"

    args = ["tune-model", "gpt2", "--seq", "64", "--gpu", "h200", "--budget", "1", "--json"]
    with _CancelWaiting(service, "h200"):
        model = cli(*args, "--poll", "0.1")
    assert model.exit_code == 1, model.output
    (line,) = [x for x in model.stderr.splitlines() if "no h200 worker" in x]
    assert line.startswith("warning: tasks ") and line.endswith(
        " wait: no h200 worker has registered"
    )
