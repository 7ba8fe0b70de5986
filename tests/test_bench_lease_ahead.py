"""The lease-ahead benchmark: it runs what it says (a task done on a fleet of worker daemons,
every batch's workers counted, the figures labelled simulated; no timing is asserted), and
refuses nonsensical options with exit 2."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_lease_ahead import main, run_once


def test_a_task_runs_to_its_budget_and_each_batch_names_its_workers():
    run = run_once(workers=2, budget=6, strategy="bo", lease_ahead=2, replicas=1, time_scale=0.0)
    assert run["state"] == "done" and run["trials_done"] == 6 and run["simulated"] is True
    batches = run["workers_per_batch"]
    assert isinstance(batches, list) and len(batches) == -(-6 // run["batch_size"])
    assert all(1 <= n <= 2 for n in batches)
    most, size = run["most_per_worker"], run["batch_size"]
    assert isinstance(most, list) and len(most) == len(batches)
    for b, (workers, m) in enumerate(zip(batches, most, strict=True)):
        trials = min(size, 6 - b * size)
        assert m <= trials <= m * workers  # (a batch's trials, one worker's at most m)
    assert run["wall_s"] > 0


def test_json_prints_one_object_per_run(capsys):
    main(["--workers", "1", "--budget", "2", "--time-scale", "0", "--repeats", "1",
          "--lease-ahead", "0", "--json"])  # fmt: skip
    (line,) = capsys.readouterr().out.splitlines()
    run = json.loads(line)
    assert run["lease_ahead"] == 0 and run["workers_per_batch"] == [1]
    assert run["most_per_worker"] == [2]  # (one worker: both trials)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--lease-ahead", "2,x"], "--lease-ahead must be integers separated by commas"),
        (["--lease-ahead", "-1"], "--lease-ahead must not be negative"),
        (["--time-scale", "1000"], "--time-scale must be within 0..100"),
        (["--strategy", "annealing"], "invalid choice"),
    ],
)
def test_a_bad_option_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
