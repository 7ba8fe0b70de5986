"""`pipetune tune-model`'s parts without a service: the networks' tensor-core layers and
how the per-layer baseline and the end-to-end speedup are computed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipetune.clients.tune_model import LayerResult, document, latency_kind, model_non_pipelined_us
from pipetune.model.networks import network
from pipetune.model.space import Schedule
from pipetune.model.wire import BestTrial, ScheduleDoc, TaskDoc, TrialDoc
from pipetune.model.workloads import Bmm, Conv2d, Gemm, WorkloadError


def test_bert_base_has_six_distinct_shapes_twelve_times_each():
    net = network("bert-base", batch=2, seq=128)
    shapes = net.distinct()
    assert len(net.layers) == 72 and [s.count for s in shapes] == [12] * 6
    labels = [s.workload.label() for s in shapes]
    assert labels == [
        "gemm 256x2304x768",
        "bmm 24x128x128x64",
        "bmm 24x128x64x128",
        "gemm 256x768x768",
        "gemm 256x3072x768",
        "gemm 256x768x3072",
    ]


def test_equal_shapes_are_counted_once():
    # At seq 64 the two attention BMMs are the same 64x64x64 product.
    shapes = network("gpt2", batch=1, seq=64).distinct()
    attention = [s for s in shapes if isinstance(s.workload, Bmm)]
    assert len(attention) == 1 and attention[0].count == 24
    assert attention[0].layers == ("attn_qk", "attn_sv")


def test_resnet50_layers_stem_padding_and_strided_1x1():
    net = network("resnet50", batch=8)
    assert len(net.layers) == 54  # stem + 16 bottlenecks x 3 + 4 projections + fc
    stem = net.layers[0].workload
    assert isinstance(stem, Conv2d) and (stem.c, stem.r, stem.stride) == (8, 7, 2)
    assert any("padded from 3 to 8" in note for note in net.notes)
    downsample = [layer.workload for layer in net.layers if layer.name.endswith("downsample")]
    assert isinstance(downsample[0], Gemm)  # stride 1: a plain GEMM
    assert all(isinstance(w, Conv2d) and w.stride == 2 for w in downsample[1:])
    assert net.layers[-1].workload.label() == "gemm 8x1000x2048"
    assert sum(s.count for s in net.distinct()) == 54


def test_defaults_follow_alcop_and_bad_sizes_name_the_field():
    assert network("bert-base").seq == 512 and network("gpt2").seq == 1024
    assert network("resnet50").batch == 64
    with pytest.raises(WorkloadError, match="seq: must be a multiple of 8"):
        network("bert-base", seq=100)
    with pytest.raises(WorkloadError, match="unknown network"):
        network("vgg16")


def _doc(schedule: Schedule) -> ScheduleDoc:
    return ScheduleDoc(**schedule.as_dict())


def _task(best_us: float, schedule: Schedule) -> TaskDoc:
    now = datetime.now(UTC)
    workload = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
    return TaskDoc(
        id=1,
        state="done",
        workload=workload,
        gpu="h100",
        strategy="analytical+xgb",
        budget=3,
        seed=0,
        trials_done=3,
        trials_failed=0,
        best=BestTrial(trial=0, schedule=_doc(schedule), latency_us=best_us, tflops=1.0),
        created_at=now,
        updated_at=now,
    )


PIPELINED = Schedule(2, 2, 1, 1, 8, 5, 2)
FLAT = Schedule(2, 2, 1, 1, 8, 1, 1)


def _trial(i: int, schedule: Schedule, us: float) -> TrialDoc:
    return TrialDoc(trial=i, state="done", status="ok", schedule=_doc(schedule), latency_us=us)


def test_baseline_is_the_best_non_pipelined_trial_else_the_model():
    shape = network("bert-base", seq=128).distinct()[0]
    trials = [_trial(0, PIPELINED, 4.0), _trial(1, FLAT, 9.0), _trial(2, FLAT, 8.0)]
    measured = LayerResult(shape, _task(4.0, PIPELINED), trials, 7.0, {"cupy"})
    assert measured.baseline() == (8.0, "trials") and measured.speedup() == 2.0
    modelled = LayerResult(shape, _task(4.0, PIPELINED), trials[:1], 7.0, {"cupy"})
    assert modelled.baseline() == (7.0, "model") and modelled.speedup() == 1.75

    net = network("bert-base", seq=128)
    doc = document(net, "h100", 3, "analytical+xgb", [measured, modelled])
    counts = measured.shape.count + modelled.shape.count
    assert doc["end_to_end"]["speedup"] == pytest.approx(12 * (8.0 + 7.0) / (counts * 4.0))
    assert doc["latencies"] == "measured on GPUs (cupy workers)"
    assert "mixed" in latency_kind(
        [measured, LayerResult(shape, measured.task, [], 7.0, {"simulated"})]
    )


def test_the_model_baseline_is_the_best_non_pipelined_prediction():
    from pipetune.model.analytical import evaluate
    from pipetune.model.hardware import get_gpu
    from pipetune.model.pipelining import non_pipelined
    from pipetune.model.space import Space

    workload = network("bert-base", seq=128).layers[0].workload
    space = Space.enumerate(workload, get_gpu("h100"))
    expected = float(evaluate(space).latency_us[non_pipelined(space)].min())
    assert model_non_pipelined_us(workload, "h100") == pytest.approx(expected)
