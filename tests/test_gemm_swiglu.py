"""The fused GEMM + SwiGLU (op gemm_swiglu): its workload, the model's view of it, its
reference and tolerance, the weight interleaving users call, and LLaMA's fused MLP.

The kernel itself is checked on the CPU by the emulator (tests/test_codegen_emulated.py)
and compiled by NVRTC for sm_80 and sm_90 (tests/test_compile_kernels.py)."""

from __future__ import annotations

import numpy as np
import pytest

import pipetune
from pipetune.model.analytical import evaluate
from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.networks import network
from pipetune.model.space import Space
from pipetune.model.workloads import WorkloadError, gemm, gemm_swiglu
from pipetune.workers.codegen import generate, launch
from pipetune.workers.codegen.generator import launch_plan
from pipetune.workers.runners import reference as ref_module


def test_the_workload_is_a_gemm_of_both_projections_writing_one_output():
    w = gemm_swiglu(512, 11008, 4096)
    assert w.label() == "gemm_swiglu 512x11008x4096"
    view = w.gemm_view()
    assert (view.batch, view.m, view.n, view.k) == (1, 512, 22016, 4096)
    assert w.flops == gemm(512, 22016, 4096).flops
    a, b, c = w.operand_bytes
    assert (a, b, c) == (2 * 512 * 4096, 2 * 4096 * 22016, 2 * 512 * 11008)
    assert w.workload_hash != gemm(512, 22016, 4096).workload_hash
    assert family_of(w).name == "tensor_gemm"
    assert parse_any_workload(w.canonical()) == w
    assert gemm_swiglu(64, 16, 32, b_layout="nk").label() == "gemm_swiglu 64x16x32 nk"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"m": 64, "n": 20, "k": 64}, r"^n: must be a multiple of 8"),
        ({"m": 64, "n": 16, "k": 60}, r"^k: must be a multiple of 8"),
        ({"m": 0, "n": 16, "k": 64}, r"^m: "),
        ({"m": 64, "n": 2**20, "k": 2048}, r"^n: B has 4294967296 elements"),  # K x 2n
        ({"m": 64, "n": 16, "k": 64, "b_layout": "mk"}, r"^b_layout: "),
    ],
)
def test_bad_shapes_name_the_field(fields, message):
    with pytest.raises(WorkloadError, match=message):
        parse_any_workload({"op": "gemm_swiglu", **fields})


def test_the_model_charges_the_epilogue_half_the_output_bytes():
    """Everything but the stores is the GEMM of both projections; a block writes one output
    per gate-and-up pair of its columns."""
    gpu = get_gpu("h100")
    fused = evaluate(Space.enumerate(gemm_swiglu(4096, 2048, 1024), gpu))
    plain = evaluate(Space.enumerate(gemm(4096, 4096, 1024), gpu))
    assert [s.id for s in fused.space] == [s.id for s in plain.space]
    np.testing.assert_allclose(fused.T_main_loop, plain.T_main_loop)
    assert (fused.T_epilogue < plain.T_epilogue).all()
    assert (fused.T_kernel <= plain.T_kernel).all() and (fused.T_kernel < plain.T_kernel).any()


def test_the_launch_covers_the_interleaved_gemm_and_c_is_half_as_wide():
    w = gemm_swiglu(100, 48, 64, b_layout="nk")
    space = Space.enumerate(w, get_gpu("h100"))
    kernel = generate(w, space[0])
    assert kernel.variant == "gemm_swiglu_nk" and "silu" not in kernel.name
    grid, scalars = launch(kernel, w)
    assert scalars == (100, 96, 64)  # the GEMM's N: both projections
    s = space[0]
    assert grid == (-(-100 // s.block_m) * -(-96 // s.block_n), 1, 1)
    plan = launch_plan(kernel, w)
    assert [(b.name, b.shape) for b in plan.buffers] == [
        ("A", (100, 64)),
        ("B", (96, 64)),
        ("C", (100, 48)),
    ]


def _silu(x):
    return x / (1 + np.exp(-x))


def test_the_reference_gates_the_interleaved_columns():
    w = gemm_swiglu(30, 24, 40)
    a, b = ref_module.make_inputs(w, 3)
    ref, tol = ref_module.reference(np, w, a, b)
    assert ref.shape == tol.shape == (30, 24)
    product = a.astype(np.float64) @ b.astype(np.float64)
    groups = product.reshape(30, 3, 2, 8)  # (rows, groups of 16 columns, gate|up, 8)
    gate, up = groups[:, :, 0].reshape(30, 24), groups[:, :, 1].reshape(30, 24)
    np.testing.assert_allclose(ref, _silu(gate) * up, rtol=1e-5, atol=1e-6)
    # The output rounded to fp16 passes; gate and up swapped, or one group shifted, do not.
    assert ref_module.check(np, ref.astype(np.float16), ref, tol)[0]
    swapped = (_silu(up) * gate).astype(np.float16)
    assert not ref_module.check(np, swapped, ref, tol)[0]
    shifted = ref.copy()
    shifted[:, :8] = ref[:, 8:16]
    assert not ref_module.check(np, shifted.astype(np.float16), ref, tol)[0]


def test_the_tolerance_carries_each_projection_s_accumulation_error():
    """An output is within rounding plus silu's slope times the gate's accumulation error
    and silu(gate) times the up's; a deep reduction's exact sums leave rounding only."""
    w = gemm_swiglu(16, 8, 4096)
    a, b = ref_module.make_inputs(w, 0)
    ref, tol = ref_module.reference(np, w, a, b)
    rounding = 2 * ref_module.U16 * np.abs(ref) + ref_module.FLOOR
    assert (tol > rounding).all()
    deep = gemm_swiglu(8, 8, 1 << 16)
    a, b = ref_module.make_inputs(deep, 0)
    ref, tol = ref_module.reference(np, deep, a, b)
    np.testing.assert_allclose(tol, 2 * ref_module.U16 * np.abs(ref) + ref_module.FLOOR)
    assert "silu(gate)" in ref_module.tolerance_text(w)


def test_a_deep_swiglu_s_correct_output_stays_in_fp16_and_a_dropped_tile_fails():
    """Its integer inputs made gate and up spread as sqrt(4K/9): at K = 2^16 silu(gate)·up
    passed fp16's 65,504 on a share of the outputs (98 of 4,096 here), so a correct kernel's
    output held inf and failed the check. Scaled by a power of two, the sums stay exact."""
    deep = gemm_swiglu(64, 64, 1 << 16)
    a, b = ref_module.make_inputs(deep, 0)
    scale = ref_module.integer_input_scale(deep)
    assert scale == 2.0**-2
    assert set(np.unique(a.astype(np.float32))) == {-scale, 0.0, scale}
    ref, tol = ref_module.reference(np, deep, a, b)
    stored = ref.astype(np.float16)
    assert np.isfinite(stored).all()
    assert ref_module.check(np, stored, ref, tol)[0]
    # A kernel that drops its last 64-deep K tile: every output's sums lose their share.
    k = deep.k - 64
    product = a[:, :k].astype(np.float32) @ b[:k].astype(np.float32)
    gate, up = ref_module.split_gate_up(np, product)
    dropped = (ref_module.silu(np, gate) * up).astype(np.float16)
    assert not ref_module.check(np, dropped, ref, tol)[0]
    # The deepest reduction on integer inputs, and a plain GEMM's (one sum, in range): as
    # before. The text names the scaling (and so keys the cached reference apart).
    assert ref_module.integer_input_scale(gemm_swiglu(8, 8, 1 << 24)) == 2.0**-4
    assert ref_module.integer_input_scale(gemm_swiglu(8, 8, 4096)) == 1.0
    assert ref_module.integer_input_scale(gemm(8, 8, 1 << 16)) == 1.0
    assert "2^-s" in ref_module.tolerance_text(deep)
    assert "2^-s" not in ref_module.tolerance_text(gemm_swiglu(8, 8, 4096))


def test_silu_does_not_overflow_on_large_negative_gates():
    x = np.array([-1e4, -100.0, 0.0, 3.0, 1e4], dtype=np.float32)
    with np.errstate(over="raise"):
        y = ref_module.silu(np, x)
    expected = [0.0, -100 * np.exp(-100.0), 0.0, 3 / (1 + np.exp(-3)), 1e4]
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-40)  # float32's subnormals


def test_interleave_gate_up_builds_what_the_kernel_reads():
    rng = np.random.default_rng(0)
    gate, up = rng.random((40, 24)), rng.random((40, 24))  # K x N, as x @ gate
    b = pipetune.interleave_gate_up(gate, up)
    assert b.shape == (40, 48)
    np.testing.assert_array_equal(b[:, :8], gate[:, :8])
    np.testing.assert_array_equal(b[:, 8:16], up[:, :8])
    np.testing.assert_array_equal(b[:, 16:24], gate[:, 8:16])
    g, u = ref_module.split_gate_up(np, b)
    np.testing.assert_array_equal(g, gate)
    np.testing.assert_array_equal(u, up)
    # nn.Linear's N x K weights: the rows interleave, the transpose of the above.
    nk = pipetune.interleave_gate_up(gate.T.copy(), up.T.copy(), b_layout="nk")
    np.testing.assert_array_equal(nk, b.T)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros((8, 16)), np.zeros((8, 24))), r"up: must have gate's shape \(8, 16\)"),
        ((np.zeros((8, 12)), np.zeros((8, 12))), r"gate: its 12 output features"),
        ((np.zeros(16), np.zeros(16)), r"gate: must be a 2-D array"),
        # An empty B came back, which no gemm_swiglu workload takes.
        ((np.zeros((4, 0)), np.zeros((4, 0))), r"gate: must not be empty, got shape \(4, 0\)"),
        ((np.zeros((0, 32)), np.zeros((0, 32))), r"gate: must not be empty, got shape \(0, 32\)"),
        # Promoted together to float32 by the concatenation, which the kernel refused later.
        (
            (np.zeros((8, 16), np.float16), np.zeros((8, 16), np.float32)),
            r"up: must have gate's dtype float16, got float32",
        ),
        # Two-dimensional whatever it is reshaped to: NumPy's AxisError, no PipetuneError.
        # (A view: building one says that the class is deprecated.)
        ((np.zeros((8, 16)).view(np.matrix), np.zeros((8, 16))), r"gate: must be an array, not"),
        ((np.zeros((8, 16)), np.zeros((8, 16)).view(np.matrix)), r"up: must be an array, not a"),
    ],
)
def test_interleave_gate_up_refuses_what_it_cannot_interleave(args, message):
    with pytest.raises(pipetune.InvalidArgumentError, match=message):
        pipetune.interleave_gate_up(*args)
    with pytest.raises(pipetune.InvalidArgumentError, match=r"b_layout: must be 'kn' or 'nk'"):
        pipetune.interleave_gate_up(np.zeros((8, 16)), np.zeros((8, 16)), b_layout="mk")


def test_llama_s_fused_mlp_is_one_gemm_swiglu_per_block():
    net = network("llama2-7b", batch=1, seq=512, fuse_swiglu=True)
    assert net.fuse_swiglu and len(net.layers) == 32 * 9
    names = [layer.name for layer in net.layers[:9]]
    assert names[-2:] == ["gate_up_swiglu", "down"] and "swiglu" not in names
    labels = {s.workload.label(): s.count for s in net.distinct()}
    assert labels["gemm_swiglu 512x11008x4096"] == 32
    assert "gemm 512x22016x4096" not in labels and "silu_mul 512x11008" not in labels
    assert "SwiGLU in its epilogue" in net.notes[0]
    # The same work in FLOPs as the unfused pair's GEMM.
    unfused = network("llama2-7b", batch=1, seq=512)
    assert sum(s.workload.flops * s.count for s in net.distinct("tensor_gemm")) == sum(
        s.workload.flops * s.count for s in unfused.distinct("tensor_gemm")
    )
    decode = network("llama2-70b", batch=8, seq=1024, decode=True, fuse_swiglu=True)
    assert any(s.workload.label() == "gemm_swiglu 8x28672x8192" for s in decode.distinct())
    hopper = net.on_hopper()
    assert hopper.fuse_swiglu and "hopper_gemm_swiglu" in hopper.notes[-1]
    fused = [layer.workload for layer in hopper.layers if "swiglu" in layer.workload.op]
    assert fused and {w.op for w in fused} == {"hopper_gemm_swiglu"}
    with pytest.raises(WorkloadError, match=r"^fuse_swiglu: gpt2 has no SwiGLU to fuse"):
        network("gpt2", fuse_swiglu=True)
