"""benchmarks/bench_model_groups.py: the model's ranking per group of committed sweeps and its
stage twins, on a copy of a few of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_model_groups as bench
from benchmarks.bench_campaign import best_in_top_k
from benchmarks.campaign_data import load_operator

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
GEMM = DATA / "h100" / "MM_RN50_Conv1x1_1.t4.json.gz"
CONV = DATA / "h100" / "Conv2D_RN50_1.t4.json.gz"


@pytest.fixture(scope="module")
def gemm():
    return load_operator(GEMM, {})


def test_the_ranking_is_the_campaign_report_s_best_in_top_k(gemm):
    top1, top10, rho = bench.ranking([gemm])
    assert top1 == pytest.approx(best_in_top_k(gemm, gemm.predicted_us, 1))
    assert top10 == pytest.approx(best_in_top_k(gemm, gemm.predicted_us, 10))
    assert 0 < top1 <= top10 <= 1 and -1 <= rho <= 1


def test_stage_twins_differ_only_in_their_stages_at_equal_occupancy(gemm):
    twins = list(bench.stage_twins([gemm], 2, 3))
    assert len(twins) > 50
    knobs = gemm.space.knobs
    for a, b, _ in twins:
        assert (knobs["smem_stages"][a], knobs["smem_stages"][b]) == (2, 3)
        assert all(knobs[k][a] == knobs[k][b] for k in knobs if k != "smem_stages")
        assert gemm.space.blocks_per_sm[a] == gemm.space.blocks_per_sm[b]
        assert gemm.ok[a] and gemm.ok[b]
    n, measured, error, rho = bench.twin_errors([gemm], 2, 3)
    ratios = [np.log(gemm.measured_us[a] / gemm.measured_us[b]) for a, b, _ in twins]
    assert n == len(twins) and measured == pytest.approx(np.median(ratios))
    assert error >= 0 and -1 <= rho <= 1


def test_the_command_prints_both_tables_for_the_groups_it_finds(tmp_path, capsys):
    for source, folder in ((GEMM, "h100"), (CONV, "h100"), (GEMM, "h200/shapes")):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(source, tmp_path / folder / source.name)
    bench.main(["--data-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| shapes | 1 |" in out and "| h100 | 1 |" in out and "| conv | 1 |" in out
    assert "| h200 |" not in out.split("\n\n")[0]  # no H200 sweep copied: no row
    assert "| h100 | 2 vs 3 |" in out and "| h200 | 2 vs 3 |" not in out
