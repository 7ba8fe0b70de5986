"""The campaign report (benchmarks/bench_campaign.py): its measures on planted data, and the
whole report on a copy of two operators of the committed H200 campaign."""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_campaign
from benchmarks.campaign_data import OperatorData, campaign
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.workloads import gemm

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"


def planted(measured_of) -> OperatorData:
    """A real GEMM space whose 'measurements' are the model's prediction bent by a rule."""
    workload = gemm(512, 256, 512)
    family = family_of(workload)
    space = family.enumerate(workload, get_gpu("h200"))
    op = OperatorData("planted", family, workload, space, np.zeros(len(space)), None)
    measured = measured_of(op.predicted_us.copy(), space)
    return OperatorData("planted", family, workload, space, measured, None)


def test_a_model_that_ranks_exactly_has_everything_in_its_top_1():
    op = planted(lambda predicted, space: predicted * 1.7)  # a scale error only
    assert bench_campaign.best_in_top_k(op, op.predicted_us, 1) == 1.0
    assert bench_campaign.spearman(op, op.predicted_us) == pytest.approx(1.0)
    _, factor, _ = bench_campaign.worst_knob_value(op)
    assert factor == pytest.approx(1.0)  # the scale is taken out


def test_best_in_top_k_is_the_best_of_the_model_s_k_first_over_the_best():
    op = planted(lambda predicted, space: predicted)
    order = np.argsort(op.predicted_us, kind="stable")
    measured = op.measured_us.copy()
    measured[order[0]] = np.inf  # the model's first choice failed: a slot, no time
    measured[order[1]] = measured[order[2]] * 2  # its second is slower than its third
    best = measured[np.isfinite(measured)].min()
    op = OperatorData("p", op.family, op.workload, op.space, measured, None)
    assert bench_campaign.best_in_top_k(op, op.predicted_us, 1) == 0.0
    assert bench_campaign.best_in_top_k(op, op.predicted_us, 2) == pytest.approx(
        best / measured[order[1]]
    )
    assert bench_campaign.best_in_top_k(op, op.predicted_us, 3) == pytest.approx(
        best / measured[order[2]]
    )


def test_the_class_the_model_mispredicts_is_found():
    # Non-pipelined schedules run 1.5x slower than the model says: a minority, so the
    # operator's median error stays 0 and that class stands out at 1/1.5.
    def bend(predicted, space):
        return np.where(space.knobs["smem_stages"] == 1, predicted * 1.5, predicted)

    op = planted(bend)
    where, factor, n = bench_campaign.worst_knob_value(op)
    assert where == "smem_stages=1" and factor == pytest.approx(1 / 1.5)
    assert n == int((op.space.knobs["smem_stages"] == 1).sum())
    rows = bench_campaign.pipelining_class_errors([op])
    one_one = next(r for r in rows if r.startswith("| 1 | 1 |"))
    assert "| 0.67 |" in one_one


def test_a_trend_over_co_resident_blocks_is_found():
    # Shared SMs run 1.5x slower than the model says. Most of this small GEMM's schedules
    # are lone blocks, so the operator's scale (its median error, taken out first) is theirs
    # and every row of co-resident blocks stands out at 1/1.5.
    def bend(predicted, space):
        blocks = family_of(space.workload).evaluate(space).N_threadblk_per_SM
        return np.where(blocks > 1, predicted * 1.5, predicted)

    op = planted(bend)
    rows = bench_campaign.blocks_per_sm_errors([op])
    lone = next(r for r in rows if r.startswith("| 1 |"))
    shared = [r for r in rows[2:] if not r.startswith("| 1 |")]
    assert lone.split("|")[3].strip() == "1.00"
    assert shared and all(r.split("|")[3].strip() == "0.67" for r in shared)


def test_the_fastest_schedule_of_each_pipeline_class_is_compared_with_the_model_s():
    # The model ranks exactly: every class's best lies as far behind the best as the model
    # says, and the optimum and the model's first choice are in the same class.
    op = planted(lambda predicted, space: predicted * 1.3)
    rows = bench_campaign.chunk_stage_classes([op])[2:]
    assert len(rows) > 4
    for row in rows:
        _, _, operators, measured, model, optimum, first = row.strip("|").split("|")
        assert measured.strip() == model.strip() and operators.strip() == "1"
        assert optimum.strip() == first.strip()
    assert sum(int(r.strip("|").split("|")[5]) for r in rows) == 1
    # Now the model's favourite class runs 2x slower than it says: its first choice is in a
    # class that does not hold the optimum, and that class falls behind in the measured column.
    first = int(np.argmin(op.predicted_us))
    knobs = op.space.knobs
    key = (knobs["chunk"][first], knobs["smem_stages"][first])

    def bend(predicted, space):
        favourite = (space.knobs["chunk"] == key[0]) & (space.knobs["smem_stages"] == key[1])
        return np.where(favourite, predicted * 2.0, predicted)

    row = next(
        r
        for r in bench_campaign.chunk_stage_classes([planted(bend)])[2:]
        if r.startswith(f"| {key[0]} | {key[1]} |")
    )
    _, _, _, measured, model, optimum, first_choice = row.strip("|").split("|")
    assert float(measured) < float(model) == 1.0
    assert optimum.strip() == "0" and first_choice.strip() == "1"


@pytest.fixture
def small_campaign(tmp_path: Path) -> Path:
    """Two operators of the committed H200 campaign and its documents, in a fresh folder."""
    source = DATA / "h200"
    target = tmp_path / "h200"
    shutil.copytree(source / "campaign", target / "campaign")
    for name in ("MM_RN50_Conv1x1_1", "Softmax_BERT_b1_s128"):
        shutil.copy(source / f"{name}.t4.json.gz", target / f"{name}.t4.json.gz")
    return tmp_path


def _best_ms(path: Path) -> tuple[float, dict]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ok = [r for r in doc["results"] if r["invalidity"] == "correct"]
    best = min(ok, key=lambda r: r["measurements"][0]["value"])
    return best["measurements"][0]["value"], doc["metadata"]["pipetune"]["workload"]


def test_the_report_reads_the_committed_measurements(small_campaign: Path):
    body = bench_campaign.report(campaign("h200", small_campaign))
    # The GEMM row's best TFLOP/s is the file's best time, computed here independently.
    best_ms, w = _best_ms(small_campaign / "h200" / "MM_RN50_Conv1x1_1.t4.json.gz")
    tflops = 2 * w["m"] * w["n"] * w["k"] / (best_ms * 1e-3) / 1e12
    row = next(line for line in body.splitlines() if line.startswith("| MM_RN50_Conv1x1_1 |"))
    assert f"| {tflops:,.1f} |" in row
    baselines = json.loads((small_campaign / "h200" / "campaign" / "baselines.json").read_text())
    lib_us = baselines["operators"]["MM_RN50_Conv1x1_1"]["latency_us"]
    assert f"| {lib_us / (best_ms * 1e3):.2f} |" in row  # best / library
    # The memops row and the model's rows are there; the operators not copied are listed.
    assert any(line.startswith("| Softmax_BERT_b1_s128 | 1536x128 |") for line in body.split("\n"))
    assert "Not swept:" in body and "LayerNorm_BERT_b1_s128" in body
    model_rows = [
        line for line in body.splitlines() if line.startswith("| MM_RN50_Conv1x1_1 | 637")
    ]
    assert len(model_rows) == 1
    rho = float(model_rows[0].split("|")[4])
    assert -1.0 <= rho <= 1.0 and not math.isnan(rho)
    assert "| all | | 660 | 660 | 0 |" in body  # the correctness totals


def test_a_folder_without_a_campaign_is_a_clear_error(tmp_path: Path):
    with pytest.raises(SystemExit, match="no unpacked campaign"):
        campaign("h200", tmp_path)


def test_a_model_ablation_changes_the_model_and_never_the_measurements():
    op = planted(lambda predicted, space: predicted)
    without = bench_campaign.with_model_gpu(op, {"k_step_cycles": 0.0})
    assert np.array_equal(without.measured_us, op.measured_us)
    assert without.space.gpu.k_step_cycles == 0.0 and op.space.gpu.k_step_cycles > 0
    # The K-step term is a cost per main-loop iteration: removing it speeds every schedule.
    assert (without.predicted_us < op.predicted_us).all()
    assert bench_campaign.with_model_gpu(op, {}) is op
    assert bench_campaign.parse_model_set(["k_step_cycles=0"]) == {"k_step_cycles": 0.0}
    for bad in ("k_step=1", "k_step_cycles", "k_step_cycles=many"):
        with pytest.raises(ValueError, match="--model-set"):
            bench_campaign.parse_model_set([bad])


def _first_day(path: Path) -> str:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return min(r["timestamp"] for r in doc["results"] if r.get("timestamp"))[:10]


def test_the_header_says_which_day_each_sweep_was_measured(small_campaign: Path):
    # An operator swept again by a later call (a changed kernel) replaces its dataset: the
    # report must not present it as measured on the first call's day.
    folder = small_campaign / "h200"
    gemm_day = _first_day(folder / "MM_RN50_Conv1x1_1.t4.json.gz")
    memops_day = _first_day(folder / "Softmax_BERT_b1_s128.t4.json.gz")
    dates = campaign("h200", small_campaign).sweep_dates()
    assert dates[gemm_day] == ["MM_RN50_Conv1x1_1"] or gemm_day == memops_day
    line = bench_campaign.sweep_dates_line(campaign("h200", small_campaign))
    if gemm_day == memops_day:
        assert line == ""
    else:
        assert f"{gemm_day}: 1 (MM)" in line and f"{memops_day}: 1 (Softmax)" in line
    # One day only: nothing to say.
    (folder / "Softmax_BERT_b1_s128.t4.json.gz").unlink()
    assert bench_campaign.sweep_dates_line(campaign("h200", small_campaign)) == ""


def test_families_checked_by_later_calls_are_named(small_campaign: Path):
    path = small_campaign / "h200" / "campaign" / "correctness.json"
    doc = json.loads(path.read_text())
    doc["added_later"] = [{"families": ["tensor_gemm"], "device_name": "NVIDIA H200"}]
    path.write_text(json.dumps(doc))
    lines = bench_campaign.correctness_table(campaign("h200", small_campaign))
    assert "Checked in later calls" in lines[-1] and "tensor_gemm (NVIDIA H200)" in lines[-1]
    doc.pop("added_later")
    path.write_text(json.dumps(doc))
    lines = bench_campaign.correctness_table(campaign("h200", small_campaign))
    assert not any("later calls" in line for line in lines)


def test_the_committed_campaign_is_read_with_its_shipped_profile_not_the_users(
    tmp_path, monkeypatch, users_own_h200
):
    # get_gpu applies the user's own profile first (calibrate, a default unpack: another
    # device); the report of the committed H200 campaign took it for the campaign's own,
    # and RESULTS.md's "calibrated" figures changed with whatever that folder held.
    from benchmarks.campaign_data import load_operator
    from pipetune.model import hardware

    shipped = users_own_h200
    assert get_gpu("h200").dram_bandwidth_gbs == 400.0  # the user's, for the user's device
    op = load_operator(DATA / "h200" / "MM_Square_1k.t4.json.gz", {})
    assert op.space.gpu.dram_bandwidth_gbs == shipped["overrides"]["dram_bandwidth_gbs"]
    assert op.space.gpu.profile == "calibrated:h200.json"
    monkeypatch.delenv(hardware.USER_PROFILE_DIR_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "none"))
    alone = load_operator(DATA / "h200" / "MM_Square_1k.t4.json.gz", {})
    np.testing.assert_array_equal(op.predicted_us, alone.predicted_us)


def _paused(folder: Path, reason: str) -> list[str]:
    """Mark the copied campaign paused, as a call out of minutes leaves it; its operators."""
    path = folder / "campaign" / "campaign.json"
    summary = json.loads(path.read_text())
    summary.update(state="paused", reason=reason)
    path.write_text(json.dumps(summary))
    return summary["operators"]


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_paused_campaign_is_reported_over_what_it_measured_and_never_as_nan(
    small_campaign: Path,
):
    # A paused campaign (one GEMM and one softmax swept, no BMM, convolution or other
    # memory-intensive operator yet) printed nan for every geomean of a kind it lacked.
    folder = small_campaign / "h200"
    operators = _paused(folder, "deadline: 12 s left, MM_RN50_Conv1x1_2 part 1/1 needs ~30 s")
    body = bench_campaign.report(campaign("h200", small_campaign))
    assert not re.search(r"\bnan", body, re.IGNORECASE), body
    lines = body.splitlines()
    state = next(line for line in lines if line.startswith("The campaign is paused"))
    assert f"2 of {len(operators)} operators swept" in state and "MM_RN50_Conv1x1_2" in state
    gemm = next(line for line in lines if line.startswith("Geomean: best / non-pipelined"))
    assert "BMM none measured" in gemm and "convolutions none measured" in gemm
    best_ms, _ = _best_ms(folder / "MM_RN50_Conv1x1_1.t4.json.gz")
    lib_us = json.loads((folder / "campaign" / "baselines.json").read_text())["operators"][
        "MM_RN50_Conv1x1_1"
    ]["latency_us"]
    assert f"GEMM {lib_us / (best_ms * 1e3):.2f} (1 operator)" in gemm  # its one operator
    assert "geomean of top-k over 1 operator:" in body
    # Without its softmax, no memory-intensive figure: said, not nan.
    (folder / "Softmax_BERT_b1_s128.t4.json.gz").unlink()
    body = bench_campaign.report(campaign("h200", small_campaign))
    assert not re.search(r"\bnan", body, re.IGNORECASE), body
    assert "best / one-row-per-block none measured, best / PyTorch none measured." in body
    assert "Memory-intensive operators: none measured, so no top-k or Spearman." in body


def test_a_geomean_says_how_many_operators_it_is_over():
    assert bench_campaign.geomean_text([]) == "none measured"
    assert bench_campaign.geomean_text([2.0, 8.0], unit="x") == "4.00x (2 operators)"
    assert bench_campaign.geomean_text([1.5], largest=True) == "1.50 (1 operator; max 1.50)"
    assert math.isnan(bench_campaign.geomean([]))  # (the other benchmarks' helper, unchanged)
