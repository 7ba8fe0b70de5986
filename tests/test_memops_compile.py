"""Every knob value of every memory-intensive op compiles with NVRTC for sm_80 and sm_90,
without register spills or stack, within the block's register budget (no GPU needed); a
smaller sample of every op's bfloat16 kernels too.

The spaces hold hundreds to a thousand schedules per workload, so the test compiles a
sample that reaches every knob value of each op's spaces on each GPU (a greedy cover,
workers/codegen/memops/sample.py): about 15 schedules per (op, arch), some 150 compiles.
compile_many runs them in parallel and the disk cache (PIPETUNE_CACHE_DIR, else the user
cache dir) makes reruns quick.
"""

from __future__ import annotations

import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import (
    KNOBS,
    REGISTER_FIT_ERROR,
    MemSpace,
    register_budget,
)
from pipetune.model.memops.workloads import (
    bias_gelu,
    layernorm,
    op_key,
    parse_mem_workload,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.workers.codegen.memops import generate
from pipetune.workers.codegen.memops.sample import covering_sample
from pipetune.workers.compile import CompileError, compile_many
from pipetune.workers.compile.ptxas_report import parse_ptxas_report

# Per kernel kind (op key): shapes from the benchmark suite and AStitch's irregular ones
# (short rows in great number, few very long rows).
WORKLOADS = {
    "reduce-sum": [reduce(64, 30000), reduce(4096, 4096), reduce(49152, 128)],
    "reduce-max": [reduce(750000, 32, "max"), reduce(8, 65536, "max")],
    "softmax": [softmax(4096, 768), softmax(8, 65536), softmax(49152, 128)],
    # attention's: a masked softmax is a kernel of its own (the scale an argument of both)
    "softmax-causal": [
        softmax(4096, 1024, 0.125, causal=True),
        softmax(64, 32768, causal=True, queries=8),
        softmax(49152, 128, 0.088, causal=True),
    ],
    "layernorm": [layernorm(4096, 768), layernorm(16, 65536), layernorm(512, 8192)],
    "rmsnorm": [rmsnorm(4096, 4096), rmsnorm(16, 65536), rmsnorm(512, 8192)],
    "silu_mul": [silu_mul(4096, 11008), silu_mul(64, 30000), silu_mul(750000, 32)],
    "bias_gelu": [bias_gelu(4096, 3072), bias_gelu(64, 30000, "tanh"), bias_gelu(750000, 32)],
}
ARCHS = {"sm_80": "a100", "sm_90": "h100"}


@pytest.fixture(scope="module")
def compiled():
    """{(kind, arch): [(workload, schedule, space row, result or CompileError), ...]}"""
    out = {}
    for arch, gpu_key in ARCHS.items():
        gpu = get_gpu(gpu_key, calibrated=False)
        jobs = []
        for kind, workloads in WORKLOADS.items():
            candidates = []
            for w in workloads:
                space = MemSpace.enumerate(w, gpu)
                candidates += [(w, space, i) for i in range(len(space))]
            for w, space, i in covering_sample(candidates, lambda c: c[1][c[2]], seed=1):
                jobs.append((kind, w, space, i))
        kernels = [generate(w, space[i]) for _, w, space, i in jobs]
        results = compile_many([k.code for k in kernels], arch, return_exceptions=True)
        for (kind, w, space, i), result in zip(jobs, results, strict=True):
            out.setdefault((kind, arch), []).append((w, space, i, result))
    return out


def test_sample_reaches_every_knob_value_of_every_kind_and_arch(compiled):
    assert set(compiled) == {(k, a) for k in WORKLOADS for a in ARCHS}
    for (kind, arch), rows in compiled.items():
        gpu = get_gpu(ARCHS[arch], calibrated=False)
        allowed = {
            (knob.name, v)
            for w in WORKLOADS[kind]
            for s in MemSpace.enumerate(w, gpu)
            for knob in KNOBS
            for v in [getattr(s, knob.name)]
        }
        reached = {(k.name, getattr(space[i], k.name)) for _, space, i, _ in rows for k in KNOBS}
        assert reached == allowed, (kind, arch, sorted(allowed - reached))
        assert all(op_key(w) == kind.removesuffix("-causal") for w, *_ in rows)
    kinds_values = {k.name: set() for k in KNOBS}
    for rows in compiled.values():
        for _, space, i, _ in rows:
            for k in KNOBS:
                kinds_values[k.name].add(getattr(space[i], k.name))
    # Over all kinds, every value of every knob is compiled.
    assert kinds_values == {k.name: set(k.values) for k in KNOBS}


def test_every_sampled_schedule_compiles(compiled):
    failures = [
        f"{kind} {arch} {w.label()} {space[i].id}: {r}"
        for (kind, arch), rows in compiled.items()
        for w, space, i, r in rows
        if isinstance(r, CompileError)
    ]
    assert not failures, "\n".join(failures[:5])


def test_valid_schedules_do_not_spill(compiled):
    spills = [
        f"{arch} {w.label()} {space[i].id}: {r.registers} regs, {r.spill_bytes} B spilled, "
        f"{r.stack_bytes} B stack"
        for (kind, arch), rows in compiled.items()
        for w, space, i, r in rows
        if not isinstance(r, CompileError) and (r.spill_bytes or r.stack_bytes)
    ]
    assert not spills, "\n".join(spills)


def test_registers_within_budget_and_the_fit(compiled):
    """ptxas stays within __launch_bounds__'s budget, and the space's register estimate
    (used for occupancy) is at most REGISTER_FIT_ERROR below what ptxas allocates."""
    for (_, arch), rows in compiled.items():
        for w, space, i, r in rows:
            if isinstance(r, CompileError):
                continue
            s = space[i]
            assert 0 < r.registers <= int(register_budget(space.gpu, s.threads)), (arch, s.id)
            assert r.registers <= int(space.registers[i]) + REGISTER_FIT_ERROR, (
                f"{arch} {w.label()} {s.id}: ptxas {r.registers}, fit {int(space.registers[i])}"
            )
            assert r.smem_static_bytes == 0  # all shared memory is dynamic
            entries = parse_ptxas_report(r.log)
            assert set(entries) == set(generate(w, s).entries)


# The layer norm shapes, with the one where a schedule the space took spilled (64x8192).
NEAREST_BUDGET_WORKLOADS = [*WORKLOADS["layernorm"], layernorm(64, 8192), *WORKLOADS["rmsnorm"]]


def test_the_valid_schedules_nearest_the_register_budget_do_not_spill():
    """The covering sample reaches every knob value, not the schedules whose register fit is
    furthest over the block's budget, where ptxas must squeeze hardest: the space took a
    fit 8 over (REGISTER_HEADROOM was 8) that spilled 8 bytes on sm_80 and sm_90 (layer norm
    64x8192, 1024 threads, 2 blocks a row fused, vector 4). Here, per workload and arch, the
    three distinct kernels of the largest fit over budget are compiled."""
    spills = []
    for arch, gpu_key in ARCHS.items():
        gpu = get_gpu(gpu_key, calibrated=False)
        kernels = {}
        for w in NEAREST_BUDGET_WORKLOADS:
            space = MemSpace.enumerate(w, gpu)
            over = space._occupancy[0] - space._occupancy[1]  # fit minus budget
            picked = 0
            for i in sorted(range(len(space)), key=lambda i: (-over[i], i)):
                kernel = generate(w, space[i])
                if kernel.name not in kernels:
                    kernels[kernel.name] = (w, space[i], kernel)
                    picked += 1
                if picked == 3:
                    break
        jobs = list(kernels.values())
        results = compile_many([k.code for _, _, k in jobs], arch, return_exceptions=True)
        for (w, s, _), r in zip(jobs, results, strict=True):
            assert not isinstance(r, CompileError), f"{arch} {w.label()} {s.id}: {r}"
            if r.spill_bytes or r.stack_bytes:
                spills.append(f"{arch} {w.label()} {s.id}: {r.spill_bytes} B spilled")
    assert not spills, "\n".join(spills)


# bfloat16 changes only the kernels' storage type and conversions (tests/test_memops_bfloat16.py):
# a smaller sample, every knob value of one workload per kernel kind (the tanh GELU its own).
BF16_WORKLOADS = {
    "reduce-sum": reduce(4096, 4096),
    "reduce-max": reduce(8, 65536, "max"),
    "softmax": softmax(4096, 768),
    "layernorm": layernorm(512, 8192),
    "rmsnorm": rmsnorm(512, 8192),
    "silu_mul": silu_mul(4096, 11008),
    "bias_gelu": bias_gelu(4096, 3072),
    "bias_gelu-tanh": bias_gelu(64, 30000, "tanh"),
}


def test_a_bfloat16_sample_of_every_kind_compiles_without_spills():
    """bf16's conversions are sm_80's (cvt.rn.bf16.f32, cvt.rn.bf16x2.f32; the widening is
    a shift, where cvt.f32.bf16 would need sm_90): every sampled kernel compiles for both
    archs, without spills or stack, within the block's register budget and the fit."""
    problems = []
    for arch, gpu_key in ARCHS.items():
        gpu = get_gpu(gpu_key, calibrated=False)
        jobs = []
        for kind, fp16 in BF16_WORKLOADS.items():
            workload = parse_mem_workload({**fp16.model_dump(), "dtype": "bfloat16"})
            space = MemSpace.enumerate(workload, gpu)
            rows = covering_sample(range(len(space)), lambda i, space=space: space[i], seed=1)
            jobs += [(kind, workload, space, i) for i in rows]
        kernels = [generate(w, space[i]) for _, w, space, i in jobs]
        assert all(k.name.endswith("_bf16") and "cvt.rn.bf16x2.f32" in k.code for k in kernels)
        results = compile_many([k.code for k in kernels], arch, return_exceptions=True)
        for (_, w, space, i), k, r in zip(jobs, kernels, results, strict=True):
            s, where = space[i], f"{arch} {w.label()} {space[i].id}"
            if isinstance(r, CompileError):
                problems.append(f"{where}: {r}")
            elif r.spill_bytes or r.stack_bytes:
                problems.append(f"{where}: {r.spill_bytes} B spilled, {r.stack_bytes} B stack")
            elif not 0 < r.registers <= int(register_budget(gpu, s.threads)):
                problems.append(f"{where}: {r.registers} registers over the budget")
            elif r.registers > int(space.registers[i]) + REGISTER_FIT_ERROR:
                problems.append(f"{where}: ptxas {r.registers}, fit {int(space.registers[i])}")
            elif set(parse_ptxas_report(r.log)) != set(k.entries):
                problems.append(f"{where}: entries {sorted(parse_ptxas_report(r.log))}")
        assert {kind for kind, *_ in jobs} == set(BF16_WORKLOADS)
    assert not problems, "\n".join(problems[:10])
