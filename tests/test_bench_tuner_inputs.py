"""benchmarks/bench_tuner.py's modes on what they are given: runs of one file name, left-out
strategies, simulated datasets, settings `pipetune bench tuner` refuses, files that are not
run documents, and a peer's batch; every refusal exits 2 with the reason."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_tuner
from pipetune.clients.library.labels import SIMULATED_LABEL
from pipetune.model.wire import MAX_BATCH_SIZE
from pipetune.tuner.bench import Dataset, bench
from pipetune.tuner.peers import write_kt_cache
from pipetune.tuner.recorded import RecordedConfigs


def _configs(name: str = "tiny") -> RecordedConfigs:
    """A 12-configuration space, each knob's value changing the time."""
    knobs = {"a": [1, 2, 4], "b": [16, 32, 64, 128]}
    configs = [dict(zip(knobs, v, strict=True)) for v in itertools.product(*knobs.values())]
    times = [1.0 + abs(c["a"] - 2) + abs(c["b"] - 32) / 16 for c in configs]
    return RecordedConfigs(name, knobs, configs, np.array(times))


def _doc(strategies: tuple[str, ...] = ("random",), **kwargs) -> dict:
    return bench([Dataset("tiny", _configs())], list(strategies), [2, 4], seeds=2, **kwargs)


def _save(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_tuner", *map(str, argv)])
    bench_tuner.main()


def _refused(monkeypatch, capsys, *argv: str) -> str:
    """main's exit status 2, and what it said on stderr (whitespace folded)."""
    with pytest.raises(SystemExit) as exc:
        _main(monkeypatch, *argv)
    assert exc.value.code == 2
    return " ".join(capsys.readouterr().err.split())


def test_runs_of_one_file_name_are_told_apart_by_their_folder(tmp_path, monkeypatch, capsys):
    """render labelled each run by its file's stem: of x/run.json and y/run.json, the last
    one's rows were the only ones, and its peer strategy was gone without a word."""
    x = _save(tmp_path / "x" / "run.json", _doc(("random", "grid")))
    y = _save(tmp_path / "y" / "run.json", _doc(batch=1))
    table = bench_tuner.render([x, y])
    for label, strategy in (("x/run", "random"), ("x/run", "grid"), ("y/run", "random")):
        assert f"| {label} | {strategy} |" in table
    assert "- `x/run`: 2 seeds" in table and "- `y/run`: 2 seeds" in table
    compared = bench_tuner.compare([x, y], ("random", "random"))
    assert "A = `x/run` (random, batch 8), B = `y/run` (random, batch 1)" in compared
    said = _refused(monkeypatch, capsys, "render", x, tmp_path / "x" / ".." / "x" / "run.json")
    assert "render:" in said and "given twice" in said


def test_render_says_what_each_run_left_out_and_why(tmp_path):
    doc = _doc()
    why = "kt_diff_evo failed on tiny (12 configurations): IndexError: list index out of range"
    doc["left_out"] = {"kt_diff_evo": why, "analytical": "analytical: needs the model"}
    table = bench_tuner.render([_save(tmp_path / "run.json", doc)])
    runs = table.split("Runs:")[1]
    assert f"  - left out: {why}" in runs
    assert "  - left out: analytical: needs the model" in runs


def test_a_simulated_dataset_is_recorded_by_bench_and_said_by_render(tmp_path):
    """`pipetune bench tuner` marked a dataset of the analytical model's latencies; the
    script's `run` recorded nothing of it, and render had no label."""
    simulated = Dataset("sim", _configs("sim"), runner="simulated")
    doc = bench([simulated, Dataset("gpu", _configs("gpu"), runner="cupy")], ["random"], [2], 2)
    assert doc["simulated"] == ["sim"]
    table = bench_tuner.render([_save(tmp_path / "run.json", doc)])
    assert f"### sim ({SIMULATED_LABEL})" in table
    assert "### gpu\n" in table
    assert f"1 of the 2 datasets are {SIMULATED_LABEL}: sim." in table


def test_the_script_records_which_datasets_are_simulated(tmp_path, monkeypatch):
    cache = tmp_path / "tiny.kt-cache.json"
    write_kt_cache(_configs(), cache)
    out = tmp_path / "run.json"
    argv = ["run", "--datasets", cache, "--strategies", "random", "--budgets", "2"]
    _main(monkeypatch, *argv, "--seeds", "2", "--save", out)
    assert json.loads(out.read_text())["simulated"] == []  # (a Kernel Tuner cache: measured)


@pytest.mark.parametrize(
    ("option", "argv"),
    [
        ("--batch", ["--batch", "0"]),
        ("--batch", ["--batch", str(MAX_BATCH_SIZE + 1)]),
        ("--seeds", ["--seeds", "0"]),
        ("--early", ["--early", "-3"]),
        ("--early", ["--batch", "4", "--early", "4"]),  # was cut to 3 without a word
        ("--seeds", ["--seeds", "10001"]),  # was a MemoryError at 10^20
        ("--first-seed", ["--first-seed", "-1"]),
        ("--jobs", ["--jobs", "0"]),
        ("--prior-trials", ["--prior-trials", "5"]),
        ("--budgets", ["--budgets", "0"]),
        ("--budgets", ["--budgets", "x"]),
        ("--strategies", ["--strategies", "nosuch"]),
        ("optuna_gp cannot run here", ["--strategies", "optuna_gp"]),
        ("no such file", ["--datasets", "missing.json"]),
    ],
)
def test_run_refuses_what_pipetune_bench_tuner_refuses(option, argv, tmp_path, monkeypatch, capsys):
    """Each ran and wrote a document (--batch 0: best-in-k 0.0 everywhere, --seeds 0: NaN),
    ended in a traceback (--first-seed -1 with a peer, a peer without its package), or
    exited 1 as a failure would."""
    import pipetune.clients.cli.bench_cmds
    import pipetune.tuner.bench

    def no_bench(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(pipetune.tuner.bench, "bench", no_bench)
    # optuna_gp as where PyTorch is not installed, whether or not it is here.
    missing = {"optuna_gp": "Optuna's GPSampler needs PyTorch"}
    monkeypatch.setattr(pipetune.clients.cli.bench_cmds, "unavailable", missing.get)
    cache = tmp_path / "tiny.kt-cache.json"
    write_kt_cache(_configs(), cache)
    out = tmp_path / "run.json"
    base = ["--datasets", cache, "--strategies", "random", "--budgets", "2", "--seeds", "2"]
    said = _refused(monkeypatch, capsys, "run", *base, *argv, "--save", out)
    assert option in said
    assert not out.exists()


def test_merge_refusals_exit_2(tmp_path, monkeypatch, capsys):
    a = _save(tmp_path / "a.json", _doc())
    far = _save(tmp_path / "far.json", _doc(first_seed=5))
    said = _refused(monkeypatch, capsys, "merge", a, far, "--save", tmp_path / "all.json")
    assert "merge: the seed ranges must be consecutive" in said
    other = _save(tmp_path / "b.json", _doc(first_seed=2, batch=2))
    said = _refused(monkeypatch, capsys, "merge", a, other, "--save", tmp_path / "all.json")
    assert "merge: batch differ (8 against 2): runs of other settings do not pool" in said


@pytest.mark.parametrize("mode", ["merge", "compare", "render"])
@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("missing.json", "No such file or directory"),
        ("folder", "Is a directory"),
        ("broken.json", "not JSON"),
        ("list.json", "a JSON list, not an object"),
        ("kt.json", "no list 'results'"),
    ],
)
def test_a_file_that_is_no_run_document_is_refused_by_name(
    mode, bad, why, tmp_path, monkeypatch, capsys
):
    """A traceback each (FileNotFoundError, IsADirectoryError, JSONDecodeError, KeyError),
    exit 1."""
    good = _save(tmp_path / "good.json", _doc())
    (tmp_path / "folder").mkdir()
    (tmp_path / "broken.json").write_text('{"results": [')
    (tmp_path / "list.json").write_text("[1, 2]")
    write_kt_cache(_configs(), tmp_path / "kt.json")
    path = tmp_path / bad
    extra = ["--save", tmp_path / "all.json"] if mode == "merge" else []
    said = _refused(monkeypatch, capsys, mode, good, path, *extra)
    assert f"{mode}: {path}: not a bench_tuner run document ({why}" in said


def test_compare_says_a_peer_proposes_one_trial_at_a_time(tmp_path, monkeypatch, capsys):
    """The footer gave a peer the run's batch ("kt_random_sample, batch 8")."""
    a = _save(tmp_path / "a.json", _doc())
    peer = _doc()
    for r in peer["results"]:
        r["strategy"] = "kt_random_sample"  # (as a run of it saves its results)
    b = _save(tmp_path / "b.json", peer)
    _main(monkeypatch, "compare", a, b)
    out = " ".join(capsys.readouterr().out.split())
    assert "A = `a` (random, batch 8), B = `b` (kt_random_sample, batch 1 (peer))" in out
