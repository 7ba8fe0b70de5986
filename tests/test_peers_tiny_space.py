"""Kernel Tuner's peers on a space of one configuration.

Simulated annealing and greedy ILS failed there ("StopCriterionReached: max_fevals (1)
reached"): Kernel Tuner cuts max_fevals to the space's size, so raising it to
KT_LEAST_FEVALS did not keep their start point inside their stop handling, and each was left
out of the whole benchmark. Their run is that one configuration.

Firefly, particle swarm, differential evolution and Bayesian optimisation fail there in
Kernel Tuner's own code: each is left out of the run and said so beside the table, with the
library's reason, never a traceback or a row missing without a word."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.tuner.peers import run_peer
from pipetune.tuner.recorded import RecordedConfigs

pytest.importorskip("kernel_tuner")  # (installed with pipetune's `peers` extra)

FAIL_IN_KERNEL_TUNER = ("kt_firefly_algorithm", "kt_pso", "kt_diff_evo", "kt_bayes_opt")


@pytest.mark.parametrize("peer", ["kt_simulated_annealing", "kt_greedy_ils"])
def test_a_peer_whose_start_point_is_the_whole_space_gives_that_configuration(peer):
    one = RecordedConfigs("one", {"bx": [32, 64], "flag": [0]}, [{"bx": 64, "flag": 0}],
                          np.array([2.0]))  # fmt: skip
    for budget in (1, 5):
        np.testing.assert_array_equal(run_peer(peer, one, 0, budget), one.throughput)


def test_a_peer_that_fails_in_its_own_code_on_one_configuration_is_left_out_and_said(tmp_path):
    cache = {
        "device_name": "Test GPU",
        "kernel_name": "k",
        "problem_size": [64],
        "tune_params_keys": ["bx"],
        "tune_params": {"bx": [32]},
        "objective": "time",
        "cache": {"32": {"bx": 32, "time": 1.0}},
    }
    path = tmp_path / "k.json"
    path.write_text(json.dumps(cache))
    strategies = ",".join(("random", "kt_simulated_annealing", *FAIL_IN_KERNEL_TUNER))
    argv = ["bench", "tuner", str(path), "--strategies", strategies, "--budgets", "1,2"]
    result = CliRunner().invoke(app, [*argv, "--seeds", "1"], terminal_width=200)
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if line.startswith("left out: ")]
    assert [line.split()[2] for line in said] == list(FAIL_IN_KERNEL_TUNER)
    assert all(" failed on k (1 configurations): " in line for line in said), said
    assert "Traceback" not in result.output
    assert "kt_simulated_annealing" in result.stdout and "kt_pso" not in result.stdout
    doc = json.loads(CliRunner().invoke(app, [*argv, "--seeds", "1", "--json"]).stdout)
    assert doc["strategies"] == ["random", "kt_simulated_annealing"]
    assert sorted(doc["left_out"]) == sorted(FAIL_IN_KERNEL_TUNER)
