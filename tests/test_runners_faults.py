"""Faults rehearsed on a CPU (workers.runners.faults): the simulated runner's measuring
child dies of SIGSEGV or hangs for the schedules a FaultPlan picks; those trials are failed
trials recorded as the cupy runner records them, and the runner goes on measuring."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.space import Space
from pipetune.model.workloads import gemm
from pipetune.service.local_workers import _check_worker_environment
from pipetune.workers.daemon import WorkerConfig
from pipetune.workers.runners import RunnerSettingError, SimulatedRunner
from pipetune.workers.runners.faults import FAULTS_ENV, FaultPlan

WORKLOAD = gemm(1024, 64, 2048)


def test_a_plan_parses_and_refuses_what_it_cannot_read():
    assert FaultPlan.parse("crash=0.2,hang=0.1,seed=3") == FaultPlan(0.2, 0.1, 3)
    assert FaultPlan.parse("hang=0.5") == FaultPlan(0.0, 0.5, 0)
    for bad, reason in [
        ("crash=2", "within 0..1"),
        ("crash=0.7,hang=0.7", "at most 1"),
        ("crash=lots", "not a number"),
        ("boom=0.1", "expected crash=FRACTION"),
        ("crash=0.1,crash=0.2", "expected crash=FRACTION"),
    ]:
        with pytest.raises(ValueError, match=reason):
            FaultPlan.parse(bad)


def test_a_plan_picks_its_fractions_deterministically():
    plan = FaultPlan(crash=0.2, hang=0.1, seed=1)
    picks = [plan.fault_of("w", f"s-{i}") for i in range(4000)]
    counts = Counter(picks)
    assert abs(counts["crash"] / 4000 - 0.2) < 0.03 and abs(counts["hang"] / 4000 - 0.1) < 0.03
    assert picks == [plan.fault_of("w", f"s-{i}") for i in range(4000)]
    assert picks != [FaultPlan(0.2, 0.1, seed=2).fault_of("w", f"s-{i}") for i in range(4000)]


def test_crashes_and_hangs_are_failed_trials_and_the_runner_goes_on(h100):
    plan = FaultPlan(crash=0.3, hang=0.2, seed=7)
    schedules = list(Space.enumerate(WORKLOAD, h100))[:40]
    kinds = {s.id: plan.fault_of(WORKLOAD.workload_hash, s.id) for s in schedules}
    # A few of each, crashes and hangs next to each other (a fresh child after each).
    chosen = [s for s in schedules if kinds[s.id] == "crash"][:2]
    chosen += [s for s in schedules if kinds[s.id] == "hang"][:2]
    chosen += [s for s in schedules if kinds[s.id] is None][:2]
    with (
        SimulatedRunner(h100, time_scale=0, faults=plan, trial_timeout_s=1.0) as faulty,
        SimulatedRunner(h100, time_scale=0) as clean,
    ):
        results = faulty.measure(WORKLOAD, chosen)
        expected = clean.measure(WORKLOAD, chosen)
        again = faulty.measure(WORKLOAD, chosen[-1:])  # still measuring after all that
        assert faulty.settings["faults"] == "crash=0.3,hang=0.2,seed=7"
    for schedule, got, want in zip(chosen, results, expected, strict=True):
        kind = kinds[schedule.id]
        if kind == "crash":
            assert got.status == "runtime_error" and "SIGSEGV" in (got.error or "")
        elif kind == "hang":
            assert got.status == "timeout" and "no answer within 1 s" in (got.error or "")
        else:
            assert got == want  # a trial that did not fault is exactly the clean answer
        assert got.runner == "simulated"
    assert again[0] == expected[-1]


def test_the_worker_refuses_bad_fault_options():
    cli = CliRunner()
    common = ["worker", "--token", "t", "--server", "http://127.0.0.1:9"]
    cupy = cli.invoke(app, [*common, "--runner", "cupy", "--simulate-faults", "crash=0.1"])
    assert cupy.exit_code == 2 and "only a simulated worker" in cupy.output
    bad = [*common, "--runner", "simulated", "--gpu", "h100", "--simulate-faults", "crash=x"]
    result = cli.invoke(app, bad)
    assert result.exit_code == 2 and "--simulate-faults: crash: not a number" in result.output


@pytest.mark.parametrize("value", ["", " ", "crash=0.1"])
@pytest.mark.parametrize("runner", ["cupy", "simulated"])
def test_serve_refuses_the_fault_variable_exactly_when_its_workers_do(monkeypatch, runner, value):
    """`serve --local-workers` checks the variable its workers read --simulate-faults from:
    it took an empty one for a plan (click reads it as unset) and refused to start cupy
    workers that would have run."""
    worker: Any = typer.main.get_command(app).commands["worker"]  # type: ignore[attr-defined]
    (option,) = [p for p in worker.params if p.name == "simulate_faults"]
    assert option.envvar == FAULTS_ENV
    monkeypatch.setenv(FAULTS_ENV, value)
    faults = option.resolve_envvar_value(worker.context_class(worker))  # as the worker reads it
    try:
        WorkerConfig(
            server="http://127.0.0.1:9",
            token="t",
            runner=runner,
            gpu="h100",
            simulate_faults=faults,
        )
    except ValueError:
        worker_refuses = True
    else:
        worker_refuses = False
    try:
        _check_worker_environment(runner)
    except RunnerSettingError:
        serve_refuses = True
    else:
        serve_refuses = False
    assert serve_refuses == worker_refuses
