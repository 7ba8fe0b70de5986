"""The GEMM with bias + GELU in its epilogue (op gemm_bias_gelu): its workload, the model's
view of it, its reference and tolerance.

The kernel itself is checked on the CPU by the emulator (tests/test_codegen_emulated.py),
compiled by NVRTC for sm_80 and sm_90 (tests/test_compile_kernels.py), called
(tests/test_kernel_callable.py) and exported (tests/test_export.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipetune.model.analytical import evaluate
from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.workloads import bias_gelu
from pipetune.model.networks import network
from pipetune.model.space import Space
from pipetune.model.workloads import WorkloadError, gemm, gemm_bias_gelu
from pipetune.workers.runners import reference as ref_module
from pipetune.workers.runners.elements import narrow


def test_the_workload_is_a_gemm_of_its_own_with_the_gelu_form_in_its_label():
    w = gemm_bias_gelu(1024, 3072, 768)
    assert w.label() == "gemm_bias_gelu(none) 1024x3072x768"
    assert gemm_bias_gelu(64, 16, 32, b_layout="nk", approximate="tanh").label() == (
        "gemm_bias_gelu(tanh) 64x16x32 nk"
    )
    assert gemm_bias_gelu(64, 16, 32, dtype="bfloat16").label().endswith(" bf16")
    view = w.gemm_view()
    assert (view.batch, view.m, view.n, view.k) == (1, 1024, 3072, 768)
    assert w.flops == gemm(1024, 3072, 768).flops
    assert w.compulsory_bytes == gemm(1024, 3072, 768).compulsory_bytes + 2 * 3072
    hashes = {
        x.workload_hash
        for x in (w, gemm(1024, 3072, 768), gemm_bias_gelu(1024, 3072, 768, approximate="tanh"))
    }
    assert len(hashes) == 3
    assert family_of(w).name == "tensor_gemm"
    assert parse_any_workload(w.canonical()) == w


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"m": 64, "n": 20, "k": 64}, r"^n: must be a multiple of 8"),
        ({"m": 64, "n": 16, "k": 60}, r"^k: must be a multiple of 8"),
        ({"m": 0, "n": 16, "k": 64}, r"^m: "),
        ({"m": 64, "n": 16, "k": 64, "approximate": "sigmoid"}, r"^approximate: "),
        ({"m": 64, "n": 16, "k": 64, "b_layout": "mk"}, r"^b_layout: "),
    ],
)
def test_bad_fields_are_named(fields, message):
    with pytest.raises(WorkloadError, match=message):
        parse_any_workload({"op": "gemm_bias_gelu", **fields})


def test_the_gelu_form_is_one_definition_for_the_fused_and_the_stitched_operator():
    schema = gemm_bias_gelu(8, 8, 8).model_json_schema()["properties"]["approximate"]
    assert schema == bias_gelu(8, 8).model_json_schema()["properties"]["approximate"]


def test_the_model_predicts_the_plain_gemm_s_loop():
    """The epilogue reads N bias values per block and computes GELU on registers: the model
    prices the kernel as the GEMM's (what it leaves out is said in README)."""
    gpu = get_gpu("h100")
    fused = evaluate(Space.enumerate(gemm_bias_gelu(4096, 3072, 1024), gpu))
    plain = evaluate(Space.enumerate(gemm(4096, 3072, 1024), gpu))
    assert [s.id for s in fused.space] == [s.id for s in plain.space]
    np.testing.assert_allclose(fused.T_kernel, plain.T_kernel)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_reference_adds_the_bias_per_column_then_applies_the_form(approximate):
    w = gemm_bias_gelu(40, 24, 72, approximate=approximate)
    inputs = ref_module.input_buffers(w, 5)
    assert set(inputs) == {"A", "B", "bias"} and inputs["bias"].shape == (24,)
    ref, tol = ref_module.reference(np, w, inputs["A"], inputs["B"], inputs["bias"])
    z = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
    z += inputs["bias"].astype(np.float64)
    if approximate == "tanh":
        expected = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    else:
        from scipy.special import erf

        expected = 0.5 * z * (1 + erf(z / np.sqrt(2)))
    np.testing.assert_allclose(ref, expected, rtol=1e-5, atol=1e-6)
    assert (np.abs(ref - expected) <= tol).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_check_passes_a_rounded_answer_and_fails_a_missing_bias_or_the_other_form(dtype):
    w = gemm_bias_gelu(64, 32, 96, dtype=dtype)
    inputs = ref_module.input_buffers(w, 1)
    ref, tol, method, why = ref_module.compute_reference(np, w, inputs)
    assert method == "cublas" and why is None
    assert ref_module.check(np, narrow(np, ref, dtype), ref, tol)[0]
    no_bias, _ = ref_module.reference(np, w, inputs["A"], inputs["B"], 0 * inputs["bias"])
    assert not ref_module.check(np, narrow(np, no_bias, dtype), ref, tol)[0]
    other = gemm_bias_gelu(64, 32, 96, dtype=dtype, approximate="tanh")
    tanh_form, _ = ref_module.reference(np, other, inputs["A"], inputs["B"], inputs["bias"])
    passed, _, why = ref_module.check(np, narrow(np, tanh_form, dtype), ref, tol)
    assert not passed and "tolerance" in why


def test_the_reference_refuses_to_judge_without_the_bias():
    w = gemm_bias_gelu(16, 16, 16)
    a, b = ref_module.make_inputs(w, 0)
    with pytest.raises(ValueError, match="needs its bias"):
        ref_module.reference(np, w, a, b)


def test_a_deep_reduction_s_bias_is_integer_as_its_operands_are():
    w = gemm_bias_gelu(8, 16, 1 << 16)
    bias = ref_module.make_bias(w, 3)
    assert set(np.unique(bias.astype(np.float32))) <= {-1.0, 0.0, 1.0}
    assert "1.13*8*sqrt(K)" in ref_module.tolerance_text(w)


@pytest.mark.parametrize(("name", "form"), [("bert-base", "none"), ("gpt2", "tanh")])
def test_a_fused_network_s_fc1_is_one_gemm_bias_gelu_per_block(name, form):
    plain = network(name, batch=2, seq=128)
    fused = network(name, batch=2, seq=128, fuse_bias_gelu=True)
    assert len(fused.layers) == len(plain.layers) - 12  # one kernel fewer per block
    fc1 = [layer.workload for layer in fused.layers if layer.name == "fc1_bias_gelu"]
    assert len(fc1) == 12 and fc1[0] == gemm_bias_gelu(256, 3072, 768, approximate=form)
    assert not any(layer.workload.op == "bias_gelu" for layer in fused.layers)
    plain_ops = [layer.name for layer in plain.layers]
    assert "fc1" in plain_ops and "fc1" not in [layer.name for layer in fused.layers]
    assert "gemm_bias_gelu" in fused.notes[0]
    on_hopper = fused.on_hopper()
    assert "hopper_gemm_bias_gelu" in on_hopper.notes[-1]
    hopper_fc1 = [layer.workload for layer in on_hopper.layers if layer.name == "fc1_bias_gelu"]
    assert hopper_fc1[0].op == "hopper_gemm_bias_gelu" and hopper_fc1[0].approximate == form
    assert fused.in_dtype("bfloat16").layers[0].workload.dtype == "bfloat16"


def test_only_bert_and_gpt2_have_a_bias_gelu_to_fuse():
    with pytest.raises(WorkloadError, match=r"^fuse_bias_gelu: llama2-7b has no bias"):
        network("llama2-7b", fuse_bias_gelu=True)


def test_the_kernel_takes_the_bias_after_c_and_the_gelu_form_last():
    import re

    from pipetune.model.space import Schedule
    from pipetune.workers.codegen import generate, launch_config

    workload = gemm_bias_gelu(64, 64, 64, approximate="tanh")
    kernel = generate(workload, Schedule(2, 2, 1, 1, 2, 3, 2))
    launch = launch_config(kernel, workload)
    assert launch.arguments == ("A", "B", "C", "bias", "M", "N", "K", "gelu_tanh")
    assert launch.scalars == {"M": 64, "N": 64, "K": 64, "gelu_tanh": 1}
    signature = re.search(rf"{kernel.name}\(([^)]*)\)", kernel.code).group(1)
    declared = [p.split()[-1] for p in signature.split(",")]
    assert declared == [
        "A_ptr",
        "B_ptr",
        "C_ptr",
        "bias_ptr",
        "M_arg",
        "N_arg",
        "K_arg",
        "gelu_tanh",
    ]
    # One source for both forms: the form is an argument.
    erf = gemm_bias_gelu(64, 64, 64)
    assert generate(erf, kernel.schedule).code == kernel.code
    assert launch_config(kernel, erf).scalars["gelu_tanh"] == 0
