"""The public API at the top of `pipetune`: lazy names, `pipetune.tune` in process through
the service's own driver and queue (a service on the same database reads the task as its
own), `pipetune.best_schedule`, and the CLI's read commands on the local database
afterwards, with no service running."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service_support import client_for
from sqlalchemy import create_engine, func, select
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.main import app
from pipetune.clients.library.store import LocalInputError, LocalStore
from pipetune.model.errors import InvalidArgumentTypeError
from pipetune.model.hardware import HardwareError
from pipetune.model.states import JobState
from pipetune.model.workloads import WorkloadError, parse_workload
from pipetune.service.orm import JobRow, LeaseRow, TaskRow, WorkerRow
from pipetune.workers.runners import RunnerUnavailableError

pytest_plugins = ["service_fixtures"]

FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
FC_ARGS = ["gemm", "--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]
cli = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user data directory of its own: its database is the one `pipetune serve` would
    use by default. No service is named, so the CLI reads that database."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    for name in ("PIPETUNE_DATABASE_URL", "PIPETUNE_SERVER", "PIPETUNE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    return tmp_path


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )


# ---- the names ----------------------------------------------------------------------------


def test_import_pipetune_loads_nothing_but_the_version():
    out = _run(
        "import sys, pipetune; print(sorted(m for m in sys.modules if m.startswith("
        "('pipetune.', 'numpy', 'sqlalchemy', 'httpx', 'pydantic', 'fastapi'))))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_exported_name_resolves():
    for name in pipetune.__all__:
        assert getattr(pipetune, name) is not None, name
    assert set(pipetune.__all__) <= set(dir(pipetune))
    assert pipetune.Gemm(m=1024, n=64, k=2048).label() == "gemm 1024x64x2048"
    assert pipetune.Client.__module__ == "pipetune.clients.sdk.client"
    with pytest.raises(AttributeError, match="no attribute 'tuner_of'"):
        pipetune.tuner_of  # noqa: B018


def test_kernels_work_without_the_service_dependencies():
    """As on a GPU machine that has pipetune's kernel parts but not the service's."""
    blocked = ["sqlalchemy", "fastapi", "alembic", "uvicorn", "psycopg", "pydantic_settings"]
    out = _run(
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "import pipetune\n"
        f"k = pipetune.kernel({FC!r}, 'h100', schedule=dict(block_row_warps=2, "
        "block_col_warps=2, warp_row_tiles=2, warp_col_tiles=2, chunk=2, smem_stages=3, "
        "reg_stages=2))\n"
        "print(k.launch.grid, len(k.cubin()) > 0)\n"
        "try:\n"
        f"    pipetune.best_schedule({FC!r}, 'h100')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert out.returncode == 0, out.stderr
    grid, refusal = out.stdout.strip().splitlines()
    assert grid == "(16, 1, 1) True"
    assert refusal.startswith("reading the local database needs pipetune's service dependencies")


# ---- pipetune.tune ----------------------------------------------------------------------------


def test_the_task_list_pages_and_says_when_there_may_be_more(home: Path):
    """`pipetune tasks` listed the newest 100 and said nothing of the rest (no --limit)."""
    tiny = {"op": "gemm", "m": 16, "n": 16, "k": 16}
    for seed in range(3):
        pipetune.tune(tiny, "h100", budget=1, strategy="random", seed=seed, runner="simulated")
    first = cli.invoke(app, ["tasks", "--limit", "2", "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert [t["id"] for t in doc["tasks"]] == [3, 2] and doc["more"] is True
    rest = json.loads(cli.invoke(app, ["tasks", "--limit", "2", "--offset", "2", "--json"]).stdout)
    assert [t["id"] for t in rest["tasks"]] == [1] and rest["more"] is False
    table = cli.invoke(app, ["tasks", "--limit", "2"]).stdout
    assert "2 tasks, newest first; there may be more: --before 2 for the next ones" in table
    # The cursor: a task created between two pages does not repeat one (an offset shifts).
    pipetune.tune(tiny, "h100", budget=1, strategy="random", seed=9, runner="simulated")
    after = json.loads(cli.invoke(app, ["tasks", "--limit", "2", "--before", "2", "--json"]).stdout)
    assert [t["id"] for t in after["tasks"]] == [1] and after["before"] == 2
    shifted = json.loads(
        cli.invoke(app, ["tasks", "--limit", "2", "--offset", "2", "--json"]).stdout
    )
    assert [t["id"] for t in shifted["tasks"]] == [2, 1]  # (what an offset gives now)
    assert cli.invoke(app, ["tasks", "--before", "0"]).exit_code == 2
    bad = cli.invoke(app, ["tasks", "--limit", "0"])
    assert bad.exit_code == 2 and "--limit: must be within 1..1000" in bad.stderr


def test_a_task_on_a_space_smaller_than_its_budget_says_so(home: Path):
    """It read "2/7 trials (0 failed), done" (the CLI was fixed first)."""
    tiny = {"op": "gemm", "m": 16, "n": 16, "k": 16}  # two valid schedules on the H100
    result = pipetune.tune(tiny, "h100", budget=7, strategy="grid", runner="simulated")
    assert len(result.trials) == 2
    assert ", 2/2 (its whole space; budget 7) trials (0 failed), done" in str(result)


def test_tune_returns_16_trials_and_the_cli_answers_from_them(home: Path):
    result = pipetune.tune(FC, "h100", budget=16, runner="simulated")
    assert result.task.state == "done" and len(result.trials) == 16
    latencies = [t.latency_us for t in result.trials if t.status == "ok"]
    assert result.best_schedule is not None
    assert result.best_latency_us == min(latencies)
    curve = result.best_so_far()
    assert len(curve) == 16 and curve[-1] == result.best_latency_us
    assert all(b <= a for a, b in itertools.pairwise(curve) if a and b)
    assert result.simulated and "simulated: analytical model + noise" in str(result)
    assert ", 16/16 trials (" in str(result)
    assert result.database.endswith("pipetune/pipetune.db")  # the one `serve` uses

    answer = cli.invoke(app, ["schedule", *FC_ARGS, "--json"])
    assert answer.exit_code == 0, answer.output
    doc = json.loads(answer.stdout)
    assert doc["source"] == "measured" and doc["runner"] == "simulated"
    assert doc["schedule_id"] == result.best_schedule.id
    assert doc["latency_us"] == result.best_latency_us
    table = cli.invoke(app, ["schedule", *FC_ARGS]).stdout
    assert "simulated trials" in table and "local database" in table and "measured µs" not in table

    best = pipetune.best_schedule(pipetune.Gemm(m=1024, n=64, k=2048), "h100")
    assert best.schedule.to_schedule() == result.best_schedule
    assert pipetune.kernel(FC, "h100").schedule == result.best_schedule


def test_tune_one_trial_per_round(home: Path):
    result = pipetune.tune(FC, "h100", budget=5, runner="simulated", batch_size=1)
    assert result.task.batch_size == 1 and len(result.trials) == 5
    with pytest.raises(ValueError, match="batch_size"):
        pipetune.tune(FC, "h100", budget=5, runner="simulated", batch_size=65)


def test_a_service_reads_the_tuned_task_as_its_own(db_url: str, monkeypatch):
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    result = pipetune.tune(FC, "h100", budget=8, strategy="random", runner="simulated", db=db_url)
    assert len(result.trials) == 8
    with client_for(db_url) as service:
        task = service.get(f"/v1/tasks/{result.task_id}").json()
        assert task == result.task.model_dump(mode="json")
        trials = service.get(f"/v1/tasks/{result.task_id}/trials").json()["trials"]
        assert trials == [t.model_dump(mode="json") for t in result.trials]
        best = service.post("/v1/schedules", json={"workload": FC, "gpu": "h100"}).json()
        assert best["source"] == "measured" and best["runner"] == "simulated"
        assert best["schedule_id"] == result.best_schedule.id
    engine = create_engine(db_url)
    with engine.connect() as conn:
        leases = conn.scalar(
            select(func.count()).select_from(LeaseRow).where(LeaseRow.outcome == "result")
        )
        jobs = conn.execute(select(JobRow.state, JobRow.runner, JobRow.result_worker)).all()
        worker = conn.execute(select(WorkerRow.name, WorkerRow.runner)).one()
    engine.dispose()
    assert leases == 8 and {(j.state, j.runner) for j in jobs} == {("done", "simulated")}
    assert worker.name.startswith("in-process-") and worker.runner == "simulated"
    # Its worker stopped with the tuning, as a daemon's does: listed as exited, not live for
    # a lease TTL after the call returned.
    with LocalStore(db_url) as store:
        assert [w.state for w in store.workers()] == ["exited"]


def test_a_service_worker_of_another_runner_leaves_an_in_process_task_alone(
    db_url: str, monkeypatch
):
    """`pipetune.tune(..., runner="replay")` on a database a service also serves: the
    service's simulated worker took some of its trials (10 of 40, one of them the "best"),
    so the result the user asked to replay was part simulation. The in-process task is for
    its runner's kind only; the worker, leasing all along, gets none of it."""
    import threading

    from service_support import lease, register

    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    dataset = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/MM_RN50_FC.t4.json.gz"
    taken: list[dict] = []
    done = threading.Event()
    with client_for(db_url) as service:
        worker = register(service, name="service-sim", runner="simulated")

        def lease_all_along() -> None:
            while not done.is_set():
                taken.extend(lease(service, worker, max_jobs=8))

        thread = threading.Thread(target=lease_all_along)
        thread.start()
        try:
            result = pipetune.tune(
                FC, "h100", budget=24, runner="replay", dataset=dataset, db=db_url, seed=7
            )
        finally:
            done.set()
            thread.join()
        other = service.post(
            "/v1/tasks", json={"workload": FC, "gpu": "h100", "budget": 2, "strategy": "random"}
        ).json()
        assert {j["task_id"] for j in lease(service, worker, max_jobs=8)} == {other["id"]}
    assert taken == []
    assert result.task.runner == "replay" and len(result.trials) == 24
    assert {t.runner for t in result.trials} == {"replay:cupy"}


def test_tune_warm_starts_from_a_task_on_another_gpu(home: Path):
    first = pipetune.tune(FC, "a100", budget=8, runner="simulated")
    second = pipetune.tune(FC, "h100", budget=8, runner="simulated", prior_task=first.task_id)
    assert second.task.prior_task == first.task_id and second.task.state == "done"
    with pytest.raises(WorkloadError, match="ran on h100 too"):
        pipetune.tune(FC, "h100", budget=8, runner="simulated", prior_task=second.task_id)


@pytest.mark.parametrize("label", ["cupy,simulated", "unknown"])
def test_a_dataset_not_wholly_measured_teaches_no_learned_prior(
    home: Path, tmp_path: Path, label: str
):
    # An export of a task that simulated and GPU workers both measured says "cupy,simulated";
    # one of a task with no runner, "unknown". Re-imported, both taught learned priors.
    from pipetune.workers.datasets import load_dataset, write_t4

    measured = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/BMM_BERT_QK.t4.json.gz"
    data = load_dataset(measured)
    data.metadata["pipetune"]["runner"] = label
    write_t4(data, tmp_path / "mixed.t4.json.gz")
    result = cli.invoke(app, ["db", "import-dataset", str(tmp_path / "mixed.t4.json.gz")])
    assert result.exit_code == 0, result.output
    with pytest.raises(WorkloadError, match="learned_prior: no finished task of the"):
        pipetune.tune(FC, "h100", budget=4, runner="simulated", learned_prior=True)


def test_tune_learns_its_prior_from_the_measured_tasks_of_the_database(home: Path):
    simulated = pipetune.tune(FC, "a100", budget=8, runner="simulated")  # never a teacher
    with pytest.raises(WorkloadError, match="learned_prior: no finished task of the"):
        pipetune.tune(FC, "h100", budget=8, runner="simulated", learned_prior=True)
    measured = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/BMM_BERT_QK.t4.json.gz"
    result = cli.invoke(app, ["db", "import-dataset", str(measured), "--json"])
    assert result.exit_code == 0, result.output
    imported = json.loads(result.stdout)["id"]
    tuned = pipetune.tune(FC, "h100", budget=8, runner="simulated", learned_prior=True)
    assert tuned.task.learned_from == [imported] and simulated.task_id != imported
    assert tuned.task.state == "done"
    # Not asked either way, a tensor GEMM learns only from enough measured shapes (one is
    # too few, service.priors.MIN_DEFAULT_SHAPES); False keeps the model alone.
    default = pipetune.tune(FC, "h100", budget=8, runner="simulated")
    assert default.task.learned_from is None
    plain = pipetune.tune(FC, "h100", budget=8, runner="simulated", learned_prior=False)
    assert plain.task.learned_from is None


def test_without_a_database_the_answer_is_the_models(home: Path):
    doc = pipetune.best_schedule(FC, "h100")
    assert doc.source == "model" and doc.latency_us is None
    assert not (home / "pipetune").exists()  # a lookup creates no database
    with pytest.raises(ValueError, match="server or db, not both"):
        pipetune.best_schedule(FC, "h100", server="http://x", db="sqlite://")


def test_an_api_key_without_a_server_is_refused_not_ignored(home: Path):
    """best_schedule and kernel read the local database without a server: an api_key given
    there went nowhere, and the caller could believe a service had answered."""
    for lookup in (pipetune.best_schedule, pipetune.kernel):
        with pytest.raises(ValueError, match=r"^api_key: goes to a service: give server="):
            lookup(FC, "h100", api_key="k-123")
    assert not (home / "pipetune").exists()  # refused before any lookup


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"budget": 0}, ValueError, "budget: Input should be greater than or equal to 1"),
        # A budget too long to print: Python's own ValueError from quoting it, no PipetuneError.
        ({"budget": 10**5000}, pipetune.InvalidArgumentError, "^budget: .*got an int this large"),
        ({"strategy": "bogus"}, ValueError, "strategy: "),
        ({"runner": "opencl"}, ValueError, "runner: must be one of"),
        # Called after the first trial: a bare TypeError, the task already written.
        ({"progress": 5}, pipetune.PipetuneError, "^progress: must be a callable"),
        ({"runner": "replay"}, ValueError, "dataset: the replay runner answers from"),
        # A dataset beside another runner was ignored without a word.
        ({"dataset": "x.t4.json.gz"}, ValueError, "^dataset: only the replay runner reads"),
        ({"runner": "cupy"}, RunnerUnavailableError, "cupy runner needs CuPy"),
        ({"workload": {**FC, "n": 63}}, WorkloadError, "n: must be a multiple of 8"),
        ({"gpu": "v100"}, HardwareError, "^gpu: unknown GPU 'v100'"),
        # An AttributeError ('NoneType' object has no attribute 'strip') before.
        ({"gpu": None}, HardwareError, "^gpu: expected a GPU name such as 'h100', got NoneType"),
        # SQLAlchemy's ArgumentError, raised again by the handler that caught it.
        # (Then a LocalDatabaseError alone: not the documented ValueError naming `db`.)
        ({"db": "/tmp/x.db"}, pipetune.InvalidArgumentError, "^db: not a database URL: '/tmp/x"),
        # Read as no db at all: the task went into the default database.
        ({"db": ""}, pipetune.InvalidArgumentError, "^db: empty: give a database URL, or leave"),
        ({"db": "sqlite://"}, pipetune.InvalidArgumentError, "^db: an in-memory SQLite database"),
        ({"db": 5}, InvalidArgumentTypeError, "^db: expected a database URL, got int"),
        # pydantic's "Value error, " was left in the reason.
        ({"prior_gpu": "zz"}, ValueError, "^prior_gpu: unknown GPU 'zz'"),
        ({"prior_task": 5}, WorkloadError, "prior_task: task 5 does not exist"),
        ({"prior_task": 5, "strategy": "grid"}, WorkloadError, "strategy: strategy 'grid' takes"),
        ({"prior_task": 5, "prior_gpu": "a100"}, ValueError, "^prior_gpu: give prior_task or"),
        ({"prior_gpu": "a100"}, WorkloadError, "prior_gpu: no finished task of this workload"),
        ({"learned_prior": True}, WorkloadError, "learned_prior: no finished task of the tensor"),
        ({"learned_prior": True, "prior_task": 5}, ValueError, "^learned_prior: give prior_task"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_bad_input_is_refused_by_name_and_leaves_no_task(home: Path, kwargs, error, words):
    args = {"workload": FC, "gpu": "h100", "budget": 4, "runner": "simulated", **kwargs}
    if kwargs.get("runner") == "cupy" and importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    with pytest.raises(error, match=words) as refused:
        pipetune.tune(**args)
    if "db" in kwargs:  # (a LocalDatabaseError alone: no `.argument`, not a ValueError)
        assert refused.value.argument == "db"
    with LocalStore() as store:
        assert store.tasks() == []


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("PIPETUNE_BATCH_SIZE", "0", "^PIPETUNE_BATCH_SIZE: Input should be greater than"),
        ("PIPETUNE_DATABASE_URL", "/tmp/x.db", "^PIPETUNE_DATABASE_URL: not a database URL"),
    ],
)
def test_a_bad_setting_in_the_environment_is_named(home: Path, monkeypatch, variable, value, words):
    """pydantic's ValidationError came out of the library as it was: several lines, none
    naming the variable, and no PipetuneError (the CLI named it in one line)."""
    monkeypatch.setenv(variable, value)
    db = None if variable == "PIPETUNE_DATABASE_URL" else f"sqlite:///{home / 'env.db'}"
    with pytest.raises(pipetune.PipetuneError, match=words):
        pipetune.tune(FC, "h100", budget=2, runner="simulated", db=db)
    with pytest.raises(ValueError, match=words):
        pipetune.best_schedule(FC, "h100", db=db) if db is None else pipetune.tune(
            FC, "h100", budget=2, runner="simulated", db=db, batch_size=4
        )


def test_a_replay_of_another_workloads_dataset_is_refused_before_any_trial(
    home: Path, tmp_path: Path
):
    # The task ran its whole budget, every trial a failed DatasetMismatchError.
    recorded = tmp_path / "fc.t4.json.gz"
    sweep = ["sweep", *FC_ARGS, "--runner", "simulated", "--limit", "3", "--out", str(recorded)]
    assert cli.invoke(app, sweep).exit_code == 0
    other = {**FC, "m": 2048}
    with pytest.raises(ValueError, match="holds gemm 1024x64x2048, not gemm 2048x64x2048"):
        pipetune.tune(other, "h100", budget=3, runner="replay", dataset=recorded)
    with LocalStore() as store:
        assert store.tasks() == []


def test_the_local_store_answers_as_the_service_would(home: Path):
    pipetune.tune(FC, "h100", budget=3, strategy="random", runner="simulated")
    with LocalStore() as store:
        # A dict, and another name of the GPU: "H100" answered the model's pick.
        found = store.best_schedule(FC, "H100")
        assert found.source == "measured" and found.gpu == "h100"
        for bad in ({"limit": 0}, {"limit": -1}, {"limit": 1001}, {"offset": -5}):
            with pytest.raises(LocalInputError, match=next(iter(bad))):
                store.tasks(**bad)  # (each read every task)
        assert len(store.tasks(limit=1)) == 1
        # Ids past the service's bound: the database's OverflowError (SQLite) or DataError
        # with its statement (PostgreSQL) came through, exit 1 from the CLI.
        too_large = 2**31
        with pytest.raises(LocalInputError, match=r"offset: must be within 0\.\.2147483647"):
            store.tasks(offset=10**20)
        refused = r"task_id: must be within 1\.\.2147483647"
        for read in (store.task, store.curve, store.all_trials):
            for task_id in (0, too_large, 10**20):
                with pytest.raises(LocalInputError, match=refused):
                    read(task_id)
    for command in (["curve", "99999999999999999999"], ["tasks", "--offset", str(10**20)]):
        result = cli.invoke(app, command)
        assert result.exit_code == 2 and "must be within" in result.output, result.output
    export = ["export", "--task", str(too_large), "--format", "t4", "--out", "x.t4.json"]
    result = cli.invoke(app, export)
    assert result.exit_code == 2 and "--task: must be within" in result.output, result.output


def test_an_interrupted_tuning_cancels_its_task(home: Path):
    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pipetune.tune(FC, "h100", budget=16, runner="simulated", progress=stop_after_three)
    with LocalStore() as store:
        (task,) = store.tasks()
        assert task.state == "cancelled" and task.trials_done == 3
        states = {t.state for t in store.all_trials(task.id)}
    assert states <= {JobState.DONE, JobState.FAILED, JobState.CANCELLED}  # none queued, leased
    engine = create_engine(store.url)
    with engine.connect() as conn:
        assert conn.scalar(select(TaskRow.finished_at)) is not None
    engine.dispose()


def test_a_tuning_stopped_by_sigterm_cancels_its_task(home: Path):
    """SIGTERM (`kill`, `timeout`, a batch scheduler) ended the process at once: its task
    stayed `running` for good, its trials leased, and no command cancels a task of the
    local database. It now cancels the task as Ctrl-C does and exits 143; a tuning that
    ends leaves SIGTERM's handler as it found it."""
    code = (
        "import os, signal, pipetune\n"
        "pipetune.tune({'op': 'gemm', 'm': 256, 'n': 64, 'k': 256}, 'h100', budget=4, "
        "runner='simulated')\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
        "def stop_after_three(done, total):\n"
        "    if done == 3:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        f"pipetune.tune({FC!r}, 'h100', budget=16, runner='simulated', "
        "progress=stop_after_three)\n"
    )
    done = _run(code)
    assert done.returncode == 128 + 15, done.stderr
    with LocalStore() as store:
        finished, stopped = sorted(store.tasks(), key=lambda t: t.id)
        assert finished.state == "done"
        assert stopped.state == "cancelled" and stopped.trials_done == 3
        states = {t.state for t in store.all_trials(stopped.id)}
    assert states <= {JobState.DONE, JobState.FAILED, JobState.CANCELLED}  # none queued, leased


def test_a_tuning_killed_outright_has_its_task_cancelled_by_the_next_one(
    home: Path, monkeypatch: pytest.MonkeyPatch
):
    """SIGKILL cannot be caught: the task of a tuning killed so stayed `running` for good in
    the local database, its trials leased or queued for a worker that would never come. The
    next tuning on that database and host finds tasks leased by an in-process worker whose
    process is gone and silent for a lease TTL, and cancels them (their trials kept)."""
    code = (
        "import os, signal, pipetune\n"
        "def killed_after_three(done, total):\n"
        "    if done == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        f"pipetune.tune({FC!r}, 'h100', budget=16, runner='simulated', "
        "progress=killed_after_three)\n"
    )
    killed = _run(code)
    assert killed.returncode == -9, killed.stderr
    with LocalStore() as store:
        (orphan,) = store.tasks()
        assert orphan.state == "running" and orphan.trials_done == 3
    # Heard of within a lease TTL (120 s): it may be a process of another pid namespace.
    pipetune.tune({**FC, "m": 768}, "h100", budget=1, runner="simulated")
    with LocalStore() as store:
        assert {t.id: t.state for t in store.tasks()}[orphan.id] == "running"
    monkeypatch.setenv("PIPETUNE_LEASE_TTL_S", "1")
    time.sleep(1.5)
    result = pipetune.tune({**FC, "m": 512}, "h100", budget=2, runner="simulated")
    with LocalStore() as store:
        tasks = {t.id: t for t in store.tasks()}
        assert tasks[result.task_id].state == "done"
        assert tasks[orphan.id].state == "cancelled" and tasks[orphan.id].trials_done == 3
        states = {t.state for t in store.all_trials(orphan.id)}
    assert states <= {JobState.DONE, JobState.FAILED, JobState.CANCELLED}  # none queued, leased


# ---- the CLI's read commands on the local database ----------------------------------------


def test_tasks_and_curve_read_the_local_database(home: Path, tmp_path: Path):
    result = pipetune.tune(FC, "h100", budget=5, runner="simulated")
    listed = cli.invoke(app, ["tasks", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [t["id"] for t in json.loads(listed.stdout)["tasks"]] == [result.task_id]
    # (the title wraps before a long database URL: a home under a long temporary folder)
    table = " ".join(cli.invoke(app, ["tasks"]).stdout.split())
    assert "tasks at local database sqlite:///" in table and "simulated" in table

    text = cli.invoke(app, ["curve", str(result.task_id)])
    assert text.exit_code == 0 and "simulated runner: analytical model + noise" in text.stdout
    points = json.loads(cli.invoke(app, ["curve", str(result.task_id), "--json"]).stdout)
    assert [p["best_latency_us"] for p in points["points"]] == result.best_so_far()

    missing = cli.invoke(app, ["curve", "987"])
    assert missing.exit_code == 2 and "task 987 does not exist in sqlite:///" in missing.stderr
    bad_state = cli.invoke(app, ["tasks", "--state", "bogus"])
    assert bad_state.exit_code == 2 and bad_state.stderr.startswith("error: --state: must be")
    both = cli.invoke(app, ["tasks", "--server", "http://127.0.0.1:9", "--db", "sqlite://"])
    assert both.exit_code == 2 and "not both" in both.stderr


def test_a_named_database_is_read_instead(home: Path, tmp_path: Path):
    other = f"sqlite:///{tmp_path / 'other.db'}"
    pipetune.tune(FC, "h100", budget=3, strategy="random", runner="simulated", db=other)
    here = json.loads(cli.invoke(app, ["schedule", *FC_ARGS, "--json"]).stdout)
    there = json.loads(cli.invoke(app, ["schedule", *FC_ARGS, "--json", "--db", other]).stdout)
    assert here["source"] == "model" and there["source"] == "measured"


def test_a_runner_object_is_used_and_left_open(home: Path):
    from pipetune.workers.runners import SimulatedRunner

    with SimulatedRunner("h100", time_scale=0) as mine:
        result = pipetune.tune(FC, "h100", budget=2, strategy="random", runner=mine)
        assert len(result.trials) == 2 and not mine.closed
        with pytest.raises(ValueError, match="runner: measures h100, the task is for a100"):
            pipetune.tune(FC, "a100", budget=2, runner=mine)

    class Renamed(SimulatedRunner):
        name = "mine"

    renamed_error = pytest.raises(ValueError, match=r"runner: its \.name must be one of .*'mine'")
    with Renamed("h100", time_scale=0) as renamed, renamed_error:
        pipetune.tune(FC, "h100", budget=2, runner=renamed)


def test_every_workload_type_the_api_accepts_is_exported_under_the_name_it_gives():
    """The error for a wrong workload named pipetune.Softmax, Reduce, LayerNorm and BiasGelu,
    which `pipetune` did not export (an AttributeError for a user who followed it)."""
    from pipetune.clients.library.inputs import WORKLOAD_TYPES

    assert {t.__name__ for t in WORKLOAD_TYPES} >= {"Gemm", "Softmax", "HopperGemm"}
    for workload_type in WORKLOAD_TYPES:
        assert getattr(pipetune, workload_type.__name__) is workload_type
        assert workload_type.__name__ in pipetune.__all__
    with pytest.raises(TypeError) as error:
        pipetune.tune("gemm", "h100")
    for named in re.findall(r"pipetune\.(\w+)", str(error.value)):
        assert hasattr(pipetune, named), named
    assert pipetune.best_schedule(pipetune.Softmax(rows=4096, cols=768), "h100").schedule_id


def test_a_replay_of_a_partial_recording_is_refused_before_any_trial(home: Path, tmp_path: Path):
    """A sweep of 3 schedules of the space (--limit) was accepted: each schedule it lacks was
    a failed trial (runtime_error, "not in dataset") spending the budget, recorded as a
    failure on the GPU."""
    recorded = tmp_path / "fc.t4.json.gz"
    sweep = ["sweep", *FC_ARGS, "--runner", "simulated", "--limit", "3", "--out", str(recorded)]
    assert cli.invoke(app, sweep).exit_code == 0
    with pytest.raises(pipetune.InvalidArgumentError, match=r"holds 3 of the \d+ schedules") as e:
        pipetune.tune(FC, "h100", budget=5, runner="replay", dataset=recorded)
    assert e.value.argument == "dataset"
    from pipetune.workers.runners.replay import ReplayRunner

    own = ReplayRunner(recorded, workload=parse_workload(FC), gpu="h100")  # (an object)
    with own, pytest.raises(pipetune.InvalidArgumentError, match=r"holds 3 of the \d+"):
        pipetune.tune(FC, "h100", budget=5, runner=own)
    with LocalStore() as store:
        assert store.tasks() == []
