"""bfloat16 operands for the Hopper warpgroup-MMA family (hopper_gemm, hopper_bmm): the workload
field, the kernel text (only the pointers' storage type, wgmma's operand type and the output
conversion differ from the float16 kernel), the build key, the run's buffers and TMA tensor
maps, pipetune.kernel, and NVRTC for sm_90a. The CPU emulator runs the bf16 wgmma kernels
themselves (tests/test_wgmma_emulated.py)."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest

import pipetune
from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.space import PER_TILE, PERSISTENT, STREAM_K, HopperSchedule, HopperSpace
from pipetune.model.hopper.workloads import as_hopper, parse_hopper_workload
from pipetune.model.workloads import WorkloadError, bmm, gemm
from pipetune.workers.codegen import wgmma
from pipetune.workers.codegen.wgmma import WgmmaConfig
from pipetune.workers.codegen.wgmma import family as codegen
from pipetune.workers.compile import compile_many
from pipetune.workers.runners import tensor_maps

H100 = get_gpu("h100", calibrated=False)
FC2 = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
QK = {"op": "hopper_bmm", "b": 12, "m": 1024, "n": 1024, "k": 64}
BF16 = {"dtype": "bfloat16"}


def _both(data: dict) -> tuple:
    """The float16 workload and its bfloat16 twin."""
    return parse_hopper_workload(data), parse_hopper_workload({**data, **BF16})


# ---- the workload ----------------------------------------------------------------------


def test_a_bfloat16_hopper_workload_is_another_workload_and_says_so():
    for data, label, fp16_hash in (
        (FC2, "hopper_gemm 1024x768x3072", "ccf81e243e4a9b9f"),
        (QK, "hopper_bmm 12x1024x1024x64", "f20d4f4574ccd841"),
    ):
        fp16, bf16 = _both(data)
        assert (fp16.dtype, bf16.dtype) == ("float16", "bfloat16")
        # float16's labels and hashes are those written before the family took bfloat16.
        assert (fp16.label(), fp16.workload_hash) == (label, fp16_hash)
        assert bf16.label() == label + " bf16" and bf16.workload_hash != fp16_hash
        assert (bf16.flops, bf16.operand_bytes) == (fp16.flops, fp16.operand_bytes)
    description = type(bf16).model_json_schema()["properties"]["dtype"]
    assert description["enum"] == ["float16", "bfloat16"]
    assert "float16 or bfloat16" in description["description"]


def test_as_hopper_keeps_the_element_type():
    assert as_hopper(gemm(1024, 768, 3072, **BF16)) == _both(FC2)[1]
    assert as_hopper(bmm(12, 1024, 1024, 64, **BF16)) == _both(QK)[1]
    assert as_hopper(gemm(1024, 768, 3072)) == _both(FC2)[0]


def test_an_element_type_the_family_has_no_kernel_for_is_refused_by_field():
    with pytest.raises(WorkloadError) as refused:
        parse_hopper_workload({**FC2, "dtype": "float32"})
    assert refused.value.field == "dtype"
    assert "the wgmma kernels take float16 or bfloat16 inputs" in str(refused.value)


# ---- the kernel text -------------------------------------------------------------------

# The family's three tile loops (TMA loader, staged epilogue) and the probe's other kinds
# (cp.async loader with the direct epilogue, split-K and its reduction kernel), both variants.
FAMILY = [
    (FC2, HopperSchedule(128, 256, 3, PER_TILE)),
    (QK, HopperSchedule(64, 128, 6, PERSISTENT)),
    (FC2, HopperSchedule(128, 128, 4, STREAM_K)),
]
PROBE = [
    ("gemm_kn", WgmmaConfig(128, 128, 4)),
    ("bmm", WgmmaConfig(64, 128, 6, loader="tma", splits=2)),
]


def _pairs() -> list:
    """(float16 kernel, bfloat16 kernel, block_n) of every kind above, by the bf16 name."""
    pairs = []
    for data, schedule in FAMILY:
        fp16, bf16 = _both(data)
        kernels = codegen.generate(fp16, schedule), codegen.generate(bf16, schedule)
        pairs.append((*kernels, schedule.tile_n))
    for variant, config in PROBE:
        kernels = wgmma.generate(variant, config), wgmma.generate(variant, config, "bfloat16")
        pairs.append((*kernels, config.block_n))
    return [pytest.param(*pair, id=pair[1].name) for pair in pairs]


@pytest.mark.parametrize(("a", "b", "block_n"), _pairs())
def test_a_bfloat16_wgmma_kernel_differs_from_float16_only_in_its_type_words(a, b, block_n):
    assert (b.name, b.dtype, a.dtype) == (a.name + "_bf16", "bfloat16", "float16")
    assert (b.threads, b.smem_bytes) == (a.threads, a.smem_bytes)
    assert f"wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.bf16.bf16 " in b.code
    assert "cvt.rn.bf16x2.f32" in b.code and "__nv_bfloat16* __restrict__ C_ptr" in b.code
    assert ".f16" not in b.code and "__half" not in b.code
    # Undo the type words: the float16 kernel, character for character.
    words = [
        (b.name, a.name),  # the split-K reduction kernel's name too (the kernel's + "_reduce")
        ("__nv_bfloat16", "__half"),
        ("__CUDA_BF16_H__", "__CUDA_FP16_H__"),
        ("// bf16 storage", "// fp16 storage"),
        (".bf16.bf16", ".f16.f16"),  # wgmma's, and the unused mma.sync wrapper's
        ("bf16 inputs", "f16 inputs"),
        ("bf16x2", "f16x2"),
        ("-> bf16", "-> f16"),  # the epilogues' comments
        ("rounds them to bf16", "rounds them to f16"),
        (", bfloat16, block", ", block"),  # the header
    ]
    text = b.code
    for new, old in words:
        text = text.replace(new, old)
    assert text == a.code


def test_an_unknown_element_type_is_refused_by_the_generator():
    with pytest.raises(ValueError, match="unknown element type 'float32'"):
        wgmma.generate("gemm_kn", WgmmaConfig(128, 128, 4), "float32")
    with pytest.raises(ValueError, match="unknown element type 'float32'"):
        codegen.generate("gemm_kn", HopperSchedule(128, 128, 4, PER_TILE), "float32")


# ---- the build key, the run -------------------------------------------------------------


def test_the_build_key_carries_the_element_type():
    s = HopperSchedule(128, 128, 4, PER_TILE)
    fp16, bf16 = _both(FC2)
    assert (codegen.build_key(fp16, s), codegen.build_key(bf16, s)) == (
        "gemm_kn",
        "gemm_kn.bfloat16",
    )
    assert codegen.build_key(_both(QK)[1], s) == "bmm.bfloat16"
    # A variant string with a dtype gives the workload's kernel.
    assert codegen.generate("gemm_kn", s, "bfloat16") == codegen.generate(bf16, s)


def test_the_run_takes_bfloat16_operands_and_tensor_maps():
    fp16, bf16 = _both(FC2)
    schedule = HopperSchedule(128, 128, 4, STREAM_K)
    kernel = codegen.generate(bf16, schedule)
    plan = codegen.launch_plan(kernel, bf16, sm_count=132)
    assert [(b.name, b.dtype, b.c_type) for b in plan.buffers] == [
        ("A", "bfloat16", "const __nv_bfloat16*"),
        ("B", "bfloat16", "const __nv_bfloat16*"),
        ("C", "bfloat16", "__nv_bfloat16*"),
        ("W", "float32", "float*"),  # the f32 partial sums, whatever the operands
        ("arrivals", "uint32", "unsigned*"),
    ]
    assert plan.launches[0].kernel == kernel.name
    twin = codegen.launch_plan(codegen.generate(fp16, schedule), fp16, sm_count=132)
    assert [m.dtype for m in plan.tensor_maps] == ["bfloat16", "bfloat16"]
    assert [m.dtype for m in twin.tensor_maps] == ["float16", "float16"]
    # The same boxes, sizes and strides: both element types are 2 bytes.
    assert [replace(m, dtype="float16") for m in plan.tensor_maps] == list(twin.tensor_maps)
    assert [b.nbytes for b in plan.buffers] == [b.nbytes for b in twin.buffers]
    # A kernel of one element type is never run on the other's workload.
    with pytest.raises(ValueError, match="takes bfloat16; the workload is float16"):
        codegen.launch_plan(kernel, fp16, sm_count=132)


@pytest.mark.parametrize(("dtype", "expected"), [("float16", 6), ("bfloat16", 9)])
def test_a_tensor_maps_data_type_is_its_operands(monkeypatch, dtype, expected):
    """encode_tensor_map through ctypes against a stand-in of the driver's
    cuTensorMapEncodeTiled: the data type it is asked for is CUtensorMapDataType's
    FLOAT16 (6) or BFLOAT16 (9), as the plan's map says."""
    seen: list[int] = []
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    prototype = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
        u64p, u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    )  # fmt: skip

    def driver(out, data_type, *rest):
        seen.append(data_type)
        return 0

    stand_in = prototype(driver)

    class Library:
        cuTensorMapEncodeTiled = stand_in

    monkeypatch.setattr(tensor_maps.ctypes, "CDLL", lambda name: Library())
    workload = parse_hopper_workload({**FC2, "dtype": dtype})
    kernel = codegen.generate(workload, HopperSchedule(128, 128, 4, PER_TILE))
    for spec in codegen.launch_plan(kernel, workload).tensor_maps:
        tensor_maps.encode_tensor_map(spec, 0x7F0000001000)
    assert seen == [expected, expected]
    assert tensor_maps.CU_TENSOR_MAP_DATA_TYPES[dtype] == expected


def test_the_data_types_are_the_drivers_enumerators():
    driver = pytest.importorskip("cuda.bindings.driver")
    kinds = driver.CUtensorMapDataType
    assert {
        "float16": int(kinds.CU_TENSOR_MAP_DATA_TYPE_FLOAT16),
        "bfloat16": int(kinds.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16),
    } == tensor_maps.CU_TENSOR_MAP_DATA_TYPES


def test_pipetune_kernel_gives_a_hopper_kernel_on_bfloat16_operands():
    k = pipetune.kernel({**FC2, **BF16}, "h100")
    assert k.workload.dtype == "bfloat16" and k.name.endswith("_bf16")
    assert ".f32.bf16.bf16 " in k.source and "cvt.rn.bf16x2.f32" in k.source
    assert [op.dtype for op in k.operands] == ["bfloat16"] * 3
    assert [m.dtype for m in k.plan.tensor_maps] == ["bfloat16", "bfloat16"]
    twin = pipetune.kernel(FC2, "h100", schedule=k.schedule)
    assert twin.name + "_bf16" == k.name
    assert [op.dtype for op in twin.operands] == ["float16"] * 3


# ---- NVRTC -------------------------------------------------------------------------------


def test_bfloat16_hopper_kernels_compile_for_sm_90a_as_their_float16_twins():
    """NVRTC (no GPU) builds a sample of bf16 kernels of the family (every tile loop, both
    variants) and the probe's other kinds for sm_90a: no spills, ptxas did not serialise the
    MMAs, and the same registers as the float16 twin (only type words differ)."""
    kernels, loops = [], set()
    for data in (FC2, QK):
        fp16, bf16 = _both(data)
        for schedule in codegen.stratified_sample(HopperSpace.enumerate(fp16, H100), 6, seed=5):
            kernels += [codegen.generate(bf16, schedule), codegen.generate(fp16, schedule)]
            loops.add(schedule.tile_loop)
    assert loops == {PER_TILE, PERSISTENT, STREAM_K}
    for variant, config in PROBE:
        kernels += [wgmma.generate(variant, config, "bfloat16"), wgmma.generate(variant, config)]
    built = compile_many(kernels, "sm_90a")
    for i in range(0, len(kernels), 2):
        (bf16, fp16), (b, a) = kernels[i : i + 2], built[i : i + 2]
        assert bf16.dtype == "bfloat16" and fp16.dtype == "float16"
        assert b.spill_stores_bytes == 0 and b.spill_loads_bytes == 0, (bf16.name, b.log)
        assert "wgmma" not in b.log.lower(), (bf16.name, b.log)
        assert b.registers == a.registers <= 255, bf16.name
