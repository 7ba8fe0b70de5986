"""`pipetune bench tuner --batch / --prior / --jobs`, and its tables (per dataset, geomean,
P score line, standard errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_datasets import SHARED
from typer.testing import CliRunner

from pipetune.clients.cli.main import app

runner = CliRunner()
CONV_3090 = SHARED / "convolution_RTX_3090.kt-cache.json.gz"
CONV_TITAN = SHARED / "convolution_RTX_Titan.kt-cache.json.gz"
PNPOLY_3090 = SHARED / "pnpoly_RTX_3090.kt-cache.json.gz"
needs_files = pytest.mark.skipif(
    not all(p.exists() for p in (CONV_3090, CONV_TITAN, PNPOLY_3090)),
    reason="shared datasets are not next to this checkout",
)


def _bench(*extra: str):
    return runner.invoke(
        app, ["bench", "tuner", "--budgets", "5,10", "--seeds", "2", *extra], terminal_width=200
    )


@needs_files
def test_tables_per_dataset_with_standard_errors_and_p_score_line():
    result = _bench(str(CONV_TITAN), "--strategies", "random,auto", "--batch", "4")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "convolution_RTX_Titan: best-in-k" in out
    assert "random (exact expectation)" in out
    assert "geomean of 1 datasets" in out
    assert "P score" in out and "±" in out
    assert "proposes 4 trial(s) per round" in out


@needs_files
def test_prior_from_the_same_kernel_on_another_gpu():
    result = _bench(str(CONV_TITAN), "--strategies", "auto", "--prior", str(CONV_3090), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["priors"] == {"convolution_RTX_Titan": "convolution_RTX_3090"}
    assert doc["batch"] == 8


@needs_files
def test_a_prior_of_a_tasks_trials():
    result = _bench(
        str(CONV_TITAN), "--strategies", "auto", "--prior", str(CONV_3090), "--prior-trials",
        "20", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["priors"] == {"convolution_RTX_Titan": "convolution_RTX_3090 (20 trials of auto)"}
    alone = _bench(str(CONV_TITAN), "--strategies", "auto", "--prior-trials", "20")
    assert alone.exit_code == 2
    assert "--prior-trials: give the --prior dataset the trials are taken from" in alone.output


@needs_files
def test_a_prior_of_another_kernel_is_refused_with_exit_2():
    result = _bench(str(CONV_TITAN), "--strategies", "auto", "--prior", str(PNPOLY_3090))
    assert result.exit_code == 2
    assert (
        f"--prior: for convolution_RTX_Titan, no file fits ({PNPOLY_3090.name}: other knobs)"
        in result.output
    )


@needs_files
def test_a_prior_no_strategy_of_the_run_takes_is_refused_with_exit_2(tmp_path):
    """`--strategies random --prior F` ran without a word, as if the prior were compared."""
    result = _bench(str(CONV_TITAN), "--strategies", "random", "--prior", str(CONV_3090))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --prior: none of the strategies run (random) takes a prior; bo, "
        "analytical+xgb, auto do"
    )
    learned = _bench(str(CONV_TITAN), "--strategies", "random", "--learned-prior", str(tmp_path))
    assert learned.exit_code == 2 and "error: --learned-prior: none of the" in learned.stderr


@needs_files
def test_batch_must_be_positive():
    result = _bench(str(CONV_TITAN), "--batch", "0")
    assert result.exit_code == 2


@needs_files
def test_early_proposals_are_run_and_said_beside_the_table():
    """--early N: each batch from the second on is proposed with N trials of the one before
    unmeasured; the JSON records it and the caption says so; a negative N is refused."""
    whole = _bench(str(CONV_TITAN), "--strategies", "auto", "--batch", "4", "--json")
    early = _bench(str(CONV_TITAN), "--strategies", "auto", "--batch", "4", "--early", "2")
    assert whole.exit_code == 0 and early.exit_code == 0, early.output
    assert "each while 2 of the round before are unmeasured" in " ".join(early.output.split())
    doc = json.loads(
        _bench(
            str(CONV_TITAN), "--strategies", "auto", "--batch", "4", "--early", "2", "--json"
        ).output
    )
    assert doc["early"] == 2 and json.loads(whole.output)["early"] == 0
    assert _bench(str(CONV_TITAN), "--early", "-1").exit_code == 2
    # More than a batch but one: it was cut to batch - 1 without a word (one trial a round,
    # none unmeasured, whatever --early said: the caption once said 2).
    single = _bench(str(CONV_TITAN), "--strategies", "auto", "--batch", "1", "--early", "2")
    assert single.exit_code == 2
    assert "--early: at most --batch - 1 (0)" in " ".join(single.output.split())
    many = _bench(str(CONV_TITAN), "--seeds", "99999999999999999999")
    assert many.exit_code == 2 and "--seeds" in many.output


MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "data"


def test_datasets_of_one_name_in_two_folders_are_kept_apart():
    # The same operator measured on two GPUs: the results were kept per file stem, so the
    # second file's figures were reported for both (and a "geomean of 2" of one of them).
    files = [str(MEASURED / gpu / "MM_RN50_FC.t4.json.gz") for gpu in ("h100", "h200")]
    result = _bench(*files, "--strategies", "random", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["datasets"] == ["h100/MM_RN50_FC", "h200/MM_RN50_FC"]
    for row in doc["results"]:
        assert set(row["per_dataset"]) == set(doc["datasets"])
    for name, file in zip(doc["datasets"], files, strict=True):
        alone = json.loads(_bench(file, "--strategies", "random", "--json").stdout)["results"]
        for row, own in zip(doc["results"], alone, strict=True):
            assert row["per_dataset"][name] == own["per_dataset"]["MM_RN50_FC"]


def test_one_file_given_twice_is_refused():
    file = str(MEASURED / "h100" / "MM_RN50_FC.t4.json.gz")
    result = _bench(file, file, "--strategies", "random")
    assert result.exit_code == 2
    assert "given twice" in result.output


def _kt_cache(tmp_path: Path, times: list) -> Path:
    cache = {
        f"{bx},0": {"bx": bx, "flag": 0, "time": t} for bx, t in zip((32, 64), times, strict=False)
    }
    doc = {
        "device_name": "Test GPU",
        "kernel_name": "k",
        "problem_size": [64],
        "tune_params_keys": ["bx", "flag"],
        "tune_params": {"bx": [32, 64], "flag": [0]},
        "objective": "time",
        "cache": cache,
    }
    path = tmp_path / "k.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("times", "said"),
    [
        ([], "no configuration recorded"),  # an IndexError from the annealer's sampler
        (["CompilationFailedConfig", "RuntimeFailedConfig"], "every configuration failed"),
    ],
)  # (all failed: exit 0 with a table of NaN)
def test_a_dataset_where_nothing_ran_is_refused_with_exit_2(tmp_path, times, said):
    result = _bench(str(_kt_cache(tmp_path, times)), "--strategies", "random")
    assert result.exit_code == 2, result.output
    assert said in result.output


DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
GELU = "BiasGELU_BERT_b1_s128.t4.json.gz"  # 228 configurations on each GPU


def test_a_prior_of_more_trials_than_its_space_says_what_it_holds():
    """--prior-trials 1000 on a prior of 228 configurations: the caption said "1000 trials"
    where the prior held 228; budgets over a space's size were capped and said nowhere."""
    args = ["bench", "tuner", str(DATA / "h100" / GELU), "--strategies", "auto", "--seeds", "1"]
    args += ["--prior", str(DATA / "h200" / GELU), "--prior-trials", "1000", "--budgets", "8,300"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["priors"] == {"BiasGELU_BERT_b1_s128": "BiasGELU_BERT_b1_s128 (228 trials of auto)"}
    assert doc["configurations"] == {"BiasGELU_BERT_b1_s128": 228}
    table = runner.invoke(app, args, terminal_width=300)
    assert table.exit_code == 0, table.output
    said = " ".join(table.output.split())
    assert "(228 configurations: a budget over that measures them all)" in said
    small = runner.invoke(app, [*args[:-1], "8", "--json"])
    assert small.exit_code == 0 and "configurations: a budget" not in small.output


def test_jobs_and_batch_beyond_what_can_run_are_refused():
    """--jobs 100000 started that many processes (the memory filled); --batch 100000 was a
    batch no task can have (the service's range is 1..64)."""
    from pipetune.clients.cli.bench_cmds import max_jobs

    args = ["bench", "tuner", str(DATA / "h100" / GELU), "--strategies", "random", "--seeds", "1"]
    many = runner.invoke(app, [*args, "--jobs", str(max_jobs() + 1)])
    assert many.exit_code == 2 and f"--jobs: at most {max_jobs()} here" in many.output
    big = runner.invoke(app, [*args, "--batch", "65"])
    assert big.exit_code == 2 and "--batch" in big.output
    fine = runner.invoke(app, [*args, "--budgets", "4", "--jobs", str(max_jobs()), "--json"])
    assert fine.exit_code == 0, fine.output
    assert "note:" not in fine.stderr  # (a note on --learned-prior, which was not given)


def _cache(path: Path, device: str, time_of) -> Path:
    """A small Kernel Tuner cache of one kernel on one device (times from ``time_of``)."""
    sizes, tiles = [32, 64, 128, 256], [1, 2, 4]
    cache = {}
    for bx in sizes:
        for tile in tiles:
            cache[f"{bx},{tile}"] = {"bx": bx, "tile": tile, "time": time_of(bx, tile)}
    document = {
        "device_name": device, "kernel_name": "kern", "problem_size": [4096],
        "tune_params_keys": ["bx", "tile"], "tune_params": {"bx": sizes, "tile": tiles},
        "objective": "time", "cache": cache,
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_a_prior_is_told_from_the_dataset_by_its_measurements_not_its_file_name(tmp_path):
    # The same kernel's caches from two GPUs are often both kern.json: the other GPU's was
    # refused as "the dataset itself", and a renamed copy was taken as a prior.
    mine = _cache(tmp_path / "a" / "kern.json", "GPU A", lambda bx, t: 1.0 + abs(bx - 64) / 64 + t)
    other = _cache(
        tmp_path / "b" / "kern.json", "GPU B", lambda bx, t: 2.0 + abs(bx - 128) / 64 + t
    )
    result = _bench(str(mine), "--strategies", "auto", "--prior", str(other), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["priors"] == {"kern": "kern"}
    copy = tmp_path / "copy.json"
    copy.write_bytes(mine.read_bytes())
    result = _bench(str(mine), "--strategies", "auto", "--prior", str(copy))
    assert result.exit_code == 2
    assert "copy.json: the dataset itself (the same measurements)" in result.output


def test_a_prior_where_nothing_ran_is_refused_with_exit_2(tmp_path):
    mine = _cache(tmp_path / "a" / "kern.json", "GPU A", lambda bx, t: 1.0 + t)
    failed = _cache(tmp_path / "b" / "kern.json", "GPU B", lambda bx, t: "RuntimeFailedConfig")
    result = _bench(str(mine), "--strategies", "auto", "--prior", str(failed))
    assert result.exit_code == 2, result.output
    assert "--prior: prior kern: no configuration of this space ran there" in result.output


def test_a_peer_that_fails_on_a_space_is_left_out_and_said(tmp_path, monkeypatch):
    # Kernel Tuner's differential evolution raised IndexError on a dozen configurations and
    # the whole run ended with exit 1 and the exception's name.
    from pipetune.tuner import peers

    def broken(name, recorded, seed, budget):
        raise IndexError("list index out of range")

    monkeypatch.setattr(peers, "run_kernel_tuner", broken)
    mine = _cache(tmp_path / "kern.json", "GPU A", lambda bx, t: 1.0 + abs(bx - 64) / 64 + t)
    result = _bench(str(mine), "--strategies", "auto,kt_random_sample")
    assert result.exit_code == 0, result.output
    assert (
        "left out: kt_random_sample failed on kern (12 configurations): IndexError: list index "
        "out of range" in result.stderr
    )
    assert "kt_random_sample" not in result.stdout and "auto" in result.stdout
    alone = _bench(str(mine), "--strategies", "kt_random_sample")
    assert alone.exit_code == 2
    assert "--strategies: kt_random_sample failed on kern" in alone.stderr


def test_a_figure_the_same_on_every_seed_is_said_to_be_one_run(tmp_path):
    # A deterministic search (here grid; auto with a prior on pipetune's own datasets) read
    # "± 0.000" as though 20 seeds had measured it precisely.
    mine = _cache(tmp_path / "kern.json", "GPU A", lambda bx, t: 1.0 + abs(bx - 64) / 64 + t)
    result = _bench(str(mine), "--strategies", "grid")
    assert result.exit_code == 0, result.output
    assert "± 0.000: the same figure on every seed" in " ".join(result.stdout.split())


def test_a_bad_peer_time_limit_is_refused_with_exit_2(monkeypatch):
    monkeypatch.setenv("PIPETUNE_PEER_TIME_LIMIT_S", "soon")
    data = Path(__file__).resolve().parent.parent / "benchmarks/data/h200/MM_RN50_FC.t4.json.gz"
    result = _bench(str(data), "--strategies", "kt_random_sample")
    assert result.exit_code == 2
    assert "PIPETUNE_PEER_TIME_LIMIT_S must be a positive number of seconds" in result.output
    # Without a peer the variable is not read.
    result = _bench(str(data), "--strategies", "random")
    assert result.exit_code == 0, result.output


def test_the_default_strategies_on_another_kernels_cache_leave_the_models_out(tmp_path):
    """`ours` (the default) on a Kernel Tuner cache: the strategies that need the analytical
    model are left out, with the reason, and the rest run (the default refused the cache);
    a strategy named on its own that cannot run is still refused."""
    cache = _cache(tmp_path / "kern.json", "GPU A", lambda bx, t: 1.0 + abs(bx - 64) / 64 + t)
    result = _bench(str(cache), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "analytical" not in doc["strategies"] and "auto" in doc["strategies"]
    assert set(doc["left_out"]) == {"analytical", "analytical+xgb"}
    assert "needs the analytical model" in doc["left_out"]["analytical"]
    shown = _bench(str(cache))
    assert shown.exit_code == 0 and "left out: analytical: needs" in shown.output
    refused = _bench(str(cache), "--strategies", "ours,analytical")
    assert refused.exit_code == 2 and "not a pipetune dataset: analytical" in refused.output


def _one_knob_cache(tmp_path: Path, values: list, times: list[float]) -> Path:
    cache = {str(v): {"v": v, "time": t} for v, t in zip(values, times, strict=True)}
    doc = {
        "device_name": "Test GPU",
        "kernel_name": "k",
        "problem_size": [64],
        "tune_params_keys": ["v"],
        "tune_params": {"v": values},
        "objective": "time",
        "cache": cache,
    }
    path = tmp_path / "k.json"
    path.write_text(json.dumps(doc))
    return path


def test_knob_values_equal_in_value_but_not_in_type_are_refused_with_exit_2(tmp_path):
    # 1, 1.0 and True are three configurations in the file (three cache keys), one to the
    # search (rows by value): Optuna's trials of 1 or 1.0 were scored with True's time, the
    # optimum, and best-in-1 read 1.0 on every seed.
    path = _one_knob_cache(tmp_path, [1, 1.0, True, 2], [5.0, 4.0, 1.0, 3.0])
    result = _bench(str(path), "--strategies", "random")
    assert result.exit_code == 2, result.output
    assert f"{path}: knob 'v' has values 1 and 1.0" in result.output
    assert "Traceback" not in result.output


def test_a_value_listed_twice_in_tune_params_is_one_value(tmp_path):
    # Kernel Tuner's search space (every KT peer) refused the duplicate configurations a
    # repeated value makes: every KT peer was left out of the run.
    path = _one_knob_cache(tmp_path, [1, 2, 3], [5.0, 4.0, 1.0])
    doc = json.loads(path.read_text())
    doc["tune_params"]["v"] = [1, 1, 2, 3]
    path.write_text(json.dumps(doc))
    result = _bench(str(path), "--strategies", "kt_random_sample", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["left_out"] == {}


def test_a_t4_files_numeric_knobs_keep_their_numeric_order(tmp_path):
    # A T4 file lists no knob values (a Kernel Tuner cache does): they were ordered as text
    # (1, 16, 2, 32, 4, 8), so the search's ordered knobs had the wrong neighbours and the
    # same space scored otherwise as a T4 file than as the cache it was converted from.
    from pipetune.clients.cli.bench_cmds import recorded_dataset
    from pipetune.workers.datasets import Dataset, load_dataset, write_t4

    sizes = [1, 2, 4, 8, 16, 32]
    cache = {
        f"{bx},{by}": {"bx": bx, "by": by, "time": 1.0 + abs(bx - 8) + abs(by - 4) / 10}
        for bx in sizes
        for by in sizes
    }
    doc = {
        "device_name": "Test GPU",
        "kernel_name": "k",
        "problem_size": [64],
        "tune_params_keys": ["bx", "by"],
        "tune_params": {"bx": sizes, "by": sizes},
        "objective": "time",
        "cache": cache,
    }
    kt = tmp_path / "cache" / "k.json"
    kt.parent.mkdir()
    kt.write_text(json.dumps(doc))
    t4 = tmp_path / "k.t4.json"
    # (as the benchmark hub's T4 files: no Kernel Tuner header, which would list the values)
    write_t4(Dataset(load_dataset(kt).records), t4)
    assert recorded_dataset(t4).configs.tune_params == {"bx": sizes, "by": sizes}
    figures = []
    for path in (kt, t4):
        result = _bench(str(path), "--strategies", "bo,kt_greedy_ils", "--json")
        assert result.exit_code == 0, result.output
        figures.append(
            [r["per_dataset"]["k"]["per_seed"] for r in json.loads(result.stdout)["results"]]
        )
    assert figures[0] == figures[1]


def _without_packages(monkeypatch, *missing: str) -> None:
    """find_spec as where `missing` are not installed."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a)
    )


def test_a_named_peer_whose_package_is_missing_is_refused_before_anything_runs(
    tmp_path, monkeypatch
):
    # It was found missing only once the strategies before it had run, and ended the
    # benchmark as an unexpected error: "error: PeerUnavailableError: ...", exit 1.
    _without_packages(monkeypatch, "torch")
    path = _one_knob_cache(tmp_path, [1, 2, 3], [5.0, 4.0, 1.0])
    result = _bench(str(path), "--strategies", "random,optuna_gp")
    assert result.exit_code == 2, result.output
    assert "--strategies: optuna_gp cannot run here: Optuna's GPSampler needs PyTorch" in (
        result.output
    )
    assert "PeerUnavailableError" not in result.output


def test_a_groups_peers_whose_packages_are_missing_are_left_out_and_said(tmp_path, monkeypatch):
    _without_packages(monkeypatch, "kernel_tuner", "optuna", "smac")
    path = _one_knob_cache(tmp_path, [1, 2, 3], [5.0, 4.0, 1.0])
    result = _bench(str(path), "--strategies", "random,peers", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["strategies"] == ["random"]
    assert doc["left_out"]["kt_random_sample"] == (
        "kt_random_sample: kernel_tuner is not installed: pip install 'pipetune[peers]'"
    )
    assert doc["left_out"]["smac"] == "smac: smac is not installed: pip install 'pipetune[peers]'"


def test_peers_whose_packages_are_all_missing_are_refused_with_each_reason_once(
    tmp_path, monkeypatch
):
    # `--strategies peers` without the extra said "kernel_tuner is not installed: ..." once
    # per Kernel Tuner strategy, 18 times in one line.
    _without_packages(monkeypatch, "kernel_tuner", "optuna", "smac")
    path = _one_knob_cache(tmp_path, [1, 2, 3], [5.0, 4.0, 1.0])
    result = _bench(str(path), "--strategies", "peers")
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    for module in ("kernel_tuner", "optuna", "smac"):
        assert line.count(f"{module} is not installed") == 1, line


def test_a_prior_whose_first_trials_all_failed_is_refused_with_exit_2(tmp_path):
    # auto's first trials on the prior (a task per seed, made as the run goes) all failed:
    # "error: TransferError: ... (set PIPETUNE_DEBUG=1 for the traceback)", exit 1, after
    # the strategies before the first one that takes a prior had run.
    values = list(range(20))
    prior = tmp_path / "prior" / "k.json"
    prior.parent.mkdir()
    doc = json.loads(_one_knob_cache(tmp_path, values, [1.0] * len(values)).read_text())
    for key, entry in doc["cache"].items():
        entry["time"] = 1.0 if key == "19" else "RuntimeFailedConfig"  # one success of 20
    prior.write_text(json.dumps(doc))
    dataset = _one_knob_cache(tmp_path, values, [1.0 + v / 10 for v in values])
    result = _bench(
        str(dataset), "--strategies", "random,auto", "--prior", str(prior), "--prior-trials", "2"
    )
    assert result.exit_code == 2, result.output
    assert "--prior-trials: prior k (2 trials of auto): no configuration of this space ran" in (
        result.output
    )
    assert "TransferError" not in result.output


def test_one_seed_shows_no_standard_error():
    """Over one seed every cell read "± 0.000", as if the figure were exact: a standard
    error of one run is undefined, so none is shown, and the caption says why."""
    from pipetune.clients.cli.bench_cmds import _cell

    assert _cell(0.8214, 0.0, 1) == "0.821"
    assert _cell(0.8214, 0.0123, 2) == "0.821 ± 0.012"
    assert _cell(-0.061, 0.02, 1, 2, "+") == "-0.06"


def test_a_p_score_where_random_search_reaches_every_optimum_is_undefined(tmp_path):
    """Two configurations and budgets of 2: random search finds each optimum, so (strategy -
    random) / (optimum - random) is 0/0. It read "+0.00 ± 0.00", exactly as good as random."""
    cache = _kt_cache(tmp_path, [1.0, 2.0])
    args = ["--strategies", "random,grid", "--budgets", "2", "--seeds", "2"]
    doc = json.loads(_bench(str(cache), *args, "--json").stdout)
    for row in doc["results"]:
        assert (row["p_score"], row["p_se"]) == (None, None)
        assert row["per_dataset"]["k"]["p_score"] is None
    table = _bench(str(cache), *args)
    assert table.exit_code == 0, table.output
    p_lines = [line for line in table.stdout.splitlines() if "  P score " in line]
    assert len(p_lines) == 2 and all("n/a" in line and "0.00" not in line for line in p_lines)
