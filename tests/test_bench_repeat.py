"""The repeatability report (benchmarks/bench_repeat.py): its measures on planted pairs, and
the report over the committed second H100 campaign."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_repeat
from benchmarks.bench_repeat import Pair
from benchmarks.campaign_data import DATA_DIR, OperatorData
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.workloads import gemm

REPEAT = DATA_DIR / "h100" / "repeat-2026-11-26"


def _operator(measured_of) -> OperatorData:
    workload = gemm(512, 256, 512)
    family = family_of(workload)
    space = family.enumerate(workload, get_gpu("h100"))
    base = OperatorData("planted", family, workload, space, np.zeros(len(space)), None)
    return OperatorData("planted", family, workload, space, measured_of(base.predicted_us), None)


def test_a_sweep_timed_again_with_a_uniform_drift_ranks_alike():
    first = _operator(lambda p: p.copy())
    pair = Pair(first, _operator(lambda p: p * 1.02))
    assert np.allclose(pair.log_ratios(), np.log(1.02))
    assert pair.spearman() == pytest.approx(1.0)
    assert pair.ranking_judged(1) == (1.0, 1.0)


def test_a_second_sweep_that_swaps_the_two_fastest_costs_the_first_rankings_top_1():
    first = _operator(lambda p: np.linspace(10.0, 20.0, len(p)))  # row 0 fastest, then row 1
    swapped = first.measured_us.copy()
    swapped[0] = swapped[1] * 1.05  # the old optimum now 5% behind the runner-up
    pair = Pair(first, _operator(lambda _: swapped))
    a_by_b, b_by_a = pair.ranking_judged(1)
    assert a_by_b == pytest.approx(1 / 1.05)
    assert b_by_a == pytest.approx(first.measured_us[0] / first.measured_us[1])
    assert pair.ranking_judged(2)[0] == 1.0


def test_failed_schedules_are_left_out_of_the_comparison():
    first = _operator(lambda p: p.copy())
    failing = first.measured_us.copy()
    failing[:5] = np.inf
    pair = Pair(first, _operator(lambda _: failing))
    assert int(pair.both.sum()) == len(failing) - 5
    assert np.isfinite(pair.log_ratios()).all()


def test_sweeps_of_different_spaces_are_refused():
    first = _operator(lambda p: p.copy())
    other = OperatorData("other", first.family, first.workload, first.space, np.ones(3), None)
    with pytest.raises(ValueError, match="different spaces"):
        Pair(first, other)


def test_the_committed_repeat_campaign_pairs_with_the_first_sweeps():
    found = bench_repeat.pairs("h100", REPEAT)
    assert len(found) == 10
    for pair in found:
        assert pair.first.name == pair.second.name
        knobs = pair.first.space.knobs
        assert all(np.array_equal(knobs[k], pair.second.space.knobs[k]) for k in knobs)
        assert int(pair.both.sum()) > 0.9 * len(pair.first.measured_us)


def test_the_report_names_every_operator_and_the_geomean():
    text = bench_repeat.report("h100", REPEAT)
    for path in (REPEAT / "sweeps").glob("*.t4.json.gz"):
        assert f"| {path.name.split('.')[0]} |" in text
    assert "Geomean over the 10 operators" in text


def test_a_repeat_folder_without_sweeps_is_an_error(tmp_path):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "baselines.json").write_text("{}")
    with pytest.raises(SystemExit, match="no sweeps"):
        bench_repeat.pairs("h100", tmp_path)
