"""The cross-GPU report (benchmarks/bench_cross_gpu.py) on copies of committed campaigns."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_cross_gpu
from benchmarks.bench_campaign import best_in_top_k, spearman
from benchmarks.campaign_data import campaign

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
OPERATORS = ("MM_RN50_Conv1x1_1", "BMM_BERT_QK")


@pytest.fixture
def two_gpus(tmp_path: Path) -> Path:
    """Two ALCOP operators of both committed campaigns, in a fresh folder."""
    for gpu in ("h100", "h200"):
        shutil.copytree(DATA / gpu / "campaign", tmp_path / gpu / "campaign")
        for name in OPERATORS:
            shutil.copy(DATA / gpu / f"{name}.t4.json.gz", tmp_path / gpu)
    return tmp_path


def test_a_gpu_s_own_measurements_rank_its_schedules_exactly(two_gpus: Path):
    op = campaign("h100", two_gpus).operators(["BMM_BERT_QK"])[0]
    own = bench_cross_gpu.source_latency_on_target(op, op)
    assert np.array_equal(own[op.ok], op.measured_us[op.ok])
    assert best_in_top_k(op, own, 1) == 1.0 and spearman(op, own) == pytest.approx(1.0)


def test_the_other_gpu_s_measurements_are_matched_schedule_by_schedule(two_gpus: Path):
    h100 = campaign("h100", two_gpus).operators(["BMM_BERT_QK"])[0]
    h200 = campaign("h200", two_gpus).operators(["BMM_BERT_QK"])[0]
    on_h100 = bench_cross_gpu.source_latency_on_target(h200, h100)
    by_id = dict(zip(h200.space.ids, h200.measured_us, strict=True))
    for row in (0, len(h100.space.ids) // 2, len(h100.space.ids) - 1):
        assert on_h100[row] == by_id[h100.space.ids[row]]


def test_the_report_judges_every_ranking_on_both_operators(two_gpus: Path):
    body = bench_cross_gpu.report("h200", "h100", two_gpus)
    for name in OPERATORS:
        row = next(line for line in body.splitlines() if line.startswith(f"| {name} |"))
        cells = row.strip("|").split("|")[1:]
        assert len(cells) == len(bench_cross_gpu.RANKINGS)
        for cell in cells:
            rho, *tops = (float(v) for v in cell.split("/"))
            assert -1.0 <= rho <= 1.0 and all(0.0 < t <= 1.0 for t in tops)
    summary = [line for line in body.splitlines() if line.startswith("| source measured |")]
    assert len(summary) == 1
    assert "Memory-intensive" not in body  # no memops operator was copied
