"""The generator's public API: variants, sources, launch arguments, the stratified sample."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule, Space
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm
from pipetune.workers.codegen import (
    SCALAR_ARGS,
    VARIANTS,
    generate,
    launch,
    launch_config,
    variant_of,
)
from pipetune.workers.codegen.sample import stratified_sample
from pipetune.workers.codegen.variants import CONV_DIVISORS

S = Schedule(2, 2, 2, 1, 2, 3, 2)


def test_variant_of_every_operator():
    assert variant_of(gemm(64, 64, 64)) == "gemm_kn"
    assert variant_of(gemm(64, 64, 64, b_layout="nk")) == "gemm_nk"
    assert variant_of(bmm(2, 64, 64, 64)) == "bmm"
    assert variant_of(conv2d(1, 8, 8, 8, 8, 3, 3)) == "conv2d"
    assert variant_of(conv3d(1, 4, 8, 8, 8, 8, 3, 3, 3)) == "conv3d"


@pytest.mark.parametrize("variant", VARIANTS)
def test_source_has_the_kernel_entry_and_the_tensor_core_path(variant):
    k = generate(variant, S)
    assert k.variant == variant and k.schedule == S
    assert k.name == f"pipetune_{variant}_s_2_2_2_1_2_3_2"
    assert k.threads == 128
    assert k.smem_bytes == S.smem_bytes == 3 * (64 + 32) * 32 * 2
    assert f'extern "C" __global__ void __launch_bounds__({k.threads}, 1)\n{k.name}(' in k.code
    assert "#include" not in k.code  # header-free: CI machines have no CUDA toolkit
    assert "extern __shared__" in k.code
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in k.code
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in k.code
    # .trans exactly where B is stored K x N (n contiguous in shared memory).
    b_kn = variant in ("gemm_kn", "gemm_swiglu_kn", "gemm_bias_gelu_kn", "bmm")
    assert f"constexpr bool B_KN = {str(b_kn).lower()};" in k.code
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in k.code
    params = re.search(rf"{k.name}\(([^)]*)\)", k.code).group(1)
    assert params.count("int ") == len(SCALAR_ARGS[variant])


def test_source_depends_only_on_variant_and_schedule():
    small, large = gemm(16, 16, 16), gemm(4096, 1024, 8192)
    assert generate(small, S).code == generate(large, S).code == generate("gemm_kn", S).code
    assert generate("gemm_kn", S).code != generate("gemm_nk", S).code
    assert generate("gemm_kn", S).code != generate("gemm_kn", Schedule(2, 2, 2, 1, 2, 4, 2)).code


def test_bad_variant_or_knob_is_rejected():
    with pytest.raises(ValueError, match="variant"):
        generate("gemm_tn", S)
    with pytest.raises(ValueError, match="chunk"):
        generate("gemm_kn", Schedule(1, 1, 1, 1, 3, 1, 1))


def test_launch_arguments_per_variant():
    s = Schedule(1, 1, 2, 1, 1, 2, 1)  # 32 x 16 tiles
    grid, args = launch(generate("gemm_kn", s), gemm(100, 40, 64))
    assert grid == (4 * 3, 1, 1) and args == (100, 40, 64)
    grid, args = launch(generate("bmm", s), bmm(5, 32, 16, 8))
    assert grid == (1, 1, 5) and args == (32, 16, 8)
    w2 = conv2d(2, 9, 9, 16, 24, 3, 3, stride=2, pad=1)  # P = Q = 5
    grid, args = launch(generate("conv2d", s), w2)
    # The shape, then (multiplier as int32 bits, shift) for Q = 5, P = 5, C = 16, S = 3, R = 3:
    # ceil(2^34 / 5) = 3435973837, 2^35 / 16 = 2^31, ceil(2^33 / 3) = 2863311531.
    fifth, sixteenth, third = (3435973837 - 2**32, 2), (2**31 - 2**32, 3), (2863311531 - 2**32, 1)
    assert args == (2, 9, 9, 16, 24, 3, 3, 5, 5, 2, 1, *fifth, *fifth, *sixteenth, *third, *third)
    assert len(args) == len(SCALAR_ARGS["conv2d"])
    assert grid == (-(-2 * 5 * 5 // 32) * 2, 1, 1)
    w3 = conv3d(1, 4, 6, 6, 8, 16, 3, 3, 3, pad=1)
    args3 = launch(generate("conv3d", s), w3)[1]
    assert args3[:14] == (1, 4, 6, 6, 8, 16, 3, 3, 3, 4, 6, 6, 1, 1)
    # Q = 6, P = 6, O = 4 (a power of two: 2^33 / 4 = 2^31, shift 1), C = 8, S = 3, R = 3.
    sixth, quarter, eighth = (2863311531 - 2**32, 2), (2**31 - 2**32, 1), (2**31 - 2**32, 2)
    assert args3[14:] == (*sixth, *sixth, *quarter, *eighth, *third, *third)
    with pytest.raises(ValueError, match="gemm_nk"):
        launch(generate("gemm_kn", s), gemm(64, 64, 64, b_layout="nk"))


@pytest.mark.parametrize(
    "workload",
    [
        conv2d(2, 9, 9, 16, 24, 3, 3, stride=2, pad=1),
        conv2d(32, 56, 56, 64, 64, 3, 3, pad=1),
        conv3d(1, 4, 6, 6, 8, 16, 3, 3, 3, pad=1),
        conv3d(64, 14, 7, 7, 512, 512, 3, 3, 3, pad=1),
    ],
)
def test_conv_division_constants_divide_exactly(workload):
    """What a convolution kernel does with its division constants (the multiplier's int32
    bits read as unsigned, mul.hi, shift) divides every n < 2^31 by its size exactly."""
    variant = variant_of(workload)
    args = dict(zip(SCALAR_ARGS[variant], launch(generate(variant, S), workload)[1], strict=True))
    rng = np.random.default_rng(0)
    n = np.concatenate([np.arange(4096), rng.integers(0, 2**31, 20000), [2**31 - 1]])
    n = n.astype(np.uint64)
    for d, size in CONV_DIVISORS[variant].items():
        multiplier, shift = args[f"{d}_mul"] & 0xFFFFFFFF, args[f"{d}_shift"]
        quotient = ((n * np.uint64(multiplier)) >> np.uint64(32 + shift)) if multiplier else n
        assert np.array_equal(quotient, n // np.uint64(args[size])), d


@pytest.fixture(scope="module")
def space():
    return Space.enumerate(gemm(4096, 4096, 4096), get_gpu("h100", calibrated=False))


def test_sample_reaches_every_stage_and_both_tile_extremes(space):
    sample = stratified_sample(space, 16, seed=3)
    assert len(sample) == len(set(sample)) == 16
    assert all(s in space for s in sample)
    assert {s.smem_stages for s in sample} == set(space.knobs["smem_stages"].tolist())
    assert {s.reg_stages for s in sample} == {1, 2}
    volume = space.block_m * space.block_n * space.block_k
    volumes = {s.block_m * s.block_n * s.block_k for s in sample}
    assert volume.max() in volumes and volume.min() in volumes
    assert max(s.est_registers for s in sample) == space.est_registers.max()


def test_sample_is_deterministic_and_capped_by_the_space(space):
    assert stratified_sample(space, 30, seed=1) == stratified_sample(space, 30, seed=1)
    assert stratified_sample(space, 30, seed=1) != stratified_sample(space, 30, seed=2)
    tiny = space.subset(np.arange(5))
    assert sorted(stratified_sample(tiny, 100)) == sorted(tiny)
    with pytest.raises(ValueError):
        stratified_sample(space, 0)


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200"])
def test_the_unconstrained_shapes_exclude_no_schedule_the_gpu_allows(gpu):
    """What `pipetune kernel compile` samples without a shape: on these shapes no shape rule
    (tile overhang, stages beyond K tiles) excludes a schedule, so their space is every
    schedule valid on the GPU."""
    from pipetune.model.space import KNOB_NAMES, KNOBS, invalid_reasons
    from pipetune.workers.codegen.sample import UNCONSTRAINED_SHAPES, unconstrained_workload

    mesh = np.meshgrid(*[np.array(v) for v in KNOBS.values()], indexing="ij")
    grid = {name: g.ravel() for name, g in zip(KNOB_NAMES, mesh, strict=True)}
    shape_rules = ("tile overhangs the problem", "more pipeline stages than K tiles")
    for op in UNCONSTRAINED_SHAPES:
        reasons = invalid_reasons(grid, unconstrained_workload(op), get_gpu(gpu))
        for rule in shape_rules:
            assert not reasons[rule].any(), (op, rule)


@pytest.mark.parametrize(
    "workload",
    [
        conv2d(8, 28, 28, 64, 64, 3, 3, pad=1),
        conv3d(1, 4, 6, 6, 8, 16, 3, 3, 3, pad=1),
        gemm(64, 64, 64),
    ],
    ids=lambda w: w.label(),
)
def test_launch_arguments_are_named_once_as_the_kernel_names_them(workload):
    """The launch document named a convolution's output buffer and its channel count both
    `C` (["A", "B", "C", "N", "H", "W", "C", ...]): a launcher written from it passed the
    output pointer where the channels belong. Every argument has one name now, and a
    convolution's scalars are the kernel's own parameter names."""
    variant = variant_of(workload)
    kernel = generate(variant, S)
    arguments = launch_config(kernel, workload).arguments
    assert len(set(arguments)) == len(arguments), arguments
    signature = re.search(rf"{kernel.name}\(([^)]*)\)", kernel.code).group(1)
    declared = [p.split()[-1] for p in signature.split(",")]
    if variant.startswith("conv"):
        assert declared == [f"{a}_ptr" for a in arguments[:3]] + list(arguments[3:])
    else:
        assert declared[3:] == [f"{a}_arg" for a in arguments[3:]]
