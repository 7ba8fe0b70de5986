"""`pipetune tune-model`'s parts without a service: the networks' operators (tensor-core
layers and the transformers' memory-intensive ones), how the per-layer baseline, the
end-to-end speedup and each family's share of the time are computed, and the report."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.tune_model import (
    LayerResult,
    document,
    latency_kind,
    model_baseline_us,
    print_report,
)
from pipetune.model.family import family, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.analytical import one_row_per_block
from pipetune.model.memops.workloads import (
    BiasGelu,
    LayerNorm,
    RMSNorm,
    Softmax,
    layernorm,
    softmax,
)
from pipetune.model.networks import network
from pipetune.model.operators import MEMOPS
from pipetune.model.space import Schedule
from pipetune.model.wire import BestTrial, ScheduleDoc, TaskDoc, TrialDoc
from pipetune.model.workloads import Bmm, Conv2d, Gemm, WorkloadError


def test_bert_base_has_six_distinct_shapes_twelve_times_each():
    net = network("bert-base", batch=2, seq=128)
    shapes = net.distinct("tensor_gemm")
    assert len(net.of_family("tensor_gemm")) == 72 and [s.count for s in shapes] == [12] * 6
    labels = [s.workload.label() for s in shapes]
    assert labels == [
        "gemm 256x2304x768",
        "bmm 24x128x128x64 nk",  # Q·Kᵀ over the keys as stored (sequence-major)
        "bmm 24x128x64x128",
        "gemm 256x768x768",
        "gemm 256x3072x768",
        "gemm 256x768x3072",
    ]


def test_equal_shapes_are_counted_once():
    # At seq 64 the two attention BMMs are 64x64x64 products, but of two kernels: Q·Kᵀ reads
    # the keys N x K as stored, S·V the values K x N. Each is counted once per block.
    shapes = network("gpt2", batch=1, seq=64).distinct()
    attention = [s for s in shapes if isinstance(s.workload, Bmm)]
    assert [(s.layers, s.count) for s in attention] == [(("attn_qk",), 12), (("attn_sv",), 12)]
    assert [s.workload.b_layout for s in attention] == ["nk", "kn"]
    # The 12 blocks' equal layers are one shape each.
    assert all(s.count % 12 == 0 for s in shapes)


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


def test_llama2_7b_lists_its_rms_norms_gemms_and_attention():
    net = network("llama2-7b", batch=1, seq=512)
    order = ["input_norm", "qkv", "attn_qk", "attn_softmax", "attn_sv", "attn_proj",
             "post_attention_norm", "gate_up", "swiglu", "down"]  # fmt: skip
    assert len(net.layers) == 32 * 10
    assert (
        [layer.name for layer in net.layers[:10]]
        == order
        == [layer.name for layer in net.layers[-10:]]
    )
    labels = {s.workload.label(): s.count for s in net.distinct()}
    assert labels == {
        "rmsnorm 512x4096 eps=1e-05": 64,  # both norms of a block are one shape
        "gemm 512x12288x4096": 32,
        "bmm 32x512x512x128 nk": 32,
        "softmax 16384x512 scale=0.0883883 causal": 32,  # 1/sqrt(128), a decoder's mask
        "bmm 32x512x128x512": 32,
        "gemm 512x4096x4096": 32,
        "gemm 512x22016x4096": 32,
        "silu_mul 512x11008": 32,  # gate and up: the halves of gate_up's rows
        "gemm 512x4096x11008": 32,
    }
    (norm,) = net.distinct("memops")[:1]
    assert isinstance(norm.workload, RMSNorm) and norm.layers == (
        "input_norm",
        "post_attention_norm",
    )
    assert any("the rotary embedding" in note and "not listed" in note for note in net.notes)
    assert network("llama2-7b").seq == 2048 and network("llama2-7b", seq=4096).seq == 4096
    with pytest.raises(WorkloadError, match=r"^seq: llama2-7b takes at most 4096 tokens"):
        network("llama2-7b", seq=8192)
    with pytest.raises(WorkloadError, match=r"^batch/seq: batch 8 x seq 4096 is too large"):
        network("llama2-7b", batch=8, seq=4096)  # 256 heads of 4096 x 4096 scores


def test_llama2_70b_folds_each_key_value_head_s_query_heads_into_one_bmm():
    net = network("llama2-70b", batch=2, seq=256)
    assert len(net.layers) == 80 * 10
    labels = {s.workload.label(): s.count for s in net.distinct()}
    tokens = 2 * 256
    assert labels == {
        f"rmsnorm {tokens}x8192 eps=1e-05": 160,
        f"gemm {tokens}x10240x8192": 80,  # Q 8192 + K and V of 8 heads of 128
        "bmm 16x2048x256x128 nk": 80,  # b = batch x 8 KV heads, M = 8 query heads x seq
        # one row per (sequence, query head, query): 2 x 64 x 256
        "softmax 32768x256 scale=0.0883883 causal": 80,
        "bmm 16x2048x128x256": 80,
        f"gemm {tokens}x8192x8192": 80,
        f"gemm {tokens}x57344x8192": 80,
        f"silu_mul {tokens}x28672": 80,
        f"gemm {tokens}x8192x28672": 80,
    }
    assert any("grouped-query attention: 64 query heads over 8" in n for n in net.notes)
    # The folded BMMs do the work of 64 heads' separate ones.
    qk = next(s.workload for s in net.distinct() if s.layers == ("attn_qk",))
    assert qk.b * qk.m * qk.n * qk.k == 2 * 64 * 256 * 256 * 128
    assert not any("grouped-query" in n for n in network("llama2-7b", seq=256).notes)


def test_a_decode_step_is_one_token_per_sequence_against_the_cached_context():
    net = network("llama2-7b", batch=16, seq=4096, decode=True)
    assert net.decode and net.seq == 4096 and len(net.layers) == 32 * 10
    labels = {s.workload.label(): s.count for s in net.distinct()}
    assert labels == {
        "rmsnorm 16x4096 eps=1e-05": 64,
        "gemm 16x12288x4096": 32,  # the batch's 16 new tokens
        "bmm 512x1x4096x128 nk": 32,  # one query row per (sequence, head), 4096 cached keys
        "softmax 512x4096 scale=0.0883883": 32,  # one query sees every key: no mask
        "bmm 512x1x128x4096": 32,
        "gemm 16x4096x4096": 32,
        "gemm 16x22016x4096": 32,
        "silu_mul 16x11008": 32,
        "gemm 16x4096x11008": 32,
    }
    assert any("one decode step" in n and "4096 cached positions" in n for n in net.notes)
    # Grouped-query attention: a key/value head's query heads are its BMM's rows, M = group.
    gqa = {s.layers: s.workload.label() for s in network("llama2-70b", 2, 1024, True).distinct()}
    assert gqa[("attn_qk",)] == "bmm 16x8x1024x128 nk" and gqa[("attn_sv",)] == "bmm 16x8x128x1024"
    # 2 sequences x 64 query heads
    assert gqa[("attn_softmax",)] == "softmax 128x1024 scale=0.0883883"
    gpt2 = {s.layers: s.workload.label() for s in network("gpt2", 4, 512, True).distinct()}
    assert gpt2[("qkv",)] == "gemm 4x2304x768" and gpt2[("attn_qk",)] == "bmm 48x1x512x64 nk"
    # The whole sequence at once (prefill) is unchanged by the option's existence.
    assert not network("gpt2", 4, 512).decode
    assert network("gpt2", 4, 512).distinct()[1].workload.label() == "gemm 2048x2304x768"
    with pytest.raises(WorkloadError, match=r"^decode: bert-base is an encoder"):
        network("bert-base", decode=True)
    with pytest.raises(WorkloadError, match=r"^decode: resnet50 is not a network of sequences"):
        network("resnet50", decode=True)
    with pytest.raises(WorkloadError, match=r"^seq: must be a multiple of 8"):
        network("gpt2", seq=1000 + 1, decode=True)  # the context is Q·Kᵀ's N


def test_defaults_follow_alcop_and_bad_sizes_name_the_field():
    assert network("bert-base").seq == 512 and network("gpt2").seq == 1024
    assert network("resnet50").batch == 64
    with pytest.raises(WorkloadError, match="seq: must be a multiple of 8"):
        network("bert-base", seq=100)
    with pytest.raises(WorkloadError, match="unknown network"):
        network("vgg16")
    # Past its position table the sequence belongs to no BERT-base (GPT-2) there is.
    with pytest.raises(WorkloadError, match=r"^seq: bert-base takes at most 512 tokens"):
        network("bert-base", seq=1024)
    with pytest.raises(WorkloadError, match=r"^seq: gpt2 takes at most 1024 tokens"):
        network("gpt2", seq=2048)
    assert network("bert-base", seq=512).seq == 512 and network("gpt2", seq=1024).seq == 1024
    # A layer's own limit named its GEMM's m, a field no user gives.
    with pytest.raises(WorkloadError, match=r"^batch/seq: batch 100000000 x seq 512 is too"):
        network("bert-base", batch=100_000_000)
    with pytest.raises(WorkloadError, match=r"^batch: batch 100000000 is too large for resnet"):
        network("resnet50", batch=100_000_000)


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
    assert model_baseline_us(workload, "h100") == pytest.approx(expected)


# ---- the memory-intensive operators -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "eps", "gelu", "order"),
    [
        # BERT is post-LN: a layer norm after each residual add.
        ("bert-base", 1e-12, "none", ["qkv", "attn_qk", "attn_softmax", "attn_sv",
         "attn_proj", "ln_attn", "fc1", "fc1_bias_gelu", "fc2", "ln_ffn"]),
        # GPT-2 is pre-LN: a layer norm before the attention and before the MLP.
        ("gpt2", 1e-5, "tanh", ["ln_1", "qkv", "attn_qk", "attn_softmax", "attn_sv",
         "attn_proj", "ln_2", "fc1", "fc1_bias_gelu", "fc2"]),
    ],
)  # fmt: skip
def test_transformers_list_softmax_layernorm_and_bias_gelu(
    name: str, eps: float, gelu: str, order: list[str]
):
    net = network(name, batch=2, seq=128)
    assert len(net.layers) == 12 * 10
    assert [layer.name for layer in net.layers[:10]] == order
    assert [layer.name for layer in net.layers[-10:]] == order  # every block the same
    memops = {s.workload.op: s for s in net.distinct("memops")}
    assert set(memops) == {"softmax", "layernorm", "bias_gelu"}
    assert sum(s.count for s in memops.values()) == 12 * 4 == len(net.of_family("memops"))

    sm = memops["softmax"]  # rows = batch·heads·seq, cols = seq
    assert isinstance(sm.workload, Softmax) and (sm.workload.rows, sm.workload.cols) == (
        2 * 12 * 128,
        128,
    )
    assert sm.count == 12 and sm.layers == ("attn_softmax",)
    # attention's: scaled by 1/sqrt(64), and masked in the decoder (GPT-2) only
    assert sm.workload.scale == 0.125 and sm.workload.causal == (name == "gpt2")
    assert sm.workload.mask_queries == (128 if name == "gpt2" else 0)

    ln = memops["layernorm"]  # both norms of a block are one shape: 24 runs
    assert isinstance(ln.workload, LayerNorm)
    assert (ln.workload.rows, ln.workload.cols, ln.workload.eps) == (256, 768, eps)
    assert ln.count == 24 and len(ln.layers) == 2

    bg = memops["bias_gelu"]
    assert isinstance(bg.workload, BiasGelu)
    assert (bg.workload.rows, bg.workload.cols, bg.workload.approximate) == (256, 3072, gelu)
    assert bg.count == 12 and bg.layers == ("fc1_bias_gelu",)
    assert any("layer norms (eps" in note for note in net.notes)


def test_memops_match_the_benchmark_suite_shapes():
    # The same operators as model/operators.py's memops suite (batch 8; BERT-base takes at
    # most 512 tokens, so its suite entries at 128).
    # The suite's softmax is the plain one (its recorded sweeps keep their identity): the
    # network's is the same shape with attention's scale, and GPT-2's causal mask.
    for name, tag, seq in (("bert-base", "BERT", 128), ("gpt2", "GPT2", 1024)):
        hashes = {s.workload.workload_hash for s in network(name, 8, seq).distinct("memops")}
        plain = MEMOPS[f"Softmax_{tag}_b8_s{seq}"]
        attention = softmax(plain.rows, plain.cols, 0.125, causal=name == "gpt2")
        suite = {MEMOPS[f"{op}_{tag}_b8_s{seq}"].workload_hash for op in ("LayerNorm", "BiasGELU")}
        assert hashes == suite | {attention.workload_hash}


def test_resnet50_stays_tensor_core_only():
    net = network("resnet50", batch=8)
    assert net.of_family("memops") == [] and len(net.of_family("tensor_gemm")) == 54


def _any_task(task_id: int, workload: dict, best_us: float, schedule: dict, unit: str) -> TaskDoc:
    now = datetime.now(UTC)
    best = BestTrial(
        trial=0,
        schedule=ScheduleDoc(**schedule),
        latency_us=best_us,
        throughput=1.0,
        throughput_unit=unit,
    )
    return TaskDoc(
        id=task_id,
        state="done",
        workload=workload,
        gpu="h100",
        strategy="auto",
        budget=3,
        seed=0,
        trials_done=3,
        trials_failed=0,
        best=best,
        created_at=now,
        updated_at=now,
    )


def _mem_schedules(workload) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """One schedule of the one-row-per-block baseline and one outside it."""
    space = family("memops").enumerate(workload, get_gpu("h100"))
    mask = one_row_per_block(space)
    return space[int(mask.argmax())].as_dict(), space[int((~mask).argmax())].as_dict()


def _mixed_results(runner: str = "simulated") -> tuple[list[LayerResult], dict]:
    """qkv (GEMM, 12x at 4 µs) and the layer norm (24x at 1 µs): 48 vs 24 µs."""
    net = network("bert-base", seq=128)
    shapes = {s.layers[0]: s for s in net.distinct()}
    qkv, ln = shapes["qkv"], shapes["ln_attn"]
    gemm_task = _any_task(1, qkv.workload.canonical(), 4.0, PIPELINED.as_dict(), "TFLOP/s")
    base, packed = _mem_schedules(ln.workload)
    mem_task = _any_task(2, ln.workload.canonical(), 1.0, packed, "GB/s")
    mem_trials = [
        TrialDoc(trial=0, state="done", status="ok", schedule=ScheduleDoc(**packed),
                 latency_us=1.0),
        TrialDoc(trial=1, state="done", status="ok", schedule=ScheduleDoc(**base),
                 latency_us=1.5),
    ]  # fmt: skip
    results = [
        LayerResult(qkv, gemm_task, [_trial(0, FLAT, 6.0)], 7.0, {runner}),
        LayerResult(ln, mem_task, mem_trials, 9.0, {runner}),
    ]
    return results, {"net": net, "qkv": qkv, "ln": ln}


def test_memops_baseline_is_the_best_one_row_per_block_trial():
    results, _ = _mixed_results()
    mem = results[1]
    # The packed trial (1.0 µs) is not a baseline schedule; the one-row-per-block one is.
    assert mem.baseline() == (1.5, "trials") and mem.speedup() == pytest.approx(1.5)
    assert mem.baseline_label == "one row per block"
    assert results[0].baseline_label == "non-pipelined"
    no_trials = LayerResult(mem.shape, mem.task, [], 9.0, {"simulated"})
    assert no_trials.baseline() == (9.0, "model")


def test_the_model_baseline_of_a_memop_is_the_best_one_row_per_block_prediction():
    workload = layernorm(256, 768, 1e-12)
    space = family("memops").enumerate(workload, get_gpu("h100"))
    latency = family("memops").evaluate(space).latency_us
    expected = float(latency[one_row_per_block(space)].min())
    assert model_baseline_us(workload, "h100") == pytest.approx(expected)
    assert expected >= float(latency.min())


def test_family_shares_sum_to_one_and_throughput_is_in_the_family_unit():
    results, parts = _mixed_results()
    doc = document(parts["net"], "h100", 3, "auto", results)
    families = {f["family"]: f for f in doc["families"]}
    assert [f["label"] for f in doc["families"]] == ["tensor-core GEMM", "memory-intensive"]
    assert families["tensor_gemm"]["share"] == pytest.approx(48 / 72)
    assert families["memops"]["share"] == pytest.approx(24 / 72)
    assert sum(f["share"] for f in doc["families"]) == pytest.approx(1.0)
    assert families["memops"]["operators"] == 24 and families["memops"]["time_us"] == 24.0
    # Each family's own end-to-end gain over its own baseline, and one over both.
    assert families["tensor_gemm"]["speedup"] == pytest.approx(6.0 / 4.0)
    assert families["memops"]["speedup"] == pytest.approx(1.5)
    assert doc["end_to_end"]["speedup"] == pytest.approx((12 * 6.0 + 24 * 1.5) / 72)

    gemm_row, mem_row = doc["layers"]
    assert (gemm_row["family"], gemm_row["throughput_unit"]) == ("tensor_gemm", "TFLOP/s")
    flops = 2 * 128 * 2304 * 768
    assert gemm_row["throughput"] == pytest.approx(flops / 4e-6 / 1e12)
    assert (mem_row["family"], mem_row["throughput_unit"]) == ("memops", "GB/s")
    # 256x768 fp16 in and out plus gamma and beta, in 1 µs.
    compulsory = 2 * (128 * 768 * 2 + 2 * 768)
    assert mem_row["throughput"] == pytest.approx(compulsory / 1e-6 / 1e9)
    assert mem_row["baseline"] == "one row per block" and mem_row["baseline_source"] == "trials"
    assert mem_row["tuned_schedule_label"] and "x" in mem_row["tuned_schedule_label"]


def test_the_report_shows_families_units_and_the_time_split():
    results, parts = _mixed_results()
    doc = document(parts["net"], "h100", 3, "auto", results)
    console = Console(record=True, width=240)
    print_report(doc, console)
    text = console.export_text()
    mem_line = next(line for line in text.splitlines() if "layernorm 128x768" in line)
    assert "memory-intensive" in mem_line and "GB/s" in mem_line and "TFLOP/s" not in mem_line
    gemm_line = next(line for line in text.splitlines() if "gemm 128x2304x768" in line)
    assert "tensor-core GEMM" in gemm_line and "TFLOP/s" in gemm_line
    assert "tensor-core GEMM 67%, memory-intensive 33%" in text
    # The shares come from simulated latencies and say so.
    split = next(line for line in text.splitlines() if line.startswith("time by family"))
    assert "simulated" in split
    assert "end-to-end (tensor-core GEMM layers)" in text
    assert "end-to-end (memory-intensive layers)" in text
    assert "end-to-end (all listed layers)" in text
    assert doc["phase"] == "prefill" and "(batch 1, seq 128)" in text


def test_the_report_of_a_decode_step_says_so():
    results, _ = _mixed_results()
    net = network("gpt2", batch=8, seq=512, decode=True)
    doc = document(net, "h100", 3, "auto", results)
    assert doc["phase"] == "decode" and doc["seq"] == 512
    console = Console(record=True, width=240)
    print_report(doc, console)
    text = console.export_text()
    assert "gpt2 (batch 8, one decode step at context 512) on h100" in text
    assert "note: one decode step: each sequence's new token attends to 512" in text


def test_launch_warm_starts_the_shapes_a_prior_gpu_has_and_the_rest_cold():
    from pipetune.clients.sdk import ApiError
    from pipetune.clients.tune_model import launch

    shapes = network("bert-base", 1, 128).distinct()[:3]
    calls: list[tuple[dict, str | None]] = []

    class Fake:
        def tune(
            self,
            workload,
            gpu,
            *,
            budget,
            strategy,
            seed,
            batch_size=None,
            priority=1,
            prior_gpu=None,
        ):
            calls.append((workload, prior_gpu))
            if prior_gpu is not None and workload == shapes[1].workload.canonical():
                raise ApiError(422, "prior_gpu: no finished task", field="prior_gpu")
            return len(calls)

    started = launch(Fake(), shapes, "h200", 8, "auto", 0, prior_gpu="h100")  # type: ignore[arg-type]
    assert len(started) == 3
    assert [p for _, p in calls] == ["h100", "h100", None, "h100"]  # the second, again cold

    class Refusing(Fake):
        def tune(
            self,
            workload,
            gpu,
            *,
            budget,
            strategy,
            seed,
            batch_size=None,
            priority=1,
            prior_gpu=None,
        ):
            raise ApiError(422, "budget: too large", field="budget")

    with pytest.raises(ApiError, match="budget"):  # any other refusal is the user's to see
        launch(Refusing(), shapes, "h200", 8, "auto", 0, prior_gpu="h100")  # type: ignore[arg-type]


def test_launch_learns_the_priors_of_the_families_that_have_measurements():
    from pipetune.clients.sdk import ApiError
    from pipetune.clients.tune_model import launch

    shapes = network("bert-base", 1, 128).distinct()[:3]
    calls: list[tuple[dict, bool]] = []

    class Fake:
        def tune(
            self,
            workload,
            gpu,
            *,
            budget,
            strategy,
            seed,
            batch_size=None,
            priority=1,
            learned_prior=False,
        ):
            calls.append((workload, learned_prior))
            if learned_prior and workload == shapes[2].workload.canonical():
                raise ApiError(422, "learned_prior: no finished task", field="learned_prior")
            return len(calls)

    started = launch(Fake(), shapes, "h200", 8, "auto", 0, learned_prior=True)  # type: ignore[arg-type]
    assert started == [1, 2, 4]
    assert [p for _, p in calls] == [True, True, True, False]  # the third, again cold


def test_tune_model_takes_one_prior_only():
    result = CliRunner().invoke(
        app, ["tune-model", "bert-base", "--learned-prior", "--prior-gpu", "h100"]
    )
    assert result.exit_code == 2
    assert "give --prior-gpu or --learned-prior, not both" in result.stderr


def test_on_hopper_moves_the_gemms_and_bmms_to_the_wgmma_family():
    net = network("bert-base", 1, 512)
    hopper = net.on_hopper()
    assert [layer.name for layer in hopper.layers] == [layer.name for layer in net.layers]
    for before, after in zip(net.layers, hopper.layers, strict=True):
        if isinstance(before.workload, Gemm | Bmm):
            assert family_of(after.workload).name == "hopper_gemm"
            assert after.workload.gemm_view() == before.workload.gemm_view()
        else:
            assert after.workload == before.workload
    assert len(hopper.distinct()) == len(net.distinct())
    resnet = network("resnet50").on_hopper()
    families = {family_of(layer.workload).name for layer in resnet.layers}
    assert families == {"hopper_gemm", "tensor_gemm"}  # the convolutions stay


def test_wgmma_needs_a_hopper_gpu():
    result = CliRunner().invoke(app, ["tune-model", "bert-base", "--wgmma", "--gpu", "a100"])
    assert result.exit_code == 2
    assert "--wgmma: the Hopper wgmma family runs on H100 and H200, not a100" in result.stderr


def test_launch_keeps_no_learned_prior_for_the_shapes_that_start_cold():
    """--prior-gpu X --no-learned-prior: a shape without a task on X started cold, but with
    the learned prior the user had turned off."""
    from pipetune.clients.sdk import ApiError
    from pipetune.clients.tune_model import launch

    shapes = network("bert-base", 1, 128).distinct()[:2]
    calls: list[dict] = []

    class Fake:
        def tune(self, workload, gpu, **kwargs):
            calls.append(kwargs)
            if "prior_gpu" in kwargs and workload == shapes[1].workload.canonical():
                raise ApiError(422, "prior_gpu: no finished task", field="prior_gpu")
            return len(calls)

    launch(Fake(), shapes, "h200", 8, "auto", 0, prior_gpu="h100", learned_prior=False)  # type: ignore[arg-type]
    cold = calls[-1]
    assert "prior_gpu" not in cold and cold["learned_prior"] is False


def test_launch_gives_every_shapes_task_the_priority_asked():
    from pipetune.clients.tune_model import launch

    shapes = network("bert-base", 1, 128).distinct()[:3]
    calls: list[dict] = []

    class Fake:
        def tune(self, workload, gpu, **kwargs):
            calls.append(kwargs)
            return len(calls)

    launch(Fake(), shapes, "h200", 8, "auto", 0, priority=3)  # type: ignore[arg-type]
    assert [c["priority"] for c in calls] == [3, 3, 3]


def _report(results: list[LayerResult], parts: dict) -> tuple[dict, str]:
    doc = document(parts["net"], "h100", 3, "auto", results)
    console = Console(record=True, width=260)
    print_report(doc, console)
    return doc, console.export_text()


def test_the_report_says_each_shapes_prior_and_failed_trials():
    results, parts = _mixed_results()
    gemm, mem = results
    gemm.task = gemm.task.model_copy(update={"prior_task": 7, "trials_failed": 2})
    mem.task = mem.task.model_copy(update={"learned_from": [3, 4, 5]})
    doc, text = _report(results, parts)
    rows = {r["family"]: r for r in doc["layers"]}
    assert rows["tensor_gemm"]["prior_task"] == 7 and rows["tensor_gemm"]["trials_failed"] == 2
    assert rows["memops"]["learned_from"] == [3, 4, 5]
    gemm_line = next(line for line in text.splitlines() if "gemm 128x2304x768" in line)
    assert "task 7" in gemm_line and "2/3" in gemm_line
    mem_line = next(line for line in text.splitlines() if "layernorm 128x768" in line)
    assert "learned (3 tasks)" in mem_line and "0/3" in mem_line


def test_a_shape_with_no_successful_trial_or_not_done_is_a_problem_the_exit_says():
    from pipetune.clients.tune_model import unfinished_problem

    results, parts = _mixed_results()
    doc, _ = _report(results, parts)
    assert unfinished_problem(doc) is None
    gemm, mem = results
    # Every trial failed: no best (it exited 0 and said nothing).
    gemm.task = gemm.task.model_copy(update={"best": None, "trials_failed": 3})
    # Cancelled after its best: that best still counts (it said "left out").
    mem.task = mem.task.model_copy(update={"state": "cancelled"})
    doc, _ = _report(results, parts)
    problem = unfinished_problem(doc)
    assert problem is not None
    assert "tasks 2 (cancelled) did not finish: the figures count [2] at their best so far" in (
        problem
    )
    assert "tasks [1] have no successful trial: every figure leaves them out" in problem
    assert doc["end_to_end"]["complete"] is False


def test_the_end_to_end_line_says_why_a_tuned_layer_is_left_out():
    """A softmax over 8 keys (tune-model --seq 8) has no one-row-per-block schedule: tuned,
    it was left out of the gain "without a result", and its 80 layers' time counted."""
    results, parts = _mixed_results()
    mem = results[1]
    # Tuned (1.0 µs), but neither a baseline trial nor a baseline in the model's space.
    mem.trials = mem.trials[:1]
    mem.model_baseline_us = None
    doc, text = _report(results, parts)
    memops = next(f for f in doc["families"] if f["family"] == "memops")
    assert memops["layers_without_baseline"] == 1 and memops["untuned_layers"] == 0
    assert doc["end_to_end"]["layers_without_baseline"] == 1
    assert "without a result" not in text
    lines = [line for line in text.splitlines() if line.startswith("end-to-end (all listed")]
    assert lines and lines[0].endswith(
        "(layers left out: 1 whose space has no baseline schedule)"
    ), text
    # A layer with no tuned latency is said as such.
    results, parts = _mixed_results()
    results[0].task = results[0].task.model_copy(update={"best": None, "trials_failed": 3})
    doc, text = _report(results, parts)
    assert doc["end_to_end"]["untuned_layers"] == 1
    lines = [line for line in text.splitlines() if line.startswith("end-to-end (all listed")]
    assert lines and lines[0].endswith("(layers left out: 1 without a tuned latency)"), text


def _listed_task(task_id: int, workload: dict, **changes: object) -> TaskDoc:
    now = datetime.now(UTC)
    fields = {
        "id": task_id,
        "state": "running",
        "workload": workload,
        "gpu": "h100",
        "strategy": "auto",
        "budget": 16,
        "seed": 0,
        "batch_size": 8,
        "trials_done": 0,
        "trials_failed": 0,
        "created_at": now,
        "updated_at": now,
    }
    return TaskDoc.model_validate(fields | changes)


class _TaskPages:
    """GET /v1/tasks as the SDK pages it: newest first, `before` the last id of a page."""

    def __init__(self, tasks: list[TaskDoc], page: int = 2) -> None:
        self.tasks = sorted(tasks, key=lambda t: -t.id)
        self.page = page
        self.reads = 0

    def tasks_page(self, before: int | None) -> list[TaskDoc]:
        self.reads += 1
        rest = [t for t in self.tasks if before is None or t.id < before]
        return rest[: self.page]


def test_resume_follows_the_newest_matching_task_of_each_shape_across_pages():
    from pipetune.clients.tune_model import resumable_tasks

    shapes = network("bert-base", 1, 128).distinct()[:3]
    w0, w1, w2 = (s.workload.canonical() for s in shapes)
    pages = _TaskPages(
        [
            _listed_task(1, w0, state="done"),  # older than 4: not the one followed
            _listed_task(2, w1, state="queued"),
            _listed_task(3, w2, state="cancelled"),  # tuned anew
            _listed_task(4, w0, state="done"),
            _listed_task(5, w2, seed=1),  # another seed
            _listed_task(6, w2, budget=32),  # another budget
            _listed_task(7, w2, gpu="a100"),
            _listed_task(8, w2, strategy="random"),
            _listed_task(9, w2, batch_size=4),
            _listed_task(10, w2, imported_from="dataset.json", state="done"),
            _listed_task(11, w2, state="failed"),
        ]
    )

    class Client:
        def tasks(self, state=None, *, limit=None, offset=None, before=None):
            return pages.tasks_page(before)

    # Without --batch-size any batch size is followed (the service's default may differ).
    found = resumable_tasks(Client(), shapes, "h100", 16, "auto", 0)  # type: ignore[arg-type]
    assert {i: t.id for i, t in found.items()} == {0: 4, 1: 2, 2: 9}
    # With one asked for, only tasks of that batch size are.
    found = resumable_tasks(Client(), shapes, "h100", 16, "auto", 0, batch_size=8)  # type: ignore[arg-type]
    assert {i: t.id for i, t in found.items()} == {0: 4, 1: 2}
    # The list is read only until every shape has its task.
    pages.reads = 0
    matched = [_listed_task(20 + i, w, state="done") for i, w in enumerate((w0, w1, w2))]
    pages.tasks = sorted(matched + pages.tasks, key=lambda t: -t.id)
    found = resumable_tasks(Client(), shapes, "h100", 16, "auto", 0)  # type: ignore[arg-type]
    assert {i: t.id for i, t in found.items()} == {0: 20, 1: 21, 2: 22} and pages.reads == 2


def test_launch_queues_only_the_shapes_not_resumed():
    from pipetune.clients.tune_model import launch

    shapes = network("bert-base", 1, 128).distinct()[:3]
    queued: list[dict] = []

    class Fake:
        def tune(self, workload, gpu, **kwargs):
            queued.append(workload)
            return _listed_task(50 + len(queued), workload)

    kept = _listed_task(7, shapes[1].workload.canonical())
    started = launch(Fake(), shapes, "h100", 16, "auto", 0, resumed={1: kept})  # type: ignore[arg-type]
    assert [t.id for t in started] == [51, 7, 52]
    assert queued == [shapes[0].workload.canonical(), shapes[2].workload.canonical()]


class _RunnerClient:
    """collect()'s view of a service: a worker list and each task's trials."""

    def __init__(self, workers: list, trials: dict[int, list[TrialDoc]]):
        self._workers, self._trials = workers, trials

    def workers(self) -> list:
        return self._workers

    def all_trials(self, task_id: int) -> list[TrialDoc]:
        return self._trials[task_id]


def test_latencies_are_labelled_by_each_trials_own_runner_not_the_worker_list():
    from pipetune.clients.tune_model import collect
    from pipetune.model.wire import WorkerDoc

    now = datetime.now(UTC)
    shape = network("bert-base", seq=128).distinct()[0]
    task = _task(4.0, PIPELINED)

    def trial(worker: str, runner: str | None) -> TrialDoc:
        doc = _trial(0, PIPELINED, 4.0)
        return doc.model_copy(update={"worker": worker, "runner": runner})

    def worker(name: str, runner: str) -> WorkerDoc:
        return WorkerDoc(id=1, name=name, gpu="h100", arch="sm_90", runner=runner,
                         last_heartbeat=now)  # fmt: skip

    # A replay worker answering from a simulated sweep: its results say replay:simulated.
    replayed = _RunnerClient([worker("r", "replay")], {1: [trial("r", "replay:simulated")]})
    results = collect(replayed, [shape], [task], "h100")  # type: ignore[arg-type]
    assert results[0].runners == {"simulated"} and latency_kind(results).startswith("simulated")
    # A worker name that re-registered as a cupy worker after it ran simulated trials.
    renamed = _RunnerClient([worker("w", "cupy")], {1: [trial("w", "simulated")]})
    results = collect(renamed, [shape], [task], "h100")  # type: ignore[arg-type]
    assert latency_kind(results).startswith("simulated")
    # A trial that records no runner is told by its worker's registration, as before.
    unrecorded = _RunnerClient([worker("w", "cupy")], {1: [trial("w", None)]})
    results = collect(unrecorded, [shape], [task], "h100")  # type: ignore[arg-type]
    assert results[0].runners == {"cupy"}


def test_collect_rides_out_a_moments_failure_and_a_worker_list_out_of_reach(monkeypatch):
    """All tasks done, one reset on the worker list or a 502 on a task's trials ended the
    whole report ("cannot reach the pipetune service"), though worker_runners promised None
    for a list it could not read."""
    from pipetune.clients.sdk import ServerError, ServiceUnavailableError
    from pipetune.clients.tune_model import collect

    shape = network("bert-base", seq=128).distinct()[0]
    task = _task(4.0, PIPELINED)

    class Flaky(_RunnerClient):
        def __init__(self) -> None:
            super().__init__([], {1: [_trial(0, PIPELINED, 4.0)]})
            self.failed = 0

        def workers(self) -> list:
            raise ServiceUnavailableError("http://fake", "Server disconnected")

        def all_trials(self, task_id: int) -> list[TrialDoc]:
            if not self.failed:
                self.failed += 1
                raise ServerError(502, "not a pipetune answer: 502 Bad Gateway")
            return super().all_trials(task_id)

    import pipetune.clients.sdk.client as sdk_client

    flaky = Flaky()
    monkeypatch.setattr(sdk_client, "WAIT_THROUGH_S", 0.5)  # (the list given up on soon)
    results = collect(flaky, [shape], [task], "h100", poll_s=0.01)  # type: ignore[arg-type]
    assert flaky.failed == 1 and len(results[0].trials) == 1
    assert results[0].runners == {"unknown"}  # (no runner recorded, no worker list)


def test_a_bfloat16_network_is_every_operator_in_bfloat16():
    fp16, bf16 = network("llama2-7b", 1, 256), network("llama2-7b", 1, 256, dtype="bfloat16")
    assert bf16.dtype == "bfloat16" and fp16.dtype == "float16"
    assert [layer.name for layer in bf16.layers] == [layer.name for layer in fp16.layers]
    for before, after in zip(fp16.layers, bf16.layers, strict=True):
        assert after.workload.dtype == "bfloat16" and before.workload.dtype == "float16"
        assert after.workload.canonical() == {**before.workload.canonical(), "dtype": "bfloat16"}
        assert family_of(after.workload) is family_of(before.workload)
        assert after.workload.label() == before.workload.label() + " bf16"
    assert len(bf16.distinct()) == len(fp16.distinct())
    # With --wgmma a bf16 network's GEMMs and BMMs move to the wgmma family in bfloat16.
    hopper = bf16.on_hopper()
    moved = [layer.workload for layer in hopper.layers if layer.workload.op.startswith("hopper")]
    assert moved and all(w.dtype == "bfloat16" for w in moved)
    assert all(layer.workload.dtype == "bfloat16" for layer in hopper.layers)
    with pytest.raises(WorkloadError, match=r"^dtype: must be one of float16, bfloat16"):
        network("gpt2", dtype="float32")


def test_the_report_of_a_bfloat16_network_says_so():
    results, _ = _mixed_results()
    doc = document(network("gpt2", batch=1, seq=128, dtype="bfloat16"), "h100", 3, "auto", results)
    assert doc["dtype"] == "bfloat16"
    console = Console(record=True, width=240)
    print_report(doc, console)
    assert "gpt2 (batch 1, seq 128, bf16) on h100" in console.export_text()


def test_tune_model_refuses_an_element_type_by_its_option():
    result = CliRunner().invoke(app, ["tune-model", "gpt2", "--dtype", "float32"])
    assert result.exit_code == 2
    assert "--dtype: must be one of float16, bfloat16, got 'float32'" in result.stderr
