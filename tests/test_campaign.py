"""The campaign's parts that need no child process: the timing loop, the reference cache,
the operator order, the device's GPU, the correctness verdict (per kernel family), the
baselines' units, the files and archives, the time plan."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from pipetune.model.family import family, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import KNOBS as MEMOPS_KNOBS
from pipetune.model.memops.workloads import MEM_OPS
from pipetune.model.operators import ALCOP, MEMOPS, SUITES
from pipetune.model.space import Schedule
from pipetune.model.trials import MeasureResult
from pipetune.workers.campaign import layout, operators
from pipetune.workers.campaign.baselines import baseline_entry, missing, run_baselines
from pipetune.workers.campaign.correctness import (
    CASES,
    FAILURE_LIMIT,
    MEMOPS_CASES,
    checked_families,
    excluded,
    kind_of,
    merge,
    quarantine,
    quarantine_note,
    quarantined_features,
    selection,
    stop_reason,
    stops,
    summarise,
    tails,
)
from pipetune.workers.campaign.deadline import Deadline
from pipetune.workers.campaign.operators import (
    DEFAULT_OPERATORS,
    FIGURE_13_ORDER,
    families_of,
    resolve_operators,
)
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS, COMPILE_S_PER_KERNEL, plan_document
from pipetune.workers.campaign.run import CampaignUsageError, resolve_device_gpu
from pipetune.workers.campaign.unpack import UnpackError, check_baselines
from pipetune.workers.codegen import VARIANTS, variant_of
from pipetune.workers.codegen.memops import stratum as memops_stratum
from pipetune.workers.codegen.memops import tails as memops_tails
from pipetune.workers.runners import reference_cache
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

# --- timing -------------------------------------------------------------------------


class FakeClock:
    """Events that replay scripted durations, and a log of what happened in order."""

    def __init__(self, durations):
        self.durations = iter(durations)
        self.log: list[str] = []

    def pair(self):
        return object(), object()

    def record(self, event):
        self.log.append("record")

    def synchronize(self, event):
        self.log.append("sync")

    def elapsed_ms(self, start, end):
        return next(self.durations)


def timed(durations, policy):
    clock = FakeClock(durations)
    calls = []
    samples = time_launches(
        lambda: calls.append("launch"), lambda: calls.append("flush"), clock, policy
    )
    return samples, calls, clock


def test_fixed_repeats_flush_before_every_timed_launch():
    policy = RepeatPolicy.of(MeasureSettings(warmup=2, repeats=3))
    samples, calls, clock = timed([1.0, 2.0, 3.0], policy)
    assert samples == [1.0, 2.0, 3.0]
    assert calls == ["launch", "launch"] + ["flush", "launch"] * 3
    assert clock.log.count("sync") == 1 and clock.log.count("record") == 6


def test_adaptive_repeats_stop_once_the_spread_settles():
    policy = RepeatPolicy.of(CAMPAIGN_SETTINGS)  # 1 warm-up, 5..10 repeats, 3% spread
    samples, calls, clock = timed([1.0, 1.01, 0.99, 1.0, 1.005] + [9.0] * 5, policy)
    assert len(samples) == 5 and clock.log.count("sync") == 1
    noisy = [1.0, 1.3, 0.8, 1.0, 1.1, 1.0, 1.0, 1.0, 1.0, 1.0]
    samples, calls, clock = timed(noisy, policy)
    assert samples == noisy and clock.log.count("sync") == 2
    assert calls.count("launch") == 1 + 10


def test_verify_only_times_nothing():
    samples, calls, _ = timed([], RepeatPolicy.verify_only())
    assert samples == [] and calls == []


def test_adaptive_settings_are_checked():
    with pytest.raises(ValueError, match="min_repeats"):
        MeasureSettings(repeats=4, min_repeats=5)
    assert MeasureSettings(repeats=10, min_repeats=5).fewest_repeats == 5
    assert MeasureSettings(repeats=10).fewest_repeats == 10


# --- reference cache --------------------------------------------------------------------


def test_reference_cache_computes_once_and_keeps_a_fallback_under_its_own_name(tmp_path):
    calls = []

    def compute(method):
        def run():
            calls.append(method)
            return np.ones((2, 3), np.float32), np.full((2, 3), 0.5, np.float32), method

        return run

    first = reference_cache.cached_reference(np, "w1", 0, "cublas", tmp_path, compute("cublas"))
    again = reference_cache.cached_reference(np, "w1", 0, "cublas", tmp_path, compute("cublas"))
    assert (first[2], first[3], again[2], again[3]) == ("cublas", False, "cublas", True)
    assert calls == ["cublas"]
    np.testing.assert_array_equal(again[1], np.full((2, 3), 0.5))
    # cuDNN was asked for but the fallback answered: never stored as a cuDNN reference.
    fallback = reference_cache.cached_reference(
        np, "w2", 0, "cudnn", tmp_path, compute("cublas-im2col")
    )
    assert fallback[2] == "cublas-im2col"
    assert reference_cache.load(tmp_path, reference_cache.cache_key("w2", 0, "cudnn")) is None
    assert reference_cache.load(tmp_path, reference_cache.cache_key("w2", 0, "cublas-im2col"))


def test_a_broken_cache_entry_is_recomputed(tmp_path):
    key = reference_cache.cache_key("w", 0, "cublas")
    reference_cache.store(tmp_path, key, np.ones(4, np.float32), np.ones(4, np.float32))
    (tmp_path / f"{key}.tol.npy").write_bytes(b"not numpy")
    assert reference_cache.load(tmp_path, key) is None


def test_references_are_read_only_from_this_users_own_folder(tmp_path, monkeypatch):
    # The default folder was one shared name in /tmp: another user's files there would be the
    # references kernels are verified against.
    import os

    monkeypatch.delenv(reference_cache.ENV_DIR, raising=False)
    folder = reference_cache.default_folder()
    assert folder.name == f"pipetune-references-{os.getuid()}"
    key = reference_cache.cache_key("w", 0, "cublas")
    reference_cache.store(tmp_path / "mine", key, np.ones(4, np.float32), np.ones(4, np.float32))
    assert reference_cache.load(tmp_path / "mine", key) is not None
    assert (tmp_path / "mine").stat().st_mode & 0o077 == 0
    someone_else = os.getuid() + 1
    monkeypatch.setattr(reference_cache.os, "getuid", lambda: someone_else)
    assert reference_cache.load(tmp_path / "mine", key) is None
    reference_cache.store(
        tmp_path / "mine", "other", np.ones(4, np.float32), np.ones(4, np.float32)
    )
    assert not (tmp_path / "mine" / "other.tol.npy").exists()


# --- operators and the device's GPU -----------------------------------------------------


def test_the_suite_sweeps_in_figure_13_order_and_names_mix():
    assert sorted(FIGURE_13_ORDER) == sorted(ALCOP)
    assert list(resolve_operators("alcop")) == list(FIGURE_13_ORDER)
    assert list(resolve_operators("MM_RN50_FC,bmm_gpt2_qk")) == ["MM_RN50_FC", "BMM_GPT2_QK"]
    mixed = list(resolve_operators("Conv3D_1,alcop"))
    assert mixed[0] == "Conv3D_1" and len(mixed) == len(ALCOP)
    with pytest.raises(ValueError, match="'MM_Nope'"):
        resolve_operators("alcop,MM_Nope")


def test_memops_resolve_and_the_default_sweeps_alcop_first_then_memops():
    assert list(resolve_operators("memops")) == list(MEMOPS)  # the suite's own order
    assert list(resolve_operators("MM_RN50_FC,softmax_bert_b1_s128")) == [
        "MM_RN50_FC",
        "Softmax_BERT_b1_s128",
    ]
    default = list(resolve_operators(DEFAULT_OPERATORS))
    assert default == [*FIGURE_13_ORDER, *MEMOPS]
    assert families_of(resolve_operators(DEFAULT_OPERATORS)) == ["tensor_gemm", "memops"]
    assert list(resolve_operators("Softmax_BERT_b1_s128,memops"))[1:] == [
        op for op in MEMOPS if op != "Softmax_BERT_b1_s128"
    ]
    from pipetune.workers.campaign.run import CampaignOptions

    assert CampaignOptions(out_dir=Path("x")).operators == DEFAULT_OPERATORS


def test_an_unknown_name_is_refused_with_the_names_that_would_do():
    with pytest.raises(ValueError) as refused:
        resolve_operators("MM_RN50_FC,softmax_bert_b1_s12")
    message = str(refused.value)
    assert message.startswith("unknown operator or suite 'softmax_bert_b1_s12'")
    assert "did you mean Softmax_BERT_b1_s128" in message
    assert (
        "suites: alcop, memops, hopper, llama" in message and "BiasGELU_GPT2_b32_s1024" in message
    )
    assert "\n" not in message  # one line: the CLI prints it as its error


def test_a_family_the_campaign_does_not_sweep_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(operators, "CAMPAIGN_FAMILIES", ("tensor_gemm",))
    others = [
        n
        for n, ops in SUITES.items()
        if any(family_of(w).name != "tensor_gemm" for w in ops.values())
    ]
    assert {"memops", "hopper", "llama"} <= set(others) and "swiglu" not in others
    resolve_operators("swiglu")  # the fused GEMM + SwiGLU and its GEMM: tensor_gemm's
    for name in others:  # suites of other kernel families (memops, ...)
        with pytest.raises(ValueError, match="sweeps the kernel families tensor_gemm only"):
            resolve_operators(name)
    with pytest.raises(ValueError, match="'Softmax_BERT_b1_s128': the campaign sweeps"):
        resolve_operators("MM_RN50_FC,Softmax_BERT_b1_s128")


@pytest.mark.parametrize(
    ("device", "asked", "key"),
    [
        ("NVIDIA H100 PCIe", None, "h100"),
        ("NVIDIA H100 80GB HBM3", None, "h100"),
        ("NVIDIA H100 NVL", "h100", "h100"),
        ("NVIDIA H200", None, "h200"),
        ("NVIDIA A100-SXM4-80GB", None, "a100"),
        ("Some Future GPU", "h200", "h200"),  # unknown to the model: the user's word
    ],
)
def test_the_gpu_comes_from_the_device(device, asked, key):
    assert resolve_device_gpu(device, asked, simulated=False) == key


def test_a_gpu_mismatch_is_refused_with_the_way_out():
    with pytest.raises(CampaignUsageError) as refused:
        resolve_device_gpu("NVIDIA H200", "h100", simulated=False)
    assert "--gpu h100 was given, but the device is NVIDIA H200 (h200)" in str(refused.value)
    assert "--gpu h200" in str(refused.value)
    with pytest.raises(CampaignUsageError, match="no spec for"):
        resolve_device_gpu("Some Future GPU", None, simulated=False)
    assert resolve_device_gpu("simulated NVIDIA H200-SXM-141GB", None, simulated=True) == "h100"


# --- correctness ------------------------------------------------------------------------


def test_the_selection_covers_every_variant_stage_count_and_tail():
    chosen = selection(get_gpu("h100"), ["tensor_gemm"])
    assert sum(len(s) for _, _, s in chosen) >= 300
    covered = {
        (variant_of(w), s.smem_stages, s.reg_stages)
        for _, w, schedules in chosen
        for s in schedules
    }
    assert covered == {(v, st, r) for v in VARIANTS for st in range(1, 7) for r in (1, 2)}
    axes = {
        axis
        for _, w, schedules in chosen
        for s in schedules
        for axis, t in tails(w, s).items()
        if t
    }
    assert axes == {"m", "n", "k"}
    convs = [w for _, w in CASES if w.op.startswith("conv")]
    assert {(w.stride, w.pad) for w in convs} == {(2, 1), (1, 0)}


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_memops_selection_covers_every_op_knob_value_stratum_and_tail(gpu):
    spec = get_gpu(gpu)
    chosen = selection(spec, ["memops"])
    assert sum(len(s) for _, _, s in chosen) >= 300
    assert {w.op for _, w, _ in chosen} == set(MEM_OPS)
    assert {kind_of(w) for _, w, _ in chosen} == {
        "reduce-sum", "reduce-max", "softmax", "softmax-causal", "layernorm", "rmsnorm",
        "bias_gelu", "bias_gelu-tanh", "silu_mul", "rmsnorm.bfloat16", "softmax.bfloat16",
    }  # fmt: skip
    fam = family("memops")
    # The float16 kinds, two cases each (bfloat16's cases check its conversions on one each).
    for kind in {kind_of(w) for _, w in MEMOPS_CASES if w.dtype == "float16"}:
        mine = [(w, s) for _, w, s in chosen if kind_of(w) == kind]
        spaces = [fam.enumerate(w, spec) for w, _ in mine]
        allowed = {(k.name, getattr(x, k.name)) for sp in spaces for x in sp for k in MEMOPS_KNOBS}
        reached = {(k.name, getattr(x, k.name)) for _, s in mine for x in s for k in MEMOPS_KNOBS}
        assert reached == allowed, kind  # every knob value the op's cases allow
        # The long rows reach the other end of the blocks_per_row knob.
        assert ("blocks_per_row", 128) in reached and ("max_waves", 4) in reached
        strata = {memops_stratum(x) for sp in spaces for x in sp}
        assert {memops_stratum(x) for _, s in mine for x in s} == strata, kind
    axes = {a for _, w, s in chosen for x in s for a, t in memops_tails(w, x).items() if t}
    assert axes == {"rows", "segment", "lanes"}


@pytest.mark.parametrize(("failed", "stop"), [(3, False), (4, True), (0, False)])
def test_more_than_one_percent_failing_stops_the_campaign(failed, stop):
    assert FAILURE_LIMIT == 0.01
    assert stops(failed, 324) is stop


def test_the_document_lists_every_mismatch_with_its_schedule_and_error():
    workload = CASES[0][1]
    schedules = [Schedule(1, 1, 1, 1, 1, s, 1) for s in (1, 2, 3)]
    results = [
        MeasureResult(status="ok", max_abs_error=0.01, runner="cupy"),
        MeasureResult(
            status="wrong_result", max_abs_error=2.5, error="17 outputs off", runner="cupy"
        ),
        MeasureResult(status="runtime_error", error="illegal address", runner="cupy"),
    ]
    doc = summarise([("case", workload, schedules, results)], {}, runner="cupy", simulated=False)
    assert (doc["schedules"], doc["passed"], doc["failed"], doc["verdict"]) == (3, 1, 2, "stop")
    assert doc["by_variant"]["gemm_kn"] == {"ok": 1, "wrong_result": 1, "runtime_error": 1}
    wrong = doc["mismatches"][0]
    assert wrong["schedule"]["smem_stages"] == 2 and wrong["error"] == "17 outputs off"
    assert wrong["max_abs_error"] == 2.5 and doc["verified"]


def _checked(case_workloads, failing=0):
    """Checked cases of the selection (all ok but the first ``failing`` schedules)."""
    checked, left = [], failing
    for case, workload, schedules in case_workloads:
        results = []
        for _ in schedules:
            bad = left > 0
            left -= bad
            results.append(
                MeasureResult(status="wrong_result" if bad else "ok", error="off", runner="cupy")
                if bad
                else MeasureResult(status="ok", max_abs_error=0.0, runner="cupy")
            )
        checked.append((case, workload, schedules, results))
    return checked


def _checked_every(case_workloads, step):
    """Checked cases of the selection where every ``step``-th schedule fails, whatever its
    case and knobs: failures no knob value or kind of kernel explains."""
    checked, i = [], 0
    for case, workload, schedules in case_workloads:
        results = []
        for _ in schedules:
            bad = i % step == step - 1
            i += 1
            results.append(
                MeasureResult(status="wrong_result", error="off", runner="cupy")
                if bad
                else MeasureResult(status="ok", max_abs_error=0.0, runner="cupy")
            )
        checked.append((case, workload, schedules, results))
    return checked


def test_each_family_is_held_to_the_limit_on_its_own_schedules():
    gpu = get_gpu("h100")
    gemm_cases = _checked(selection(gpu, ["tensor_gemm"]))
    memops_cases = _checked_every(selection(gpu, ["memops"]), step=20)  # 28 of 560, spread
    doc = summarise(gemm_cases + memops_cases, {}, runner="cupy", simulated=False)
    assert (doc["schedules"], doc["failed"]) == (1172, 28)
    assert doc["verdict"] == "stop"
    assert doc["families"]["memops"]["verdict"] == "stop"
    assert doc["families"]["tensor_gemm"]["verdict"] == "pass"
    assert doc["quarantined"] == {} and quarantine_note(doc) is None
    assert stop_reason(doc).startswith("correctness: 28 of 560 schedules failed (memops)")
    assert [m["family"] for m in doc["mismatches"]] == ["memops"] * 28
    assert sum(doc["by_variant"]["reduce-sum"].values()) == 56
    assert doc["by_variant"]["reduce-sum"]["wrong_result"] == 2
    assert (
        len(doc["by_stages"]) == 12
        and sum(sum(c.values()) for c in doc["by_mapping"].values()) == 560
    )
    assert set(doc["tails"]) == {"m", "n", "k", "rows", "segment", "lanes"}
    fine = summarise(
        gemm_cases + _checked(selection(gpu, ["memops"]), failing=3), {}, runner="cupy",
        simulated=False,
    )  # fmt: skip
    assert fine["verdict"] == "pass" and stop_reason(fine) is None


def test_failures_of_one_kind_of_kernel_quarantine_it_and_the_rest_goes_on():
    """Six failing reduce-sum kernels of 560: the family is held to the limit without the
    reduce-sum kernels (504 checked, none failed), so only those are left out."""
    gpu = get_gpu("h100")
    gemm_cases = _checked(selection(gpu, ["tensor_gemm"]))
    memops_cases = _checked(selection(gpu, ["memops"]), failing=6)  # all in the first case
    doc = summarise(gemm_cases + memops_cases, {}, runner="cupy", simulated=False)
    memops = doc["families"]["memops"]
    assert doc["verdict"] == memops["verdict"] == "quarantined" and stop_reason(doc) is None
    assert memops["quarantined"] == [
        {"knob": "variant", "value": "reduce-sum", "schedules": 56, "failed": 6}
    ]
    assert memops["kept"] == {"schedules": 504, "failed": 0}
    assert doc["families"]["tensor_gemm"]["quarantined"] == []
    assert quarantined_features(doc) == {"memops": [("variant", "reduce-sum")]}
    assert "memops variant=reduce-sum (6 of 56 checked failed)" in quarantine_note(doc)
    # A later call's merge keeps the quarantine.
    assert (
        merge(summarise(gemm_cases, {}, runner="cupy", simulated=False), doc)["quarantined"]
        == doc["quarantined"]
    )


def _outcomes(rows):
    """(features, failed) of schedules given as (tile, stages, loop, failed)."""
    return [
        ([("tile", t), ("stages", s), ("loop", lp), ("variant", "gemm")], bad)
        for t, s, lp, bad in rows
    ]


def test_a_quarantine_is_the_fewest_values_that_leave_the_rest_passing():
    grid = [(t, s, lp) for t in (64, 128, 256) for s in (3, 4, 5, 6) for lp in (0, 1, 2)]
    # Every stream-K schedule (loop 2) with 4 or 5 stages fails: loop=2 explains all of them.
    confined = _outcomes([(t, s, lp, lp == 2 and s in (4, 5)) for t, s, lp in grid * 4])
    assert quarantine(confined) == [("loop", 2)]
    assert not excluded(confined[0][0], [("loop", 2)])  # loop 0
    assert excluded(confined[2][0], [("loop", 2)])  # loop 2
    # Two causes: two values. (The second, 256-wide tiles with 6 stages, is explained as
    # well by either value; the one whose schedules fail more often goes.)
    two = _outcomes([(t, s, lp, lp == 2 or (t == 256 and s == 6)) for t, s, lp in grid * 4])
    assert quarantine(two) == [("loop", 2), ("stages", 6)]
    # Three causes are more than a quarantine may leave out.
    three = _outcomes(
        [(t, s, lp, lp == 2 or t == 256 or s == 3) for t, s, lp in grid * 4]
    )  # fmt: skip
    assert quarantine(three) is None
    # Failures everywhere at the same rate: no value explains them.
    spread = _outcomes([(t, s, lp, i % 7 == 0) for i, (t, s, lp) in enumerate(grid * 4)])
    assert quarantine(spread) is None
    # Leaving out the value would keep less than half of the checked schedules.
    most = _outcomes([(t, s, lp, t != 256 and s == 3) for t, s, lp in grid * 4])
    assert quarantine(most) == [("stages", 3)]  # 36 of 144 left out: fine
    wide = _outcomes([(t, s, lp, lp != 0) for t, s, lp in grid * 4])
    assert quarantine(wide) is None  # two values, 96 of 144 left out
    assert quarantine(_outcomes([(64, 3, 0, False)] * 10)) == []


def test_a_later_call_merges_a_family_into_the_document():
    gpu = get_gpu("h100")
    gemm = summarise(_checked(selection(gpu, ["tensor_gemm"])), {}, runner="cupy", simulated=False)
    gemm["seconds"] = 20.0
    assert checked_families(gemm) == ["tensor_gemm"]
    memops = summarise(
        _checked(selection(gpu, ["memops"]), failing=1), {}, runner="cupy", simulated=False
    )
    memops["seconds"] = 5.0
    both = merge(gemm, memops)
    together = summarise(
        _checked(selection(gpu, ["tensor_gemm"])) + _checked(selection(gpu, ["memops"]), 1),
        {},
        runner="cupy",
        simulated=False,
    )
    for key in ("schedules", "failed", "verdict", "by_variant", "by_stages", "by_mapping", "tails"):
        assert both[key] == together[key], key
    assert both["cases"] == together["cases"] and both["mismatches"] == together["mismatches"]
    assert checked_families(both) == ["tensor_gemm", "memops"] and both["seconds"] == 25.0
    assert both["added_later"][0]["families"] == ["memops"]
    # A document written before the families were kept apart checked the GEMMs only.
    old = {k: v for k, v in gemm.items() if k != "families"}
    assert checked_families(old) == ["tensor_gemm"]
    assert merge(old, memops)["schedules"] == 1172


# --- baselines -------------------------------------------------------------------------


def test_a_baseline_is_given_in_its_family_s_unit():
    answer = {"library": "x", "samples_ms": [0.002] * 5}
    softmax = MEMOPS["Softmax_BERT_b1_s128"]
    entry = baseline_entry(softmax, answer)
    assert entry["unit"] == "GB/s" and "tflops" not in entry
    assert entry["throughput"] == pytest.approx(softmax.compulsory_bytes / 2e-6 / 1e9)
    gemm = ALCOP["MM_RN50_FC"]
    entry = baseline_entry(gemm, answer)
    assert entry["unit"] == "TFLOP/s" and entry["tflops"] == entry["throughput"]
    assert entry["throughput"] == pytest.approx(gemm.flops / 2e-6 / 1e12)


def test_a_hold_runs_between_the_flush_and_the_start_event():
    clock = FakeClock([1.0] * 5)
    calls: list[str] = []
    policy = RepeatPolicy(warmup=1, min_repeats=5, max_repeats=5, settle=0.03)

    def record(event):
        calls.append("record")

    clock.record = record
    time_launches(
        lambda: calls.append("launch"),
        lambda: calls.append("flush"),
        clock,
        policy,
        hold=lambda: calls.append("hold"),
    )
    assert calls == ["launch"] + ["flush", "hold", "record", "launch", "record"] * 5


class _Child:
    """The library child as run_baselines calls it: records what it was asked to time."""

    def __init__(self):
        self.timed: list[str] = []

    def call(self, fn, canonical, seed, policy, timeout_s):
        from pipetune.workers.runners.isolation import CallOutcome

        self.timed.append(canonical["op"])
        return CallOutcome("ok", fn(canonical, seed, policy))


def test_a_baseline_timed_the_old_way_is_timed_again_and_keeps_its_figures():
    held = {"library": "x", "samples_ms": [0.002] * 5, "held": True}
    side = type("Side", (), {"vendor_time": staticmethod(lambda c, s, p: held)})
    fc, qk = ALCOP["MM_RN50_FC"], ALCOP["BMM_GPT2_QK"]
    old = baseline_entry(qk, {"library": "cupy.matmul", "samples_ms": [0.125] * 5})
    assert "timing" not in old  # an entry of the first H200 campaign
    now = baseline_entry(fc, held)
    assert now["timing"] == "held"
    document = {"operators": {"MM_RN50_FC": now, "BMM_GPT2_QK": old}}
    operators = {"MM_RN50_FC": fc, "BMM_GPT2_QK": qk}
    assert missing(document, operators) == ["BMM_GPT2_QK"]
    child = _Child()
    done = run_baselines(child, side, operators, document, Deadline(1, 0), lambda d: None)
    assert done and child.timed == ["bmm"]  # the held GEMM was not timed again
    again = document["operators"]["BMM_GPT2_QK"]
    assert again["timing"] == "held" and again["latency_us"] == pytest.approx(2.0)
    assert again["superseded"] == {"library": "cupy.matmul", "latency_us": 125.0, "spread": 0.0}
    assert missing(document, operators) == []


def test_unpack_checks_each_baseline_s_unit_and_throughput():
    answer = {"library": "x", "samples_ms": [0.002] * 5}
    softmax = baseline_entry(MEMOPS["Softmax_BERT_b1_s128"], answer)
    gemm = baseline_entry(ALCOP["MM_RN50_FC"], answer)
    old_gemm = {k: v for k, v in gemm.items() if k not in ("throughput", "unit")}
    failed = {"workload": ALCOP["Conv3D_1"].canonical(), "error": "timeout: 180 s"}
    rows = check_baselines({"operators": {"S": softmax, "G": old_gemm, "C": failed}})
    assert rows["S"][2] == "GB/s" and rows["G"][2] == "TFLOP/s" and "C" not in rows
    assert rows["S"][1] == pytest.approx(softmax["throughput"])
    in_tflops = {**softmax, "unit": "TFLOP/s", "tflops": softmax["throughput"] / 1e3}
    with pytest.raises(UnpackError, match=r"given in TFLOP/s, its family \(memops\) counts GB/s"):
        check_baselines({"operators": {"S": in_tflops}})
    with pytest.raises(UnpackError, match="does not follow"):
        check_baselines({"operators": {"S": {**softmax, "throughput": 1.0}}})


# --- files and archives --------------------------------------------------------------


def test_pack_and_extract_keep_only_campaign_files(tmp_path):
    out = tmp_path / "out"
    layout.write_json(out / "probe.json", {"gpu": "h100"})
    (out / "sweeps").mkdir()
    (out / "sweeps" / "MM_RN50_FC.part000.t4.json.gz").write_bytes(b"x")
    (out / "notes.txt").write_text("not a campaign file")
    size = layout.pack(out, tmp_path / "c.tar.gz")
    assert size == (tmp_path / "c.tar.gz").stat().st_size
    back = layout.extract(tmp_path / "c.tar.gz", tmp_path / "back")
    assert layout.members(back) == ["probe.json", "sweeps/MM_RN50_FC.part000.t4.json.gz"]


def test_the_archive_is_on_disk_before_it_replaces_the_last_one(tmp_path, monkeypatch):
    """The packed archive was renamed over the last good one unflushed: a device machine
    taken away in that moment could leave a short file where the good one was."""
    out = tmp_path / "out"
    layout.write_json(out / "probe.json", {"gpu": "h100"})
    steps: list[str] = []
    synced, replaced = layout.os.fsync, layout.os.replace

    def fsync(fd: int) -> None:
        steps.append(f"fsync {Path(os.readlink(f'/proc/self/fd/{fd}')).name}")
        synced(fd)

    def replace(src, dst) -> None:
        steps.append(f"replace {Path(src).name} -> {Path(dst).name}")
        replaced(src, dst)

    monkeypatch.setattr(layout.os, "fsync", fsync)
    monkeypatch.setattr(layout.os, "replace", replace)
    layout.pack(out, tmp_path / "c.tar.gz")
    assert len(steps) == 2 and steps[0].startswith("fsync .c.tar.gz.")
    assert steps[1] == f"replace {steps[0].removeprefix('fsync ')} -> c.tar.gz"


def test_an_archive_cannot_write_outside_its_folder(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        for name in ("../escaped.json", "/tmp/absolute.json", "probe.json"):
            info = tarfile.TarInfo(name)
            data = b"{}"
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    back = layout.extract(evil, tmp_path / "in")
    assert layout.members(back) == ["probe.json"]
    assert not (tmp_path / "escaped.json").exists()
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(layout.LayoutError, match="no campaign file"):
        layout.extract(empty, tmp_path / "none")


def test_the_deadline_keeps_a_reserve():
    now = [100.0]
    deadline = Deadline(2, reserve_s=20, clock=lambda: now[0])
    assert deadline.left() == 100 and deadline.allows(100) and not deadline.allows(101)
    now[0] += 90
    assert deadline.elapsed() == 90 and not deadline.allows(11)


def test_a_call_that_stops_before_the_sweeps_still_counts_the_parts_it_holds(tmp_path):
    """An operator an earlier call left in parts is partial in the summary of a call that
    paused before the sweeps phase (it was in none of done, partial and left)."""
    from pipetune.workers.campaign.run import Campaign, CampaignOptions

    options = CampaignOptions(
        out_dir=tmp_path, operators="MM_RN50_FC,MM_Square_4k", runner="simulated"
    )
    campaign = Campaign(options, log=lambda line: None)
    (tmp_path / layout.SWEEPS_DIR).mkdir()
    layout.part_path(tmp_path, "MM_Square_4k", 0).write_bytes(b"")
    layout.part_path(tmp_path, "MM_Square_4k", 1).write_bytes(b"")
    sweeps = campaign.summary()["sweeps"]
    assert sweeps["partial"] == {"MM_Square_4k": {"parts": 2}}
    assert sweeps["left"] == ["MM_RN50_FC"] and sweeps["done"] == []


# --- the time plan ---------------------------------------------------------------------


def test_the_plan_counts_the_suite_and_fits_three_calls():
    document = plan_document(get_gpu("h100", calibrated=False), resolve_operators("alcop"))
    assert document["trials"] == 51971 and document["distinct_kernels"] == 10758
    assert document["fits"] and len(document["calls"]) <= 3
    planned = [s["operator"] for call in document["calls"] for s in call["sweeps"]]
    assert list(dict.fromkeys(planned)) == list(FIGURE_13_ORDER)
    for call in document["calls"]:
        assert call["end_s"] <= call["budget_s"]
    assert document["gpu_s_low"] < document["gpu_s_high"]


def test_the_default_plan_adds_the_memops_suite_after_alcop_and_fits_three_calls():
    document = plan_document(
        get_gpu("h100", calibrated=False), resolve_operators(DEFAULT_OPERATORS)
    )
    # ALCOP's 51,971 trials and 10,758 kernels, then the memops suite's 26,072 and 4,484
    # (a memops kernel takes rows and cols as arguments: one per op and schedule, but for
    # the register-cached rows, whose length is compiled in).
    assert document["trials"] == 51971 + 26072
    assert document["distinct_kernels"] == 10758 + 4484
    assert document["kernels_by_kind"] == {
        "gemm_kn": 2840, "bmm": 2238, "conv2d": 2840, "conv3d": 2840,
        "softmax": 1916, "layernorm": 1188, "bias_gelu": 690, "bias_gelu-tanh": 690,
    }  # fmt: skip
    assert set(document["kernels_by_kind"]) <= set(COMPILE_S_PER_KERNEL)
    # A bfloat16 kind ("softmax.bfloat16") compiles as its float16 twin: the same text.
    assert {kind_of(w).partition(".")[0] for _, w in MEMOPS_CASES} <= set(COMPILE_S_PER_KERNEL)
    assert document["fits"] and len(document["calls"]) <= 3
    planned = [s["operator"] for call in document["calls"] for s in call["sweeps"]]
    assert list(dict.fromkeys(planned)) == [*FIGURE_13_ORDER, *MEMOPS]
    for call in document["calls"]:
        assert call["end_s"] <= call["budget_s"]
    # Call 1's phases: setup 45, correctness 25 + 10 (both families), profile 20,
    # baselines 23 x 1.5 + 36 x 0.5.
    assert document["calls"][0]["phases_s"] == pytest.approx(45 + 35 + 20 + 34.5 + 18)
    memops_rows = [r for r in document["operators"] if r["family"] == "memops"]
    assert len(memops_rows) == 36 and all(r["model_kernel_s"] > 0 for r in memops_rows)


def test_the_plan_does_not_fit_when_its_calls_sweep_only_part_of_an_operator():
    """One 3-minute call sweeps Conv3D_1's first parts only: the plan said "fits" (an
    operator with any part planned did not count as left), and a GPU session was planned
    on it."""
    document = plan_document(
        get_gpu("h100", calibrated=False), resolve_operators("Conv3D_1"), calls=1, minutes=3
    )
    (call,) = document["calls"]
    (sweep,) = call["sweeps"]
    assert sweep["operator"] == "Conv3D_1" and sweep["trials"][1] < document["trials"]
    assert call["end_s"] <= call["budget_s"] - document["costs"]["reserve"]
    assert not document["fits"] and document["left"] == ["Conv3D_1"]


def test_the_packer_keeps_the_archive_current(tmp_path):
    from pipetune.workers.campaign.packer import Packer

    out, archive = tmp_path / "out", tmp_path / "c.tar.gz"
    packer = Packer(out, archive)
    layout.write_json(out / "probe.json", {"gpu": "h100"})
    packer.flush()
    with tarfile.open(archive) as tar:
        assert tar.getnames() == ["probe.json"]
    layout.write_json(out / "correctness.json", {"verdict": "pass"})
    packer.request()
    packer.close()  # waits for the last request
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["correctness.json", "probe.json"]
    assert packer.size == archive.stat().st_size and packer.error is None
    idle = Packer(out, None)
    idle.request()
    idle.close()
    assert idle.size is None


def test_the_packer_gives_up_on_an_archive_it_cannot_make(tmp_path, monkeypatch):
    """A FileNotFoundError was always read as a part merged away under the pack, and packed
    again: for an archive whose folder takes no file (/proc) that was for ever, at 100% CPU.
    Now only a vanished part of the campaign's own folder is packed again, a bounded number
    of times; anything else is the packer's error."""
    from pipetune.workers.campaign import packer as packer_module

    out, archive = tmp_path / "out", tmp_path / "c.tar.gz"
    layout.write_json(out / "probe.json", {"gpu": "h100"})
    calls = []

    def archive_folder_gone(folder, target):
        calls.append(1)
        raise FileNotFoundError(2, "No such file or directory", "/proc/.c.tar.gz.x.tmp")

    monkeypatch.setattr(packer_module.layout, "pack", archive_folder_gone)
    packer = packer_module.Packer(out, archive)
    packer.flush()  # (returned never)
    packer.close(final=False)
    assert len(calls) == 1 and packer.error and "could not write" in packer.error

    def part_vanishes(folder, target):
        calls.append(1)
        raise FileNotFoundError(2, "No such file or directory", str(out / "part.json"))

    calls.clear()
    monkeypatch.setattr(packer_module.layout, "pack", part_vanishes)
    again = packer_module.Packer(out, archive)
    again.flush()
    again.close(final=False)
    assert len(calls) == packer_module.MAX_REPACKS + 1 and again.error


def test_unpack_refuses_a_baseline_timed_on_another_operator_s_shape():
    # Baselines are read by operator name, next to that operator's sweep: an entry whose
    # workload is another shape (its throughput consistent with it) was accepted and filed
    # as the named operator's library time.
    answer = {"library": "x", "samples_ms": [0.002] * 5}
    other = baseline_entry(ALCOP["MM_Square_2k"], answer)
    with pytest.raises(UnpackError, match="MM_Square_1k: timed on gemm 2048x2048x2048"):
        check_baselines({"operators": {"MM_Square_1k": other}})
    rows = check_baselines({"operators": {"MM_Square_2k": other}})
    assert rows["MM_Square_2k"][2] == "TFLOP/s"
