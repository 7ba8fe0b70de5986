"""The kernel runner's parent side with the simulated launch (real child processes, real
NVRTC compiles of a sample): batches, faults inside a batch, verification, and the sweeps
phase stopping at a deadline and going on from its checkpoints in a later call, for a GEMM
and for a memory-intensive operator."""

from __future__ import annotations

import pytest

from pipetune.model.family import family
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import ALCOP, MEMOPS
from pipetune.model.space import Space
from pipetune.workers.campaign import layout, sweeps
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS
from pipetune.workers.campaign.sweeps import measurement_order, parts_of, run_sweeps
from pipetune.workers.datasets import check_pipetune, read_t4
from pipetune.workers.datasets.pipetune import record_revision
from pipetune.workers.runners.faults import FaultPlan
from pipetune.workers.runners.sim_runner import SimulatedLaunchRunner

pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) is not installed")

GPU = get_gpu("h100", calibrated=False)
WORKLOAD = ALCOP["BMM_GPT2_QK"]  # 686 schedules: three sweep parts
SCHEDULES = list(Space.enumerate(WORKLOAD, GPU))


pytestmark = pytest.mark.usefixtures("campaign_caches")


def runner(**kwargs) -> SimulatedLaunchRunner:
    return SimulatedLaunchRunner(GPU, settings=CAMPAIGN_SETTINGS, compile_workers=2, **kwargs)


def test_trials_go_to_the_child_in_batches_and_say_simulated():
    with runner(batch_size=16) as measuring:
        results = measuring.measure(WORKLOAD, SCHEDULES[:40])
        assert measuring.batches == 3
        assert measuring.timing_floor_us is not None
        settings = measuring.settings
    assert all(r.status == "ok" and r.runner == "simulated" for r in results)
    assert all(5 <= len(r.samples_us) <= 10 for r in results)
    assert sum(r.compile_ms is not None for r in results) == 4  # the compile sample
    assert settings["simulated"] and settings["verification"] == "none (simulated launch)"
    assert settings["timing_floor_us"] > 0 and settings["min_repeats"] == 5


def test_a_crash_inside_a_batch_fails_only_its_trial():
    plan = FaultPlan(crash=0.1, seed=2)  # one of the 24 crashes its child
    crashing = {s.id for s in SCHEDULES[:24] if plan.fault_of(WORKLOAD.workload_hash, s.id)}
    assert 0 < len(crashing) < 24
    with runner(faults=plan, batch_size=24) as measuring:
        results = measuring.measure(WORKLOAD, SCHEDULES[:24])
        reruns = measuring.batches
    for schedule, result in zip(SCHEDULES[:24], results, strict=True):
        if schedule.id in crashing:
            assert result.status == "runtime_error" and "SIGSEGV" in result.error
        else:
            assert result.status == "ok"
    assert reruns > 1  # the batch was run again one trial at a time


def test_each_result_says_the_revision_of_the_generator_that_made_its_kernel():
    conv = ALCOP["Conv2D_RN50_1"]
    with runner() as measuring:
        convs = measuring.measure(conv, list(Space.enumerate(conv, GPU))[:3])
        gemms = measuring.measure(WORKLOAD, SCHEDULES[:3])
    assert [r.generator_revision for r in convs] == [2, 2, 2]  # the loader that multiplies
    assert [r.generator_revision for r in gemms] == [1, 1, 1]


def test_verification_reports_injected_wrong_results():
    wrong = (SCHEDULES[3].id, SCHEDULES[7].id)
    with runner(wrong=wrong) as measuring:
        results = measuring.verify(WORKLOAD, SCHEDULES[:10])
    statuses = [r.status for r in results]
    assert statuses.count("wrong_result") == 2 and statuses[3] == statuses[7] == "wrong_result"
    assert all(r.latency_us is None for r in results)


class Budget:
    """A deadline that allows a fixed number of parts."""

    def __init__(self, parts: int):
        self.parts = parts

    def allows(self, seconds: float) -> bool:
        self.parts -= 1
        return self.parts >= 0

    def left(self) -> float:
        return 0.0


def test_sweeps_stop_at_the_deadline_and_go_on_from_their_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "PART_SECONDS", 0.5)  # parts of 256: three of them
    operators = {"BMM_GPT2_QK": WORKLOAD}
    checkpoints = []
    with runner() as measuring:
        first = run_sweeps(measuring, GPU, operators, tmp_path, Budget(1), checkpoints.append)
    assert first.stopped and first.parts_measured == 1 and checkpoints
    # The part it stopped before, numbered as the log numbers the parts (it said "part 1",
    # the log's "part 2/3").
    assert "BMM_GPT2_QK part 2/3 needs" in first.stopped
    assert first.partial == {"BMM_GPT2_QK": {"measured": 256, "of": 686, "parts": 1, "of_parts": 3}}
    assert list(layout.parts_present(tmp_path, "BMM_GPT2_QK")) == [0]
    with runner() as measuring:
        second = run_sweeps(measuring, GPU, operators, tmp_path, Budget(10), lambda p: None)
    assert second.stopped is None and second.parts_measured == 2 and second.done == ["BMM_GPT2_QK"]
    assert layout.parts_present(tmp_path, "BMM_GPT2_QK") == {}
    dataset = read_t4(layout.sweep_path(tmp_path, "BMM_GPT2_QK"))
    info = check_pipetune(dataset)
    assert info.runner == "simulated" and len(dataset) == 686
    assert {tuple(r.configuration.values()) for r in dataset.records} == {
        tuple(s.as_dict().values()) for s in SCHEDULES
    }
    assert [p["records"] for p in info.metadata["parts"]] == [256, 256, 174]
    # Each record says which revision of its generator line made its kernel.
    assert info.metadata["generator"] == "tensor_gemm.gemm"
    assert {record_revision(r) for r in dataset.records} == {1}
    assert all(r.measurements["generator_revision"] == 1 for r in dataset.records)
    order = measurement_order(Space.enumerate(WORKLOAD, GPU))
    assert [dict(r.configuration) for r in dataset.records[:3]] == [
        s.as_dict() for s in parts_of(order)[0][:3]
    ]


def test_a_quarantined_kind_of_kernel_is_skipped_and_a_knob_value_left_out(tmp_path):
    from pipetune.workers.campaign.correctness import kind_of

    operators = {"BMM_GPT2_QK": WORKLOAD, "Softmax": MEMOPS["Softmax_BERT_b1_s128"]}
    left_out = {"tensor_gemm": [("variant", kind_of(WORKLOAD))]}
    with runner() as measuring:
        skipped = run_sweeps(
            measuring, GPU, operators, tmp_path / "a", Budget(10), lambda p: None,
            quarantined=left_out,
        )  # fmt: skip
    assert skipped.skipped == ["BMM_GPT2_QK"] and skipped.done == ["Softmax"]
    assert not layout.sweep_path(tmp_path / "a", "BMM_GPT2_QK").exists()
    assert skipped.quarantined["BMM_GPT2_QK"]["left_out"] == 686
    stages = {"tensor_gemm": [("smem_stages", 1)]}
    with runner() as measuring:
        cut = run_sweeps(
            measuring, GPU, {"BMM_GPT2_QK": WORKLOAD}, tmp_path / "b", Budget(10),
            lambda p: None, quarantined=stages,
        )  # fmt: skip
    dataset = read_t4(layout.sweep_path(tmp_path / "b", "BMM_GPT2_QK"))
    kept = [x for x in SCHEDULES if x.smem_stages != 1]
    assert cut.done == ["BMM_GPT2_QK"] and 0 < len(dataset) == len(kept) < len(SCHEDULES)
    assert all(r.configuration["smem_stages"] != 1 for r in dataset.records)
    assert dataset.metadata["pipetune"]["quarantined"] == cut.quarantined["BMM_GPT2_QK"]


def test_parts_cut_another_way_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "PART_SECONDS", 0.5)
    operators = {"BMM_GPT2_QK": WORKLOAD}
    with runner() as measuring:
        run_sweeps(measuring, GPU, operators, tmp_path, Budget(1), lambda p: None)
        monkeypatch.setattr(sweeps, "PART_SECONDS", 1e6)  # this "version" cuts one part
        with pytest.raises(layout.LayoutError, match="as this version cuts them"):
            run_sweeps(measuring, GPU, operators, tmp_path, Budget(1), lambda p: None)


def test_an_operator_faster_than_a_part_is_one_part():
    order = measurement_order(Space.enumerate(WORKLOAD, GPU))
    assert sweeps.part_size(WORKLOAD, GPU, order) >= len(order)
    conv = ALCOP["Conv3D_1"]
    assert sweeps.part_size(conv, GPU, measurement_order(Space.enumerate(conv, GPU))) == 256


def test_a_memops_operator_sweeps_in_parts_like_a_gemm(tmp_path, monkeypatch):
    softmax = MEMOPS["Softmax_BERT_b1_s128"]  # 341 schedules: two parts of 256 at most
    space = family("memops").enumerate(softmax, GPU)
    order = measurement_order(space)
    assert sweeps.part_size(softmax, GPU, order) >= len(order)  # one part, as planned
    monkeypatch.setattr(sweeps, "PART_SECONDS", 0.05)
    assert sweeps.part_size(softmax, GPU, order) == 256
    operators = {"Softmax_BERT_b1_s128": softmax}
    with runner() as measuring:
        first = run_sweeps(measuring, GPU, operators, tmp_path, Budget(1), lambda p: None)
    assert first.stopped and first.partial["Softmax_BERT_b1_s128"]["of_parts"] == 2
    assert not layout.sweep_path(tmp_path, "Softmax_BERT_b1_s128").exists()
    with runner() as measuring:
        second = run_sweeps(measuring, GPU, operators, tmp_path, Budget(10), lambda p: None)
    assert second.done == ["Softmax_BERT_b1_s128"] and second.parts_measured == 1
    dataset = read_t4(layout.sweep_path(tmp_path, "Softmax_BERT_b1_s128"))
    info = check_pipetune(dataset)
    assert info.runner == "simulated" and len(dataset) == len(space) == 341
    assert all(r.status == "ok" and r.time_ms > 0 for r in dataset.records)
    assert {tuple(r.configuration.values()) for r in dataset.records} == {
        tuple(s.as_dict().values()) for s in space
    }
    assert [p["records"] for p in info.metadata["parts"]] == [256, 85]
