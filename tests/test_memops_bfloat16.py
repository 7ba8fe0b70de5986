"""bfloat16 elements for the memory-intensive family: the workload field, the kernel text
(only the storage type's name and the conversions differ from float16's), the launch plan's
buffers, the runners' bf16 arrays (uint16 bits: numpy and CuPy have no bfloat16) and the
reference check with bf16's unit roundoff. The CPU emulator runs the bf16 kernels themselves
(tests/test_memops_emulated.py); NVRTC compiles them (tests/test_memops_compile.py)."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from cubin_support import cubin_sm
from test_memops_reference import _exact

import pipetune
from pipetune.model.memops.space import MemSchedule
from pipetune.model.memops.workloads import (
    MemWorkload,
    bias_gelu,
    layernorm,
    parse_mem_workload,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.workloads import WorkloadError
from pipetune.workers.codegen.memops import build_key, generate, launch_plan
from pipetune.workers.runners import elements
from pipetune.workers.runners.memops_reference import (
    check,
    make_inputs,
    reference,
    tolerance_text,
)

# Schedules (knobs in model/memops/space.py order): a row per block, a row split over 4
# blocks joined by a second kernel, joined in the kernel, a row kept in registers.
ROW = MemSchedule(128, 1, 1, 2, 0, 0, 0)
TWO_PASS = MemSchedule(32, 1, 4, 8, 0, 0, 0)
FUSED = MemSchedule(32, 1, 4, 8, 1, 1, 0)
REGISTERS = MemSchedule(32, 1, 1, 8, 2, 0, 0)


def bf16(workload: MemWorkload) -> MemWorkload:
    """The workload on bfloat16 elements (the constructors take no dtype)."""
    return parse_mem_workload({**workload.model_dump(), "dtype": "bfloat16"})


# ---- the workload ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fp16", "label", "workload_hash"),
    [
        # Labels and hashes as they were before bfloat16 (a measurement's key).
        (reduce(64, 4096, "max"), "reduce-max 64x4096", "27fc87c1378938e3"),
        (softmax(4096, 768), "softmax 4096x768", "52a3708f234c9c12"),
        (layernorm(64, 768), "layernorm 64x768 eps=1e-05", "d34314c485de81a2"),
        (rmsnorm(64, 4096, 1e-6), "rmsnorm 64x4096 eps=1e-06", "4ca549d3518d8776"),
        (bias_gelu(64, 3072, "tanh"), "bias_gelu(tanh) 64x3072", "498fb2b923592903"),
        (silu_mul(64, 1024), "silu_mul 64x1024", "480dd71ab89299fc"),
    ],
    ids=lambda v: v.op if hasattr(v, "op") else None,
)
def test_a_bfloat16_workload_is_another_workload_and_says_so(fp16, label, workload_hash):
    assert (fp16.dtype, fp16.label(), fp16.workload_hash) == ("float16", label, workload_hash)
    explicit = parse_mem_workload({**fp16.model_dump(), "dtype": "float16"})
    assert explicit.workload_hash == workload_hash
    other = bf16(fp16)
    assert other.dtype == "bfloat16" and other.label() == label + " bf16"
    assert other.workload_hash != workload_hash
    assert other.canonical() == {**fp16.canonical(), "dtype": "bfloat16"}
    # The models read bytes, which are the same: both types are 16 bits.
    assert other.compulsory_bytes == fp16.compulsory_bytes


def test_another_element_type_is_refused_by_field():
    with pytest.raises(WorkloadError) as refused:
        parse_mem_workload({"op": "softmax", "rows": 64, "cols": 64, "dtype": "float32"})
    assert refused.value.field == "dtype"
    assert "the memory-intensive kernels take float16 or bfloat16 inputs" in str(refused.value)


# ---- the kernel text -------------------------------------------------------------------

# The float16 kernel's conversions and the bfloat16 kernel's: the only text that differs
# beyond the type's name (a bf16 is a float32's top half: h2f is a shift, exact on sm_80,
# where cvt.f32.bf16 would need sm_90).
H2F_FP16 = r"""  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
  return f;"""
H2F_BF16 = "  return __uint_as_float((unsigned)h << 16);"


@pytest.mark.parametrize(
    ("fp16", "schedule"),
    [
        (reduce(5, 1032), TWO_PASS),  # a second entry
        (reduce(5, 1032, "max"), ROW),
        (softmax(5, 1032), FUSED),
        (layernorm(5, 1032), REGISTERS),
        (rmsnorm(5, 1032), TWO_PASS),
        (bias_gelu(5, 1032, "tanh"), ROW),
        (silu_mul(5, 1032), ROW),
    ],
    ids=lambda v: v.label() if hasattr(v, "label") else v.id,
)
def test_a_bfloat16_kernel_differs_from_float16_only_in_its_type_words(fp16, schedule):
    a, b = generate(fp16, schedule), generate(bf16(fp16), schedule)
    assert (b.name, b.dtype, a.dtype) == (a.name + "_bf16", "bfloat16", "float16")
    assert b.entries == tuple(e.replace(a.name, b.name) for e in a.entries)
    assert (b.threads, b.scratch_bytes, b.reg_vecs, b.blocks_wait) == (
        a.threads,
        a.scratch_bytes,
        a.reg_vecs,
        a.blocks_wait,
    )
    assert "cvt.rn.bf16x2.f32" in b.code and "cvt.rn.bf16.f32" in b.code
    assert H2F_BF16 in b.code and "f16" not in b.code.replace("bf16", "")
    # Undo the type words: the float16 kernel, character for character.
    words = [
        (b.name, a.name),
        ("__nv_bfloat16", "__half"),
        ("__CUDA_BF16_H__", "__CUDA_FP16_H__"),
        (H2F_BF16, H2F_FP16),
        ("cvt.rn.bf16.f32", "cvt.rn.f16.f32"),
        ("bf16x2", "f16x2"),
        (", bfloat16, schedule", ", schedule"),
    ]
    text = b.code
    for new, old in words:
        text = text.replace(new, old)
    assert text == a.code


def test_the_build_key_and_the_launch_plan_carry_the_element_type():
    fp16 = layernorm(512, 1024)
    other = bf16(fp16)
    assert (build_key(fp16, ROW), build_key(other, ROW)) == ("layernorm", "layernorm.bfloat16")
    # The register cache's length stays in the key (the source's only shape dependence).
    assert build_key(other, REGISTERS) == build_key(fp16, REGISTERS) + ".bfloat16"
    kernel = generate(other, TWO_PASS)
    plan = launch_plan(kernel, other, 132, 2)
    assert [(b.name, b.dtype, b.c_type) for b in plan.buffers] == [
        ("x", "bfloat16", "const __nv_bfloat16*"),
        ("gamma", "bfloat16", "const __nv_bfloat16*"),
        ("beta", "bfloat16", "const __nv_bfloat16*"),
        ("y", "bfloat16", "__nv_bfloat16*"),
        ("ws", "float32", "float*"),  # the partials stay float32
    ]
    assert plan.buffer("x").nbytes == 512 * 1024 * 2
    # Every entry's parameters are the buffers' types (p0 and p1: gamma and beta).
    for entry in kernel.entries:
        params = re.search(rf"\b{entry}\(([^)]*)\)", kernel.code).group(1)
        types = [" ".join(p.replace("__restrict__", "").split()[:-1]) for p in params.split(",")]
        assert types[:5] == [
            "const __nv_bfloat16*",
            "const __nv_bfloat16*",
            "const __nv_bfloat16*",
            "__nv_bfloat16*",
            "float*",
        ]
    # A kernel of one element type is never launched on the other's workload.
    with pytest.raises(ValueError, match="takes bfloat16; the workload is float16"):
        launch_plan(kernel, fp16, 132, 2)
    with pytest.raises(ValueError, match="takes float16; the workload is bfloat16"):
        launch_plan(generate(fp16, TWO_PASS), other, 132, 2)


def test_the_kernel_callable_takes_a_bfloat16_workload():
    """pipetune.kernel builds a bf16 memops kernel for sm_90 whose operands are bfloat16
    (torch.bfloat16 tensors: the arrays' checks come from the launch plan's buffers)."""
    k = pipetune.kernel(bf16(rmsnorm(512, 1024)), "h100", schedule=TWO_PASS)
    assert k.name.endswith("_bf16") and cubin_sm(k.cubin()) == 90
    assert [(op.name, op.dtype) for op in k.operands] == [
        ("x", "bfloat16"),
        ("gamma", "bfloat16"),
        ("y", "bfloat16"),
    ]
    assert "cvt.rn.bf16x2.f32" in k.source


# ---- the runners' arrays and the reference -------------------------------------------------


def test_float16_inputs_are_those_drawn_before_bfloat16():
    inputs = make_inputs(layernorm(16, 256), 3)
    digest = hashlib.sha256()
    for name in sorted(inputs):
        assert inputs[name].dtype == np.float16
        digest.update(name.encode())
        digest.update(inputs[name].tobytes())
    assert digest.hexdigest() == "42dfb22b459e40cecd79cb994399455c202e80e96a28ff8b35c22c1c541dc03d"


@pytest.mark.parametrize(
    "fp16", [layernorm(64, 256), bias_gelu(64, 256), silu_mul(8, 512)], ids=lambda w: w.op
)
def test_bfloat16_inputs_are_the_float16_draws_rounded_to_bfloat16(fp16):
    half, bits = make_inputs(fp16, 5), make_inputs(bf16(fp16), 5)
    assert set(half) == set(bits)
    for name in half:
        assert bits[name].dtype == np.uint16 and bits[name].shape == half[name].shape
        values, h = elements.widen(np, bits[name]), half[name].astype(np.float32)
        assert len(np.unique(values)) > 100
        # The same uniform draws, each rounded once: within bf16's and fp16's roundings of
        # each other (fp16's subnormal step for the norms' rows of variance eps).
        assert (np.abs(values - h) <= (2.0**-8 + 2.0**-11) * np.abs(h) + 2.0**-24).all()
        # Values fp16 cannot hold: these are bf16's own roundings, not fp16's bits.
        assert (values != h).mean() > 0.5


WORKLOADS = [
    reduce(64, 1024),
    reduce(64, 4096, "max"),
    softmax(256, 1024),
    softmax(16, 65536),
    layernorm(128, 768, 1e-12),
    layernorm(8, 65536),
    rmsnorm(128, 4096, 1e-6),
    silu_mul(64, 11008),
    bias_gelu(64, 3072),
    bias_gelu(64, 3072, "tanh"),
]


@pytest.mark.parametrize("fp16", WORKLOADS, ids=lambda w: w.label())
def test_the_check_passes_bfloat16_outputs_and_fails_wrong_ones(fp16):
    workload = bf16(fp16)
    inputs = make_inputs(workload, 3)
    ref, tol = reference(np, workload, inputs)
    # The exact result rounded once to bf16: right.
    exact = _exact(workload, inputs)
    assert exact.dtype == np.uint16
    assert check(np, exact, ref, tol)[0]
    # Rounded to fp16 first (a double rounding): right too where fp16 holds the value to its
    # 11 bits (the tolerance leaves twice bf16's unit); but softmax's smallest outputs are
    # fp16 subnormals, which bf16 would hold to 8 bits: a kernel that went through fp16 fails.
    twice = elements.narrow(np, _exact(fp16, inputs).astype(np.float32), "bfloat16")
    assert check(np, twice, ref, tol)[0] == (workload.op != "softmax")
    if workload.op != "reduce" or workload.reduction != "max":  # a max is exact in both
        # The unit roundoff is bf16's: the fp16 tolerance (the same inputs' reference, the
        # float16 workload's) refuses the right answer.
        _, fp16_tol = reference(np, fp16, inputs)
        assert (np.abs(elements.widen(np, exact) - ref) > fp16_tol).any()
    # The largest output off by four of its units, and the bits read as fp16: both fail.
    bad = exact.copy()
    bad.ravel()[int(np.abs(ref).argmax())] += 4
    passed, _, why = check(np, bad, ref, tol)
    assert not passed and "1 of" in why and "outside the bf16 tolerance" in why
    assert not check(np, exact.view(np.float16), ref, tol)[0]
    if workload.op == "reduce" and workload.reduction == "max":
        return  # bf16's rows hold their maximum many times over: no one vector holds it
    # A kernel that dropped one vector of 8 from row 1 (a missed tail, a lost segment).
    broken_inputs = {**inputs, "x": inputs["x"].copy()}
    broken_inputs["x"][1, 8:16] = 0
    assert not check(np, _exact(workload, broken_inputs), ref, tol)[0]


@pytest.mark.parametrize("norm", [layernorm, rmsnorm])
def test_a_bfloat16_norm_that_leaves_out_eps_fails(norm):
    workload = bf16(norm(16, 4096, 1e-5))
    inputs = make_inputs(workload, 0)
    ref, tol = reference(np, workload, inputs)
    assert check(np, _exact(workload, inputs), ref, tol)[0]
    no_eps = _exact(bf16(norm(16, 4096, 2e-38)), inputs)
    assert not check(np, no_eps, ref, tol)[0]


def test_the_tolerance_text_names_bf16s_unit():
    for fp16 in WORKLOADS:
        half, other = tolerance_text(fp16), tolerance_text(bf16(fp16))
        if fp16.op == "reduce" and fp16.reduction == "max":
            assert half == other == "exact"
            continue
        assert "2*2^-11" in half and "2^-8" not in half
        assert "2*2^-8" in other and "2^-11" not in other
        assert other.replace("2*2^-8", "2*2^-11").replace("2^-133", "2^-24") == half
    # float16's texts as they were (the reference cache's key holds them).
    assert tolerance_text(softmax(4, 64)) == (
        "|y-ref| <= (2*2^-11 + (8*sqrt(C)+16)*2^-24)*|ref| + 2^-24"
    )
    assert tolerance_text(bf16(softmax(4, 64))) == (
        "|y-ref| <= (2*2^-8 + (8*sqrt(C)+16)*2^-24)*|ref| + 2^-133"
    )
    assert tolerance_text(bf16(silu_mul(4, 64))) == (
        "|y-ref| <= 2*2^-8*|ref| + 16*2^-24*(|gate|+1)*|up| + 2^-14"
    )
