"""The campaign's parts that need no child process: the timing loop, the reference cache,
the operator order, the device's GPU, the correctness verdict, the files and archives, the
time plan."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.operators import ALCOP, SUITES
from pipetune.model.space import Schedule
from pipetune.model.trials import MeasureResult
from pipetune.workers.campaign import layout
from pipetune.workers.campaign.correctness import (
    CASES,
    FAILURE_LIMIT,
    selection,
    stops,
    summarise,
    tails,
)
from pipetune.workers.campaign.deadline import Deadline
from pipetune.workers.campaign.operators import FIGURE_13_ORDER, resolve_operators
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS, plan_document
from pipetune.workers.campaign.run import CampaignUsageError, resolve_device_gpu
from pipetune.workers.codegen import VARIANTS, variant_of
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


# --- operators and the device's GPU -----------------------------------------------------


def test_the_suite_sweeps_in_figure_13_order_and_names_mix():
    assert sorted(FIGURE_13_ORDER) == sorted(ALCOP)
    assert list(resolve_operators("alcop")) == list(FIGURE_13_ORDER)
    assert list(resolve_operators("MM_RN50_FC,bmm_gpt2_qk")) == ["MM_RN50_FC", "BMM_GPT2_QK"]
    mixed = list(resolve_operators("Conv3D_1,alcop"))
    assert mixed[0] == "Conv3D_1" and len(mixed) == len(ALCOP)
    with pytest.raises(ValueError, match="'MM_Nope'"):
        resolve_operators("alcop,MM_Nope")
    others = [n for n, ops in SUITES.items() if n != "alcop"]
    for name in others:  # suites of other kernel families (memops, ...)
        with pytest.raises(ValueError, match="pipelined GEMM family"):
            resolve_operators(name)


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
    chosen = selection(get_gpu("h100"))
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
