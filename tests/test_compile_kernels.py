"""Every kernel variant compiles with NVRTC for sm_80 and sm_90 over a stratified sample of
its valid space, with no register spills and at most 255 registers (no GPU needed); and so
does each variant's bfloat16 kernel, at the space's corners.

The sample of each (variant, arch) covers the space's extremes (largest and smallest tile,
most registers, most shared memory: where a kernel spills or fails first; the largest tile
is also the most register-hungry here, so three schedules), then one random schedule of
every (smem_stages, reg_stages) stratum of the space (smem_stages 1..6 x reg_stages 1, 2)
and one more. bfloat16 changes only the kernels' type words (tests/test_bfloat16.py), which
the pipeline depths do not touch: its sample is the same extremes and one schedule more.
400 compiles, each a distinct source (over 200 distinct schedules); compile_many runs them
in parallel and the disk cache (PIPETUNE_CACHE_DIR, else the user cache dir) makes reruns
quick.
"""

from __future__ import annotations

import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm, gemm_bias_gelu, gemm_swiglu
from pipetune.workers.codegen import VARIANTS, generate
from pipetune.workers.codegen.sample import stratified_sample
from pipetune.workers.compile import CompileError, compile_many

# stratified_sample's order: the extremes, then the strata round-robin, so 16 reach every
# one of the 12 strata.
PER_PAIR = 16
WORKLOADS = {
    "gemm_kn": gemm(4096, 4096, 4096),
    "gemm_nk": gemm(4096, 4096, 4096, b_layout="nk"),
    "gemm_swiglu_kn": gemm_swiglu(4096, 2048, 4096),
    "gemm_swiglu_nk": gemm_swiglu(4096, 2048, 4096, b_layout="nk"),
    "gemm_bias_gelu_kn": gemm_bias_gelu(4096, 3072, 1024),
    "gemm_bias_gelu_nk": gemm_bias_gelu(4096, 3072, 1024, b_layout="nk", approximate="tanh"),
    "bmm": bmm(16, 1024, 1024, 1024),
    "bmm_nk": bmm(16, 1024, 1024, 1024, b_layout="nk"),
    "conv2d": conv2d(32, 56, 56, 128, 256, 3, 3, pad=1),
    "conv3d": conv3d(4, 16, 28, 28, 64, 128, 3, 3, 3, pad=1),
}
ARCHS = {"sm_80": "a100", "sm_90": "h100"}
# bfloat16 changes only the kernels' type words (tests/test_bfloat16.py): the extremes and
# one schedule more.
PER_PAIR_BF16 = 4
BF16 = ".bf16"  # the sample's key: the variant and this


@pytest.fixture(scope="module")
def compiled():
    """{(variant, arch): [(schedule, result or CompileError), ...]}"""
    out = {}
    for seed, (arch, gpu_key) in enumerate(ARCHS.items()):
        gpu = get_gpu(gpu_key, calibrated=False)
        kernels = []
        for i, (variant, workload) in enumerate(WORKLOADS.items()):
            space = Space.enumerate(workload, gpu)
            for s in stratified_sample(space, PER_PAIR, seed=10 * seed + i):
                kernels.append((variant, generate(workload, s)))
            bf16 = workload.model_copy(update={"dtype": "bfloat16"})
            for s in stratified_sample(space, PER_PAIR_BF16, seed=10 * seed + i + 100):
                kernels.append((variant + BF16, generate(bf16, s)))
        results = compile_many([k for _, k in kernels], arch, return_exceptions=True)
        for (variant, kernel), result in zip(kernels, results, strict=True):
            out.setdefault((variant, arch), []).append((kernel.schedule, result))
    return out


@pytest.fixture(scope="module")
def space_strata():
    """{(variant, arch): the (smem_stages, reg_stages) pairs its space holds}"""
    strata = {}
    for arch, gpu_key in ARCHS.items():
        gpu = get_gpu(gpu_key, calibrated=False)
        for variant, workload in WORKLOADS.items():
            knobs = Space.enumerate(workload, gpu).knobs
            pairs = zip(knobs["smem_stages"].tolist(), knobs["reg_stages"].tolist(), strict=True)
            strata[(variant, arch)] = set(pairs)
    return strata


def test_sample_spans_every_variant_arch_stratum_and_200_schedules(compiled, space_strata):
    assert set(WORKLOADS) == set(VARIANTS)
    assert set(compiled) == {(v + t, a) for v in WORKLOADS for t in ("", BF16) for a in ARCHS}
    distinct = {s for rows in compiled.values() for s, _ in rows}
    assert len(distinct) >= 200
    for (variant, arch), rows in compiled.items():
        if variant.endswith(BF16):
            assert len(rows) == PER_PAIR_BF16
            continue
        assert {s.smem_stages for s, _ in rows} >= {1, 2, 3, 4, 5}
        assert {s.reg_stages for s, _ in rows} == {1, 2}
        assert {(s.smem_stages, s.reg_stages) for s, _ in rows} == space_strata[(variant, arch)]


def test_every_sampled_schedule_compiles(compiled):
    failures = [
        f"{v} {a} {s.id}: {r}"
        for (v, a), rows in compiled.items()
        for s, r in rows
        if isinstance(r, CompileError)
    ]
    assert not failures, "\n".join(failures[:5])


def test_valid_schedules_do_not_spill(compiled):
    spills = [
        f"{v} {a} {s.id}: {r.registers} regs, {r.spill_bytes} B spilled, {r.stack_bytes} B stack"
        for (v, a), rows in compiled.items()
        for s, r in rows
        if not isinstance(r, CompileError) and (r.spill_bytes or r.stack_bytes)
    ]
    assert not spills, "\n".join(spills)


def test_register_counts_within_the_hardware_limit_and_launch_bounds(compiled):
    for (variant, arch), rows in compiled.items():
        for s, r in rows:
            if isinstance(r, CompileError):
                continue
            # __launch_bounds__(threads) caps a block at the register file: 64K / threads.
            assert 0 < r.registers <= min(255, 65536 // s.threads), (variant, arch, s.id)
            assert r.smem_static_bytes == 0  # all shared memory is dynamic
            assert r.arch == arch and len(r.cubin) > 0
