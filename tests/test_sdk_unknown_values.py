"""A client reads the answers of a newer service that added a value to a vocabulary (a task
state, a strategy, a worker state, a schedule's source, an operator and its kernel family):
every row is read, the unknown value kept as its text, so that a list shows what it only
wanted to show (one such row failed the whole `GET /v1/tasks` or `/v1/workers`). The service
still refuses such a value in what it is sent, and publishes each vocabulary as an enum."""

from __future__ import annotations

import datetime as dt
import functools
import warnings
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from pipetune.clients.cli import client_cmds, remote
from pipetune.clients.cli.main import app
from pipetune.clients.sdk import Client, WaitTimeoutError
from pipetune.model.hardware import get_gpu
from pipetune.model.knobs import ScheduleError
from pipetune.model.space import Space
from pipetune.model.states import FINAL_TASK_STATES, JobState, TaskState, WorkerState
from pipetune.model.wire import (
    READING,
    BestTrial,
    ResultAck,
    ScheduleDoc,
    ScheduleResponse,
    TaskCreate,
    TaskDoc,
    TrialDoc,
    WorkerDoc,
    WorkerList,
)
from pipetune.model.workloads import gemm

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
GEMM = {"op": "gemm", "m": 256, "n": 256, "k": 256}
SCHEDULE = ScheduleDoc.of(Space.enumerate(gemm(256, 256, 256), get_gpu("h100"))[0])
# A schedule of a kernel family this client predates (its operator is a newer service's).
NEWER_KNOBS = {"tile_q": 64, "kv_stages": 3}
KNOWN_TASK = TaskDoc(
    id=1,
    state=TaskState.DONE,
    workload=GEMM,
    gpu="h100",
    strategy="random",
    budget=10,
    seed=0,
    trials_done=10,
    trials_failed=0,
    best=BestTrial(trial=3, schedule=SCHEDULE, latency_us=12.0, throughput=2.8, runner="cupy"),
    created_at=NOW,
    updated_at=NOW,
).model_dump(mode="json")
NEWER_TASK = {
    **KNOWN_TASK,
    "id": 2,
    "state": "paused",
    "strategy": "evolutionary",
    "workload": {"op": "flash_attention", "s": 128},
    "label": "flash_attention 128",
    "best": {
        **KNOWN_TASK["best"],
        "schedule": NEWER_KNOBS,
        "throughput_unit": "TB/s",
        "tflops": None,
    },
}
WORKER = WorkerDoc(
    id=1, name="node-1", gpu="h100", arch="sm_90", runner="cupy", last_heartbeat=NOW
).model_dump(mode="json")
WORKERS = {
    "workers": [
        {**WORKER, "state": "live"},
        {**WORKER, "id": 2, "name": "node-2", "state": "draining"},
    ],
    "counts": {"live": 1, "silent": 0, "exited": 0, "draining": 1},
}
TRIALS = {
    "trials": [
        {"trial": 0, "state": "done", "status": "ok", "schedule": SCHEDULE.knobs()},
        {"trial": 1, "state": "retrying", "schedule": NEWER_KNOBS},
    ]
}
SCHEDULE_ANSWER = {
    "source": "cached",
    "workload": GEMM,
    "gpu": "h100",
    "schedule": SCHEDULE.knobs(),
    "schedule_id": "s1",
    "predicted_us": 11.0,
    "throughput": 3.0,
}
ANSWERS = {
    "/v1/tasks": {"tasks": [KNOWN_TASK, NEWER_TASK]},
    "/v1/tasks/2": NEWER_TASK,
    "/v1/workers": WORKERS,
    "/v1/tasks/2/trials": TRIALS,
    "/v1/schedules": SCHEDULE_ANSWER,
}


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=ANSWERS[request.url.path])


@pytest.fixture
def client() -> Client:
    return Client("http://service", transport=httpx.MockTransport(_answer))


def test_a_task_list_with_a_newer_services_values_reads_every_row(client: Client):
    known, newer = client.tasks()
    assert known.state is TaskState.DONE and known.strategy == "random"
    assert known.best is not None and known.best.schedule == SCHEDULE
    assert (newer.state, newer.strategy) == ("paused", "evolutionary")
    assert f"{newer.state} {newer.strategy}" == "paused evolutionary"  # printed as its text
    # A state this client does not know is not one it knows to be final.
    assert newer.state not in FINAL_TASK_STATES
    assert newer.best is not None and newer.best.throughput_unit == "TB/s"
    assert newer.best.schedule.knobs() == NEWER_KNOBS
    with pytest.raises(ScheduleError, match="no kernel family"):
        newer.best.schedule.to_schedule()  # said when used, not when read
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (pydantic warned "Expected `enum`" at every dump)
        assert newer.model_dump(mode="json")["state"] == "paused"
        assert known.model_dump(mode="json") == KNOWN_TASK


def test_a_worker_list_with_a_newer_state_reads_every_worker_and_count(client: Client):
    page = client.worker_list()
    assert [w.state for w in page.workers] == [WorkerState.LIVE, "draining"]
    assert page.workers[0].state is WorkerState.LIVE
    assert page.counts == {"live": 1, "silent": 0, "exited": 0, "draining": 1}


def test_trials_a_schedule_answer_and_an_ack_with_newer_values_are_read(client: Client):
    done, newer = client.trials(2)
    assert done.state is JobState.DONE and newer.state == "retrying"
    assert newer.schedule.knobs() == NEWER_KNOBS
    assert client.best_schedule(GEMM, "h100").source == "cached"
    ack = ResultAck.model_validate({"accepted": False, "job_state": "superseded"}, context=READING)
    assert ack.job_state == "superseded"


def test_wait_does_not_take_a_newer_state_for_a_final_one(client: Client):
    with pytest.raises(WaitTimeoutError) as caught:
        client.wait(2, timeout_s=0)
    assert caught.value.state == "paused"


def test_a_newer_state_with_an_end_time_is_a_final_one(monkeypatch: pytest.MonkeyPatch):
    """A state a newer service added that ends tasks ("archived"): the task's end time says
    so, and waits end (by the state's name alone they never did, timeout_s=None)."""
    from pipetune.clients import tune_model
    from pipetune.clients.cli.wait_notes import waiting_reasons

    ended = {**NEWER_TASK, "state": "archived", "finished_at": NOW.isoformat()}
    monkeypatch.setitem(ANSWERS, "/v1/tasks/2", ended)
    client = Client("http://service", transport=httpx.MockTransport(_answer))
    doc = client.wait(2, poll_s=0.01, timeout_s=5)
    assert (doc.state, doc.is_finished()) == ("archived", True)
    assert tune_model.wait_all(client, [doc], poll_s=0.01, timeout_s=5) == [doc]
    assert waiting_reasons([doc.model_copy(update={"no_worker": "no live worker"})]) == {}
    # A state this client knows is read by its name whatever the time says; one it does not
    # know, without an end time, is a running task's.
    running = TaskDoc.model_validate({**KNOWN_TASK, "state": "running", "finished_at": NOW})
    assert not running.is_finished()
    assert not TaskDoc.model_validate(NEWER_TASK, context=READING).is_finished()
    assert TaskDoc.model_validate(KNOWN_TASK).is_finished()


def test_the_service_says_when_a_task_ended(tmp_path):
    from service_support import client_for, create_task, drain, register

    with client_for(f"sqlite:///{tmp_path / 'ended.db'}", create_empty_schema=True) as service:
        task = create_task(service, budget=2, strategy="grid")
        assert task["finished_at"] is None
        assert drain(service, register(service)) == 2
        doc = service.get(f"/v1/tasks/{task['id']}").json()
        assert doc["state"] == "done" and doc["finished_at"] is not None
        assert TaskDoc.model_validate(doc, context=READING).is_finished()


@pytest.mark.parametrize(
    ("model", "doc", "field"),
    [
        (TaskDoc, NEWER_TASK, "state"),
        (WorkerList, WORKERS, "counts"),
        (ScheduleResponse, SCHEDULE_ANSWER, "source"),
        (TrialDoc, TRIALS["trials"][1], "state"),
    ],
)
def test_unknown_values_are_refused_except_when_reading_answers(model, doc, field):
    # The service checks its own answers strictly (and a test, say, building one).
    with pytest.raises(ValidationError, match=field):
        model.model_validate(doc)
    model.model_validate(doc, context=READING)


def test_a_value_of_another_type_is_refused_even_when_reading():
    with pytest.raises(ValidationError, match="state"):
        TaskDoc.model_validate({**NEWER_TASK, "state": 5}, context=READING)
    for knobs in ({"tile_q": "64"}, {"tile_q": True}, {"tile_q": 64.0}, {}):
        with pytest.raises(ValidationError, match="ScheduleDoc"):
            ScheduleDoc.model_validate(knobs, context=READING)
    with pytest.raises(ValidationError, match="no kernel family"):
        ScheduleDoc.model_validate(NEWER_KNOBS)


def test_a_request_with_an_unknown_value_is_refused_naming_the_field_and_the_values():
    body = {"workload": GEMM, "gpu": "h100", "strategy": "evolutionary"}
    for context in (None, READING):  # (a request is never lenient)
        with pytest.raises(ValidationError) as caught:
            TaskCreate.model_validate(body, context=context)
        (error,) = caught.value.errors()
        assert error["loc"] == ("strategy",) and "'analytical+xgb'" in error["msg"]


def _enum_of(schema: dict[str, Any], prop: dict[str, Any]) -> list[Any]:
    if "$ref" in prop:
        return _enum_of(schema, schema["$defs"][prop["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in prop:
        return [v for p in prop["anyOf"] for v in _enum_of(schema, p)]
    return prop.get("enum", [])


@pytest.mark.parametrize("mode", ["validation", "serialization"])
def test_the_published_schema_still_lists_each_vocabulary(mode):
    tasks = TaskDoc.model_json_schema(mode=mode)
    assert _enum_of(tasks, tasks["properties"]["state"]) == [s.value for s in TaskState]
    assert "evolutionary" not in _enum_of(tasks, tasks["properties"]["strategy"])
    assert "random" in _enum_of(tasks, tasks["properties"]["strategy"])
    workers = WorkerList.model_json_schema(mode=mode)
    names = workers["properties"]["counts"]["propertyNames"]
    assert _enum_of(workers, names) == [s.value for s in WorkerState]
    trial = TrialDoc.model_json_schema(mode=mode)
    assert _enum_of(trial, trial["properties"]["state"]) == [s.value for s in JobState]
    answer = ScheduleResponse.model_json_schema(mode=mode)
    assert _enum_of(answer, answer["properties"]["source"]) == ["measured", "model"]


# ---- the CLI shows such rows ------------------------------------------------------------

cli = CliRunner()


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> str:
    transport = httpx.MockTransport(_answer)
    monkeypatch.setattr(remote, "Client", functools.partial(Client, transport=transport))
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return "http://service"


def test_the_cli_lists_tasks_and_workers_with_newer_values(service: str):
    tasks = cli.invoke(app, ["tasks", "--server", service])
    assert tasks.exit_code == 0, tasks.output
    assert "paused" in tasks.stdout and "evolutionary" in tasks.stdout
    assert "TB/s" in tasks.stdout and "done" in tasks.stdout
    as_json = cli.invoke(app, ["tasks", "--server", service, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert '"state": "paused"' in as_json.stdout
    workers = cli.invoke(app, ["workers", "--server", service])
    assert workers.exit_code == 0, workers.output
    assert "draining" in workers.stdout and "node-2" in workers.stdout


def test_the_cli_shows_a_schedule_of_a_newer_source_and_family(service: str, capsys):
    args = ["schedule", "gemm", "--m", "256", "--n", "256", "--k", "256", "--gpu", "h100"]
    answer = cli.invoke(app, [*args, "--server", service])
    assert answer.exit_code == 0, answer.output
    assert "service's 'cached' source" in answer.stdout
    assert "measured trials" not in answer.stdout
    # A task whose best schedule is of a family this client predates: its knobs, as sent.
    client_cmds.print_task(TaskDoc.model_validate(NEWER_TASK, context=READING), service)
    shown = capsys.readouterr().out
    assert "tile_q=64, kv_stages=3" in shown and "paused" in shown


def test_the_cli_counts_workers_in_a_newer_state(service: str):
    workers = cli.invoke(app, ["workers", "--server", service])
    assert workers.exit_code == 0, workers.output
    # (The counts line listed the states this client knows only: "1 draining" was dropped.)
    assert "1 live, 0 silent, 0 exited, 1 draining" in workers.stdout


def test_waiting_notes_and_tune_models_wait_take_a_newer_state_as_unfinished(client: Client):
    from pipetune.clients import tune_model
    from pipetune.clients.cli.wait_notes import waiting_reasons
    from pipetune.model.errors import PipetuneError

    newer = TaskDoc.model_validate({**NEWER_TASK, "no_worker": "no live worker"}, context=READING)
    # (Both called `.is_final()` on the state: an AttributeError on the text of a newer one.)
    assert waiting_reasons([newer]) == {"no live worker": [2]}
    with pytest.raises(PipetuneError, match=r"tasks \[2\] did not finish"):
        tune_model.wait_all(client, [newer], poll_s=0.01, timeout_s=0)


def test_an_export_leaves_out_a_trial_in_a_newer_state():
    from pipetune.clients.library.exports import _trial_result

    done, newer = (TrialDoc.model_validate(t, context=READING) for t in TRIALS["trials"])
    assert _trial_result(done) is not None
    assert _trial_result(newer) is None  # (JobState("retrying") raised ValueError)


def test_tune_model_resume_asks_for_the_tasks_of_its_own_prior(monkeypatch: pytest.MonkeyPatch):
    from pipetune.clients import tune_model

    asked: list[tuple[Any, ...]] = []

    def resumable(*args: Any) -> dict:
        asked.append(args)
        raise tune_model.PipetuneError("stopped here: the test reads the arguments only")

    monkeypatch.setattr(tune_model, "resumable_tasks", resumable)
    args = ["tune-model", "bert-base", "--resume", "--prior-gpu", "h100", "--gpu", "h200"]
    result = cli.invoke(app, [*args, "--server", "http://service"])
    assert result.exit_code != 0 and "stopped here" in result.output
    # (The CLI asked for the tasks of any prior: a resume took another prior's tasks.)
    assert [a[-2:] for a in asked] == [("h100", None)]
