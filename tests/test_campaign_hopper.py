"""The Hopper wgmma family in the GPU campaign: its suite, its correctness selection and a
simulated call through every phase (no GPU: simulated launches of compiled kernels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.campaign_cmds import campaign_app
from pipetune.model.family import family, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.space import KNOB_NAMES, TILE_LOOP_LABELS
from pipetune.model.hopper.workloads import HOPPER_OPS
from pipetune.model.operators import ALCOP, HOPPER
from pipetune.workers.campaign.correctness import FAMILY_CHECKS, selection
from pipetune.workers.campaign.operators import FIGURE_13_ORDER, resolve_operators
from pipetune.workers.codegen.wgmma.family import stratum, tails
from pipetune.workers.datasets import check_pipetune, read_t4

cli = CliRunner()


def test_the_hopper_suite_is_the_alcop_gemms_and_bmms_in_figure_13_order():
    chosen = resolve_operators("hopper")
    expected = [f"WG_{n}" for n in FIGURE_13_ORDER if ALCOP[n].op in ("gemm", "bmm")]
    assert list(chosen) == expected and len(chosen) == 15
    for name, workload in chosen.items():
        assert family_of(workload).name == "hopper_gemm"
        assert workload.gemm_view() == ALCOP[name.removeprefix("WG_")].gemm_view()
    assert list(resolve_operators("MM_RN50_FC,WG_MM_RN50_FC")) == ["MM_RN50_FC", "WG_MM_RN50_FC"]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_hopper_selection_covers_every_knob_value_tile_loop_and_tail(gpu):
    spec = get_gpu(gpu)
    chosen = selection(spec, ["hopper_gemm"])
    checks = FAMILY_CHECKS["hopper_gemm"]
    assert sum(len(s) for _, _, s in chosen) == len(checks.cases) * checks.per_case
    assert {w.op for _, w, _ in chosen} == set(HOPPER_OPS)
    # Both layouts of B, both forms of GELU.
    assert {w.b_layout for _, w, _ in chosen if w.op != "hopper_bmm"} == {"kn", "nk"}
    assert {w.approximate for _, w, _ in chosen if w.op == "hopper_gemm_bias_gelu"} == {
        "none",
        "tanh",
    }
    fam = family("hopper_gemm")
    allowed = {
        (k, getattr(x, k)) for _, w, _ in chosen for x in fam.enumerate(w, spec) for k in KNOB_NAMES
    }
    reached = {(k, getattr(x, k)) for _, _, s in chosen for x in s for k in KNOB_NAMES}
    assert reached == allowed
    loops = {stratum(x).split("-")[0] for _, _, s in chosen for x in s}
    assert loops == set(TILE_LOOP_LABELS.values())
    axes = {a for _, w, s in chosen for x in s for a, t in tails(w, x).items() if t}
    assert axes == {"m", "n", "k"}


# The simulated campaigns below use the run's shared compile and reference caches
# (conftest.campaign_caches): every campaign compiles its families' whole correctness
# selection, the same kernels for each test (and for tests/test_campaign_cli.py's memops
# ones), about 30 CPU seconds a family where no other test compiled them first.
simulated_campaign = pytest.mark.usefixtures("campaign_caches")


def _packed_campaign(tmp_path: Path, operators: str) -> Path:
    """A simulated campaign of ``operators`` (its files in tmp_path/out), packed as a GPU call
    packs it and unpacked as its archive is here: the folder it unpacked into."""
    from pipetune.workers.campaign.unpack import unpack

    archive = tmp_path / "c.tar.gz"
    args = ["--out-dir", str(tmp_path / "out"), "--pack", str(archive), "--runner", "simulated"]
    result = cli.invoke(campaign_app, [*args, "--operators", operators])
    assert result.exit_code == 0, result.output
    unpack(archive, tmp_path / "data", tmp_path / "profiles", allow_simulated=True)
    return tmp_path / "data"


@simulated_campaign
def test_a_hopper_operator_goes_through_every_phase(tmp_path):
    out = tmp_path / "out"
    args = ["--out-dir", str(out), "--runner", "simulated", "--operators", "WG_BMM_BERT_SV"]
    result = cli.invoke(campaign_app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "campaign.json").read_text())
    assert summary["state"] == "complete" and summary["sweeps"]["done"] == ["WG_BMM_BERT_SV"]
    correctness = json.loads((out / "correctness.json").read_text())
    assert list(correctness["families"]) == ["hopper_gemm"] and correctness["verdict"] == "pass"
    assert set(correctness["by_tile_loop"]) >= {"tile_per_block-1wg", "stream_k-1wg"}
    baseline = json.loads((out / "baselines.json").read_text())["operators"]["WG_BMM_BERT_SV"]
    assert baseline["unit"] == "TFLOP/s" and baseline["simulated"]
    dataset = read_t4(out / "sweeps" / "WG_BMM_BERT_SV.t4.json.gz")
    workload = HOPPER["WG_BMM_BERT_SV"]
    space = family_of(workload).enumerate(workload, get_gpu("h100"))
    assert check_pipetune(dataset).runner == "simulated" and len(dataset) == len(space)
    assert set(dataset.records[0].configuration) == set(KNOB_NAMES)


@simulated_campaign
def test_the_report_sets_the_wgmma_family_beside_the_mma_sync_family(tmp_path):
    """A simulated wgmma campaign of two operators, unpacked into a folder of its own, reported
    beside the committed H100 mma.sync measurement of one of the two shapes."""
    import gzip
    import shutil

    from benchmarks import bench_campaign
    from benchmarks.campaign_data import campaign

    data = _packed_campaign(tmp_path, "WG_MM_RN50_FC,WG_BMM_BERT_SV")
    committed = Path("benchmarks/data/h100")
    compare = tmp_path / "mma" / "h100"
    shutil.copytree(committed / "campaign", compare / "campaign")
    shutil.copy(committed / "MM_RN50_FC.t4.json.gz", compare)

    body = bench_campaign.report(
        campaign("h100", data), mma_sync=campaign("h100", tmp_path / "mma")
    )
    rows = {  # the wgmma table's rows (the model table's rows come after them)
        line.split(" | ")[0].lstrip("| "): line
        for line in body.splitlines()
        if " | hopper_" in line
    }
    fc = rows["WG_MM_RN50_FC"].split(" | ")
    doc = json.loads(gzip.decompress((committed / "MM_RN50_FC.t4.json.gz").read_bytes()))
    best_ms = min(
        r["measurements"][0]["value"] for r in doc["results"] if r["invalidity"] == "correct"
    )
    w = ALCOP["MM_RN50_FC"]
    assert fc[5] == f"{w.flops / (best_ms * 1e-3) / 1e12:,.1f}"  # the mma.sync best, TFLOP/s
    assert rows["WG_BMM_BERT_SV"].split(" | ")[5] == "-"  # no mma.sync dataset of that shape
    assert (
        "the better of the two" in body and "(1 operator), over the operators both measured" in body
    )
    assert "Tensor-core operators" not in body  # no empty tables of the other families


@simulated_campaign
def test_stream_k_failing_its_checks_is_quarantined_and_the_rest_is_swept(tmp_path, monkeypatch):
    """The stream-K kernels have never run on hardware: if they fail their checks, the call
    still sweeps the other tile loops (and says so everywhere) instead of stopping."""
    from pipetune.model.hopper.space import STREAM_K
    from pipetune.workers.campaign import run
    from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS
    from pipetune.workers.runners.sim_runner import SimulatedLaunchRunner

    gpu = get_gpu("h100")
    stream_k = sorted(
        {x.id for _, _, s in selection(gpu, ["hopper_gemm"]) for x in s if x.tile_loop == STREAM_K}
    )
    assert stream_k

    def failing_stream_k(options, spec):
        return SimulatedLaunchRunner(
            spec, settings=CAMPAIGN_SETTINGS, compile_workers=1, wrong=tuple(stream_k)
        )

    monkeypatch.setattr(run, "open_runner", failing_stream_k)
    out = tmp_path / "out"
    args = ["--out-dir", str(out), "--runner", "simulated", "--operators", "WG_BMM_BERT_SV"]
    archive = tmp_path / "c.tar.gz"
    result = cli.invoke(campaign_app, [*args, "--pack", str(archive)])
    assert result.exit_code == 0, result.output
    assert "quarantined hopper_gemm tile_loop=2" in result.output
    correctness = json.loads((out / "correctness.json").read_text())
    assert correctness["verdict"] == "quarantined"
    (left_out,) = correctness["quarantined"]["hopper_gemm"]
    assert (left_out["knob"], left_out["value"]) == ("tile_loop", STREAM_K)
    assert (
        left_out["failed"] == left_out["schedules"] == len([m for m in correctness["mismatches"]])
    )
    summary = json.loads((out / "campaign.json").read_text())
    assert summary["state"] == "complete" and "tile_loop=2" in summary["quarantine"]
    workload = HOPPER["WG_BMM_BERT_SV"]
    space = family_of(workload).enumerate(workload, gpu)
    dataset = read_t4(out / "sweeps" / "WG_BMM_BERT_SV.t4.json.gz")
    kept = [x for x in space if x.tile_loop != STREAM_K]
    assert 0 < len(dataset) == len(kept) < len(space)
    assert {r.configuration["tile_loop"] for r in dataset.records} == {0, 1}
    meta = dataset.metadata["pipetune"]["quarantined"]
    assert meta["left_out"] == len(space) - len(kept) and meta["of"] == len(space)
    assert summary["sweeps"]["quarantined"]["WG_BMM_BERT_SV"] == meta
    assert summary["phases"]["sweeps"] == "done"
    from types import SimpleNamespace

    from benchmarks.bench_campaign import correctness_table

    table = correctness_table(SimpleNamespace(correctness=correctness))  # type: ignore[arg-type]
    assert table[-1].startswith("Correctness: quarantined hopper_gemm tile_loop=2 (")
    # The archive unpacks as any other: the cut dataset, the quarantine in its documents.
    from pipetune.workers.campaign.unpack import unpack

    unpack(archive, tmp_path / "data", tmp_path / "profiles", allow_simulated=True)
    unpacked = read_t4(tmp_path / "data" / "h100" / "WG_BMM_BERT_SV.t4.json.gz")
    assert len(unpacked) == len(kept)
    doc = json.loads((tmp_path / "data" / "h100" / "campaign" / "correctness.json").read_text())
    assert doc["quarantined"] == correctness["quarantined"]


class _HangingStreamK:
    """A runner whose stream-K kernels all time out (as a deadlocked kernel would, after the
    trial timeout); it records which schedules it was asked to run."""

    name = "cupy"
    simulated_launch = False
    device_name = "a stand-in"
    conv_reference = "cudnn"
    last_prepare = None

    def __init__(self):
        self.ran = []

    def compile_ahead(self, workload, schedules):
        pass

    def verify(self, workload, schedules):
        from pipetune.model.hopper.space import STREAM_K
        from pipetune.model.trials import MeasureResult

        self.ran += schedules
        return [
            MeasureResult(status="timeout", error="no answer in 15 s", runner="cupy")
            if x.tile_loop == STREAM_K
            else MeasureResult(status="ok", max_abs_error=0.0, runner="cupy")
            for x in schedules
        ]


def test_kernels_that_keep_timing_out_are_not_run_again_and_are_quarantined():
    from pipetune.model.hopper.space import STREAM_K
    from pipetune.workers.campaign.correctness import TIMEOUTS_BEFORE_SKIPPING, run_correctness

    gpu = get_gpu("h100")
    chosen = selection(gpu, ["hopper_gemm"])
    stream_k = [x for _, _, s in chosen for x in s if x.tile_loop == STREAM_K]
    runner = _HangingStreamK()
    doc = run_correctness(runner, gpu, ["hopper_gemm"])  # type: ignore[arg-type]
    ran_stream_k = [x for x in runner.ran if x.tile_loop == STREAM_K]
    # Fewer than half the stream-K kernels ran (those unlike the timeouts before them);
    # every other schedule ran.
    assert TIMEOUTS_BEFORE_SKIPPING <= len(ran_stream_k) < len(stream_k) // 2
    assert len(runner.ran) - len(ran_stream_k) == sum(len(s) for _, _, s in chosen) - len(stream_k)
    # The skipped ones count as timed out, never as passed: the quarantine decides.
    assert doc["failed"] == len(stream_k) and doc["verdict"] == "quarantined"
    (left_out,) = doc["quarantined"]["hopper_gemm"]
    assert (left_out["knob"], left_out["value"]) == ("tile_loop", STREAM_K)
    not_run = [m for m in doc["mismatches"] if m["error"].startswith("not run: ")]
    assert len(not_run) == len(stream_k) - len(ran_stream_k)
    assert "with tile_loop=2 timed out before it" in not_run[0]["error"]


@simulated_campaign
def test_the_hopper_fused_suite_is_swept_and_reported_beside_the_hopper_suite(tmp_path):
    """The swiglu and bias_gelu suites' fused GEMMs on the wgmma family: a campaign of their
    own (simulated here), each swept whole, with its PyTorch baseline, in the wgmma report."""
    from benchmarks import bench_campaign
    from benchmarks.campaign_data import campaign
    from pipetune.model.operators import HOPPER_FUSED

    assert {w.op for w in HOPPER_FUSED.values()} == {"hopper_gemm_swiglu", "hopper_gemm_bias_gelu"}
    data = _packed_campaign(tmp_path, "hopper_fused")
    summary = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert summary["state"] == "complete" and set(summary["sweeps"]["done"]) == set(HOPPER_FUSED)
    baselines = json.loads((tmp_path / "out" / "baselines.json").read_text())["operators"]
    assert set(baselines) == set(HOPPER_FUSED)
    body = bench_campaign.report(campaign("h100", data), mma_sync=None)
    rows = [line for line in body.splitlines() if line.startswith("| WG_")]
    assert {row.split(" | ")[0].lstrip("| ") for row in rows} >= set(HOPPER_FUSED)
    assert "hopper_gemm_swiglu 1024x11008x4096" in body
    assert "hopper_gemm_bias_gelu(tanh) 1024x3072x768" in body


def test_the_attention_suite_plans_q_k_over_keys_as_stored_on_both_families_in_one_call():
    """GPT-2's Q·Kᵀ with each B N x K (bmm_nk) on the mma.sync and the wgmma family, and its
    scaled causal softmax: one call of the kit's minutes on a Hopper GPU; refused on an A100,
    whose wgmma half cannot run."""
    from pipetune.model.operators import ATTENTION
    from pipetune.workers.campaign.kit import ATTENTION_MINUTES

    assert {w.op for w in ATTENTION.values()} == {"bmm", "hopper_bmm", "softmax"}
    assert {w.b_layout for w in ATTENTION.values() if w.op != "softmax"} == {"nk"}
    (causal,) = [w for w in ATTENTION.values() if w.op == "softmax"]
    assert causal.causal and causal.mask_queries == 1024 and causal.scale == 0.125
    args = ["plan", "--operators", "attention", "--gpu", "h100", "--json"]
    result = cli.invoke(campaign_app, [*args, "--minutes", str(ATTENTION_MINUTES)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = {r["operator"]: r for r in document["operators"]}
    assert set(rows) == set(ATTENTION) and document["fits"]
    assert {rows[name]["family"] for name in ATTENTION} == {"tensor_gemm", "hopper_gemm", "memops"}
    refused = cli.invoke(campaign_app, ["plan", "--operators", "attention", "--gpu", "a100"])
    assert refused.exit_code == 2 and "WG_BMM_GPT2_QK_NK" in refused.stderr


@simulated_campaign
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_the_attention_suite_s_causal_softmax_is_reported_beside_the_plain_ones(tmp_path):
    """The attention suite's masked softmax (simulated here) is swept with a baseline and
    lands in the report's memory-intensive table, where the memops suite's operators are
    (the GPU's baseline, eager PyTorch, is tests/test_campaign_gpu_side.py's). A campaign
    without tensor-core operators is reported without numpy's warnings (a mean of none)."""
    from benchmarks import bench_campaign
    from benchmarks.campaign_data import campaign

    data = _packed_campaign(tmp_path, "Softmax_GPT2_causal_b1_s1024")
    baselines = json.loads((tmp_path / "out" / "baselines.json").read_text())["operators"]
    assert baselines["Softmax_GPT2_causal_b1_s1024"]["simulated"]
    body = bench_campaign.report(campaign("h100", data))
    rows = [line for line in body.splitlines() if "Softmax_GPT2_causal_b1_s1024" in line]
    # In the memory-intensive table (its row, then the model's row of the same operator).
    assert rows[0].startswith("| Softmax_GPT2_causal_b1_s1024 | 12288x1024 | ") and len(rows) == 2
