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
    assert "| GPU | arrangement twins |" in out and "| h100 | " in out.split("arrangement")[1]


def test_arrangement_twins_share_block_tile_warps_chunk_stages_and_occupancy(gemm):
    twins = list(bench.arrangement_twins([gemm]))
    assert len(twins) > 50
    space, knobs = gemm.space, gemm.space.knobs
    for a, b, op in twins:
        assert op is gemm and gemm.ok[a] and gemm.ok[b]
        for same in (space.block_m, space.block_n, space.warps, space.blocks_per_sm):
            assert same[a] == same[b]
        for knob in ("chunk", "smem_stages", "reg_stages"):
            assert knobs[knob][a] == knobs[knob][b]
        # b has more warps side by side along N, so fewer stacked along M
        assert knobs["block_col_warps"][a] < knobs["block_col_warps"][b]
        assert knobs["block_row_warps"][a] > knobs["block_row_warps"][b]
    # each pair once (three arrangements of one block at equal occupancy make three pairs)
    assert len(set((a, b) for a, b, _ in twins)) == len(twins)
    n, measured, error, _ = bench.pair_errors(twins)
    ratios = [np.log(gemm.measured_us[a] / gemm.measured_us[b]) for a, b, _ in twins]
    assert n == len(twins) and measured == pytest.approx(np.median(ratios))
    assert error >= 0


def test_pairs_the_model_predicts_alike_have_no_rank_correlation(gemm):
    twins = list(bench.arrangement_twins([gemm]))[:5]

    class Alike:  # the operator with every prediction equal
        measured_us = gemm.measured_us
        predicted_us = np.ones_like(gemm.predicted_us)

    n, _, error, rho = bench.pair_errors([(a, b, Alike) for a, b, _ in twins])
    ratios = [abs(np.log(gemm.measured_us[a] / gemm.measured_us[b])) for a, b, _ in twins]
    assert n == 5 and np.isnan(rho) and error == pytest.approx(np.median(ratios))
