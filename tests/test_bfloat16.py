"""bfloat16 operands for the tensor-core GEMM family: the workload field, the kernel text
(only the storage type, mma.sync's operand type and the output conversion differ), the
runners' bf16 arrays (uint16 bits: numpy and CuPy have no bfloat16) and the reference
check with bf16's unit roundoff. The CPU emulator runs the bf16 kernels themselves
(tests/test_codegen_emulated.py); NVRTC compiles them (tests/test_compile_kernels.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.workloads import as_hopper
from pipetune.model.space import Space
from pipetune.model.workloads import bmm, conv2d, gemm, gemm_swiglu
from pipetune.workers.codegen import generate
from pipetune.workers.codegen.generator import build_key, launch_config, launch_plan
from pipetune.workers.runners import elements, reference

H100 = get_gpu("h100", calibrated=False)
pytest_plugins = ["service_fixtures"]


def _schedule(workload):
    space = Space.enumerate(workload, H100)
    return space[len(space) // 2]


# ---- the workload ----------------------------------------------------------------------


def test_a_bfloat16_workload_is_another_workload_and_says_so():
    fp16, bf16 = gemm(128, 64, 256), gemm(128, 64, 256, dtype="bfloat16")
    assert fp16.workload_hash != bf16.workload_hash
    # float16's documents and hashes are those written before bfloat16 existed.
    assert fp16.workload_hash == gemm(128, 64, 256, dtype="float16").workload_hash
    assert (fp16.label(), bf16.label()) == ("gemm 128x64x256", "gemm 128x64x256 bf16")
    assert bmm(2, 64, 64, 64, dtype="bfloat16").label() == "bmm 2x64x64x64 bf16"
    # The models read bytes and FLOPs, which are the same.
    assert bf16.operand_bytes == fp16.operand_bytes and bf16.flops == fp16.flops


def test_a_bfloat16_gemm_on_the_hopper_family_is_a_bfloat16_hopper_gemm():
    # Every family takes bfloat16 (the memory-intensive one: tests/test_memops_bfloat16.py; the
    # Hopper wgmma one: tests/test_hopper_bfloat16.py).
    hopper = as_hopper(gemm(128, 64, 256, dtype="bfloat16"))
    assert (hopper.op, hopper.dtype) == ("hopper_gemm", "bfloat16")
    assert hopper.label() == "hopper_gemm 128x64x256 bf16"


# ---- the kernel text -------------------------------------------------------------------


@pytest.mark.parametrize(
    "fp16",
    [gemm(256, 128, 256), gemm_swiglu(256, 64, 256, b_layout="nk"), conv2d(2, 8, 8, 16, 32, 3, 3)],
    ids=lambda w: w.op,
)
def test_a_bfloat16_kernel_differs_from_float16_only_in_its_type_words(fp16):
    bf16 = fp16.model_copy(update={"dtype": "bfloat16"})
    schedule = _schedule(fp16)
    a, b = generate(fp16, schedule), generate(bf16, schedule)
    assert (b.name, b.dtype, a.dtype) == (a.name + "_bf16", "bfloat16", "float16")
    assert (b.threads, b.smem_bytes) == (a.threads, a.smem_bytes)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in b.code
    assert "cvt.rn.bf16x2.f32" in b.code and ".f16" not in b.code
    # Undo the type words: the float16 kernel, character for character.
    words = [
        (b.name, a.name),
        ("__nv_bfloat16", "__half"),
        ("__CUDA_BF16_H__", "__CUDA_FP16_H__"),
        ("// bf16 storage", "// fp16 storage"),
        (".bf16.bf16.", ".f16.f16."),
        ("bf16 inputs", "f16 inputs"),
        ("bf16x2", "f16x2"),
        (", bfloat16, schedule", ", schedule"),
    ]
    text = b.code
    for new, old in words:
        text = text.replace(new, old)
    assert text == a.code


def test_the_build_key_and_launch_carry_the_element_type():
    fp16, bf16 = gemm(256, 128, 256), gemm(256, 128, 256, dtype="bfloat16")
    s = _schedule(fp16)
    assert (build_key(fp16, s), build_key(bf16, s)) == ("gemm_kn", "gemm_kn.bfloat16")
    kernel = generate(bf16, s)
    plan = launch_plan(kernel, bf16)
    assert [(b.name, b.dtype, b.c_type) for b in plan.buffers] == [
        ("A", "bfloat16", "const __nv_bfloat16*"),
        ("B", "bfloat16", "const __nv_bfloat16*"),
        ("C", "bfloat16", "__nv_bfloat16*"),
    ]
    assert plan.buffers[0].nbytes == 256 * 256 * 2
    # A kernel of one element type is never launched on the other's workload.
    with pytest.raises(ValueError, match="takes bfloat16; the workload is float16"):
        launch_config(kernel, fp16)
    with pytest.raises(ValueError, match="unknown element type 'float32'"):
        generate("gemm_kn", s, dtype="float32")


# ---- the runners' arrays and reference ---------------------------------------------------


def test_bfloat16_rounding_is_ml_dtypes_round_to_nearest_even():
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            rng.standard_normal(20_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 20_000),
            # Ties (the lower 16 bits exactly 0x8000) both ways, the largest finite values,
            # overflow, subnormals, signed zeros and infinities.
            (np.arange(0x3F800000, 0x3F800000 + (64 << 16), 1 << 15, dtype=np.uint32)).view(
                np.float32
            ),
            np.array([3.3895e38, 3.39e38, 3.4e38, -3.4e38, 1e-40, -1e-40, 0.0, -0.0]),
            np.array([np.inf, -np.inf], dtype=np.float32),
        ]
    ).astype(np.float32)
    ours = elements.narrow(np, values, "bfloat16")
    theirs = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert ours.dtype == np.uint16 and np.array_equal(ours, theirs)
    assert np.array_equal(
        elements.widen(np, ours), theirs.view(ml_dtypes.bfloat16).astype(np.float32)
    )
    nan = elements.narrow(np, np.array([np.nan], dtype=np.float32), "bfloat16")
    assert np.isnan(elements.widen(np, nan)).all()


def test_bfloat16_inputs_are_the_float16_draws_rounded_to_bfloat16():
    fp16, bf16 = gemm(64, 64, 128), gemm(64, 64, 128, dtype="bfloat16")
    (a16, _), (a, b) = reference.make_inputs(fp16, 3), reference.make_inputs(bf16, 3)
    assert a.dtype == b.dtype == np.uint16 and a.shape == (64, 128) and b.shape == (128, 64)
    values = elements.widen(np, a)
    assert np.abs(values).max() <= 1 and len(np.unique(values)) > 200
    # The same uniform draws, each rounded once: within bf16's and fp16's roundings of each other.
    assert np.abs(values - a16.astype(np.float32)).max() <= 2.0**-8 + 2.0**-11


@pytest.mark.parametrize(
    "workload",
    [gemm(64, 64, 4096, dtype="bfloat16"), gemm_swiglu(32, 64, 512, dtype="bfloat16")],
    ids=lambda w: w.op,
)
def test_the_check_passes_bfloat16_outputs_and_fails_wrong_ones(workload):
    a, b = reference.make_inputs(workload, 0)
    ref, tol = reference.reference(np, workload, a, b)
    # The reference rounded once to bf16: right. Rounded to bf16 from the fp16 rounding
    # (a double rounding) is right too: the tolerance leaves twice bf16's unit.
    c = elements.narrow(np, ref, "bfloat16")
    assert reference.check(np, c, ref, tol)[0]
    assert reference.check(np, elements.narrow(np, ref.astype(np.float16), "bfloat16"), ref, tol)[0]
    # The unit roundoff is bf16's: the fp16 tolerance would refuse the right answer.
    fp16_tol = reference.tolerance(np, ref, None, 1 << 16)  # rounding term only, fp16's unit
    assert (np.abs(elements.widen(np, c) - ref) > fp16_tol).any()
    # The largest output off by four of its units, and the bits read as fp16: both fail.
    bad = c.copy()
    bad.ravel()[int(np.abs(ref).argmax())] += 4
    passed, _, why = reference.check(np, bad, ref, tol)
    assert not passed and "1 of" in why and "outside the bf16 tolerance" in why
    as_fp16 = c.view(np.float16)
    assert not reference.check(np, as_fp16, ref, tol)[0]


def test_a_dropped_k_tile_fails_the_bfloat16_check():
    workload = gemm(64, 64, 1024, dtype="bfloat16")
    a, b = reference.make_inputs(workload, 1)
    ref, tol = reference.reference(np, workload, a, b)
    a32, b32 = elements.widen(np, a), elements.widen(np, b)
    dropped = a32[:, 64:] @ b32[64:]  # the first 64-deep K tile left out
    assert not reference.check(np, elements.narrow(np, dropped, "bfloat16"), ref, tol)[0]


def test_the_tolerance_text_names_bf16s_unit():
    assert "2*2^-8*|ref|" in reference.tolerance_text(gemm(64, 64, 64, dtype="bfloat16"))
    assert "2*2^-11*|ref|" in reference.tolerance_text(gemm(64, 64, 64))
    swiglu = reference.tolerance_text(gemm_swiglu(64, 64, 64, dtype="bfloat16"))
    assert swiglu.startswith("|C-ref| <= 2*2^-8*|ref|")


# ---- through the service ---------------------------------------------------------------


def test_the_service_tunes_a_bfloat16_workload_apart_from_its_float16_twin(client):
    from service_support import SMALL_GEMM, drain, register

    bf16 = {**SMALL_GEMM, "dtype": "bfloat16"}
    body = {"workload": bf16, "gpu": "h100", "tune": {"budget": 8, "strategy": "random"}}
    response = client.post("/v1/schedules", json=body)
    assert response.status_code == 202, response.text
    worker = register(client)
    seen: list[dict] = []

    def answer(job: dict) -> dict:
        seen.append(job["workload"])
        return {"status": "ok", "latency_us": 20.0, "samples_us": [20.0], "spread": 0.0}

    assert drain(client, worker, answer) == 8
    assert all(w["dtype"] == "bfloat16" for w in seen)  # the worker builds bf16 kernels
    measured = client.post("/v1/schedules", json={"workload": bf16, "gpu": "h100"}).json()
    assert (measured["source"], measured["latency_us"]) == ("measured", 20.0)
    assert measured["workload"]["dtype"] == "bfloat16"
    twin = client.post("/v1/schedules", json={"workload": SMALL_GEMM, "gpu": "h100"}).json()
    assert twin["source"] == "model"  # float16's answer is not bfloat16's measurement
    refused = client.post(
        "/v1/schedules", json={"workload": {**SMALL_GEMM, "dtype": "float32"}, "gpu": "h100"}
    )
    assert refused.status_code == 422
    assert refused.json()["field"] == "dtype" and "'float16' or 'bfloat16'" in refused.text


def test_the_campaigns_correctness_phase_checks_bfloat16_kernels_as_a_kind_of_their_own():
    from pipetune.workers.campaign.correctness import PER_CASE, kind_of, selection

    chosen = [(w, s) for _, w, s in selection(H100, ["tensor_gemm"]) if w.dtype == "bfloat16"]
    assert {w.op for w, _ in chosen} == {"gemm", "gemm_swiglu", "gemm_bias_gelu"}
    assert all(len(s) == PER_CASE for _, s in chosen)
    # Counted (and quarantined) apart from the float16 kernels the sweeps time.
    assert [kind_of(w) for w, _ in chosen] == [
        "gemm_kn.bfloat16",
        "gemm_swiglu_nk.bfloat16",
        "gemm_bias_gelu_kn.bfloat16",
    ]
    assert kind_of(gemm(64, 64, 64)) == "gemm_kn"
