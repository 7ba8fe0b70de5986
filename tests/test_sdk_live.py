"""The SDK (clients.Client) against a live service on loopback: `pipetune serve` in a child
process with API keys on, and an in-process simulated worker (workers.daemon.Worker) that
measures the tasks the tests start."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import pytest

from pipetune.clients import (
    AuthError,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
    WaitTimeoutError,
)
from pipetune.clients.local_service import LocalService, free_port
from pipetune.model.errors import InvalidArgumentError
from pipetune.model.hardware import get_gpu
from pipetune.model.wire import DEFAULT_STRATEGY, AggregateCurves, TaskDoc, TuneOptions
from pipetune.model.workloads import gemm
from pipetune.workers.daemon import EventLog, Worker, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.runners import SimulatedRunner

TOKEN = "sdk-worker-token"
API_KEY = "sdk-api-key"
RN50_FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    directory = tmp_path_factory.mktemp("sdk")
    svc = LocalService(
        f"sqlite:///{directory / 'pipetune.db'}",
        directory / "serve.log",
        env={"PIPETUNE_WORKER_TOKENS": TOKEN, "PIPETUNE_API_KEYS": API_KEY},
    ).start(timeout_s=60)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def worker(service: LocalService) -> Iterator[Worker]:
    """A simulated H100 worker in a thread (instant trials)."""
    config = WorkerConfig(
        server=service.url,
        token=TOKEN,
        runner="simulated",
        gpu="h100",
        concurrency=2,
        name="sdk-worker",
        heartbeat_s=0.5,
        lease_wait_s=1.0,
    )
    runner = SimulatedRunner(get_gpu("h100"), time_scale=0)
    log = io.StringIO()
    w = Worker(config, runner, describe_model_gpu("h100", "simulated"), EventLog(stream=log))
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    w.request_stop()
    thread.join(30)
    runner.close()
    assert not thread.is_alive(), log.getvalue()


@pytest.fixture
def client(service: LocalService) -> Iterator[Client]:
    with Client(service.url, api_key=API_KEY) as c:
        yield c


def test_best_schedule_is_the_models_pick_then_the_best_measured(client: Client, worker: Worker):
    workload = gemm(512, 128, 1024)
    before = client.best_schedule(workload, "h100")
    assert before.source == "model" and before.latency_us is None and before.task_id is None
    assert before.schedule_id.startswith("s-") and before.predicted_us > 0

    task = client.tune(workload, "h100", budget=6, strategy="analytical+xgb", seed=7)
    assert task.state in ("queued", "running") and task.budget == 6
    seen: list[TaskDoc] = []
    done = client.wait(task.id, progress=seen.append, poll_s=0.1, timeout_s=60)
    assert done.state == "done" and done.trials_done == 6 and done.best is not None
    assert seen[-1] == done
    progress = [d.trials_done for d in seen]
    assert progress == sorted(progress)

    after = client.best_schedule(workload.canonical(), "h100")
    assert after.source == "measured"
    assert after.latency_us == pytest.approx(done.best.latency_us)
    assert after.schedule == done.best.schedule


def test_trials_curve_and_task_listing(client: Client, worker: Worker):
    task = client.tune(RN50_FC, "h100", budget=5, seed=1)
    done = client.wait(task.id, poll_s=0.1, timeout_s=60)
    assert task.id in [t.id for t in client.tasks()]
    assert task.id in [t.id for t in client.tasks(state="done")]

    trials = client.all_trials(task.id)
    assert [t.trial for t in trials] == list(range(5))
    assert all(t.worker == "sdk-worker" and t.status == "ok" for t in trials)
    assert [t.trial for t in client.trials(task.id, after=2)] == [3, 4]
    # The timed repeats only when asked (the simulated worker reports its repeats).
    assert all(t.samples_us is None and t.spread is not None for t in trials)
    full = client.all_trials(task.id, samples=True)
    assert all(t.samples_us and min(t.samples_us) <= t.latency_us for t in full)
    assert [t.trial for t in client.trials(task.id, after=3, samples=True)] == [4]

    curve = client.curve(task.id)
    assert [p.trial for p in curve.points] == list(range(5))
    best = [p.best_latency_us for p in curve.points]
    assert best == sorted(best, reverse=True)  # best-so-far never gets worse
    assert best[-1] == pytest.approx(done.best.latency_us)
    assert min(t.latency_us for t in trials) == pytest.approx(best[-1])

    curves = client.curves(gpu="h100", op="gemm", strategy="analytical+xgb")
    assert isinstance(curves, AggregateCurves)
    assert (curves.gpu, curves.op) == ("h100", "gemm")


def test_tune_defaults_to_the_services_strategy_and_takes_a_batch_size(
    client: Client, worker: Worker
):
    task = client.tune(RN50_FC, "h100", budget=3, seed=11, batch_size=1)
    assert task.strategy == DEFAULT_STRATEGY == "auto"  # not a default of the SDK's own
    assert task.batch_size == 1
    assert client.wait(task.id, poll_s=0.1, timeout_s=60).trials_done == 3
    # Refused by the SDK before any request (tests/test_sdk_inputs.py: even with no service).
    with pytest.raises(InvalidArgumentError, match="batch_size") as refused:
        client.tune(RN50_FC, "h100", budget=3, batch_size=0)
    assert refused.value.argument == "batch_size"


def test_tune_takes_a_priority(client: Client, worker: Worker):
    task = client.tune(RN50_FC, "h100", budget=2, seed=12, priority=4)
    assert task.priority == 4 and client.task(task.id).priority == 4
    assert client.tune(RN50_FC, "h100", budget=2, seed=13).priority == 1
    with pytest.raises(InvalidArgumentError, match="priority") as refused:
        client.tune(RN50_FC, "h100", budget=2, priority=11)  # (by the SDK, before a request)
    assert refused.value.argument == "priority"


def test_schedule_and_tune_in_one_request(client: Client, worker: Worker):
    doc = client.schedule_and_tune(gemm(256, 64, 512), "h100", TuneOptions(budget=3, seed=2))
    assert doc.source == "model" and doc.task_id is not None
    assert doc.url is not None and doc.url.endswith(f"/v1/tasks/{doc.task_id}")
    assert client.wait(doc.task_id, poll_s=0.1, timeout_s=60).state == "done"


def test_cancel_and_wait_timeout(client: Client, worker: Worker):
    # No worker stands in for an A100 here: the task stays queued.
    task = client.tune(RN50_FC, "a100", budget=4)
    with pytest.raises(WaitTimeoutError, match=f"task {task.id} is still queued"):
        client.wait(task.id, poll_s=0.1, timeout_s=0.3)
    cancelled = client.cancel(task.id)
    assert cancelled.id == task.id and cancelled.state == "cancelled"
    assert client.cancel(task.id).state == "cancelled"  # cancelling twice is harmless
    finished = client.tune(RN50_FC, "h100", budget=2, seed=5)
    client.wait(finished.id, poll_s=0.1, timeout_s=60)
    with pytest.raises(ConflictError) as info:
        client.cancel(finished.id)
    assert info.value.status_code == 409 and "already done" in info.value.reason


def test_a_422_names_the_field_and_the_reason(client: Client):
    with pytest.raises(InvalidRequestError) as info:
        client.best_schedule({"op": "gemm", "m": 1024, "n": 63, "k": 2048}, "h100")
    err = info.value
    assert err.status_code == 422 and err.field == "n"
    # Bad input, as the README's contract has it: a ValueError naming the field (it was
    # neither, and `except ValueError` missed a workload the service refused).
    assert isinstance(err, ValueError) and err.argument == "n"
    assert err.reason.startswith("n: must be a multiple of 8")
    with pytest.raises(InvalidRequestError) as info:
        client.tune(RN50_FC, "v100", budget=4)
    assert info.value.field == "gpu" and "unknown GPU 'v100'" in info.value.reason
    # What the SDK can judge itself it refuses before any request, naming the argument.
    with pytest.raises(InvalidArgumentError) as refused:
        client.tune(RN50_FC, "h100", budget=0)
    assert refused.value.argument == "budget"


def test_missing_task_is_not_found(client: Client):
    with pytest.raises(NotFoundError) as info:
        client.task(987654)
    assert info.value.status_code == 404 and "987654" in info.value.reason


def test_api_keys_go_as_x_api_key_or_bearer(service: LocalService):
    with Client(service.url) as anonymous, pytest.raises(AuthError) as info:
        anonymous.tasks()
    assert info.value.status_code == 401
    with Client(service.url, api_key="wrong") as wrong, pytest.raises(AuthError):
        wrong.tasks()
    with Client(service.url, token=API_KEY) as bearer:
        assert isinstance(bearer.tasks(), list)


def test_service_down_is_service_unavailable():
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url) as c, pytest.raises(ServiceUnavailableError) as info:
        c.tasks()
    assert str(info.value).startswith(f"cannot reach the pipetune service at {url} (")


def test_one_client_shared_by_threads(client: Client, worker: Worker):
    """The docstring's promise: a Client may be shared between threads (httpx's Client may,
    and it holds nothing else that changes). Eight threads tune and wait on one client at
    once; each gets its own task back, finished, with its own budget."""
    from concurrent.futures import ThreadPoolExecutor

    def tune_and_wait(budget: int) -> tuple[int, TaskDoc]:
        task = client.tune(gemm(256, 64, 512 + 64 * budget), "h100", budget=budget, seed=budget)
        return task.id, client.wait(task.id, poll_s=0.05, timeout_s=120)

    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(tune_and_wait, range(2, 10)))
    assert len({task_id for task_id, _ in done}) == 8
    for budget, (task_id, doc) in zip(range(2, 10), done, strict=True):
        assert doc.id == task_id and doc.state == "done"
        assert doc.budget == budget and doc.trials_done == budget
