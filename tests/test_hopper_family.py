"""The Hopper warpgroup-MMA GEMM family (model/hopper/, workers/codegen/wgmma/family.py): its
workloads, its space against the wgmma kernel's own limits, its model against the probe's
measurements, and its runs as the runners take them."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_hopper_model import operator_rows
from pipetune.model.family import family_for_op, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.analytical import evaluate
from pipetune.model.hopper.space import (
    KNOB_NAMES,
    PER_TILE,
    PERSISTENT,
    STREAM_K,
    HopperSchedule,
    HopperSpace,
    schedule_problems,
    smem_bytes,
    static_grid,
)
from pipetune.model.hopper.workloads import as_hopper, parse_hopper_workload
from pipetune.model.workloads import WorkloadError, bmm, gemm, parse_workload
from pipetune.workers.codegen.wgmma import family as codegen
from pipetune.workers.codegen.wgmma.config import (
    config_problems,
    stream_k_buffers,
    tensor_map_specs,
)
from pipetune.workers.families import codegen_for

H100 = get_gpu("h100", calibrated=False)
FC2 = parse_hopper_workload({"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072})


def test_the_ops_belong_to_the_family_and_parse_as_the_tensor_core_shapes():
    w = parse_any_workload({"op": "hopper_bmm", "b": 12, "m": 1024, "n": 1024, "k": 64})
    assert family_for_op("hopper_bmm").name == "hopper_gemm"
    assert w.gemm_view() == bmm(12, 1024, 1024, 64).gemm_view()
    assert w.flops == bmm(12, 1024, 1024, 64).flops
    assert as_hopper(gemm(1024, 768, 3072)) == FC2
    assert w.workload_hash != bmm(12, 1024, 1024, 64).workload_hash  # another kernel's task


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"op": "hopper_gemm", "m": 64, "n": 60, "k": 64}, "n"),
        ({"op": "hopper_gemm", "m": 64, "n": 64, "k": 64, "b_layout": "kk"}, "b_layout"),
        ({"op": "hopper_bmm", "m": 64, "n": 64, "k": 64}, "b"),
        ({"op": "hopper_gemm", "m": 64, "n": 64, "k": 64, "dtype": "float32"}, "dtype"),
    ],
)
def test_a_bad_workload_names_its_field(data, field):
    with pytest.raises(WorkloadError) as err:
        parse_any_workload(data)
    assert err.value.field == field


def test_a_b_stored_n_by_k_is_a_hopper_gemm_of_its_own():
    """A PyTorch Linear weight (B stored N x K) runs on the wgmma kernels too: the K-major
    B variant, another task than the same shape with B stored K x N."""
    nk = as_hopper(parse_workload({"op": "gemm", "m": 64, "n": 64, "k": 64, "b_layout": "nk"}))
    assert nk == parse_any_workload(
        {"op": "hopper_gemm", "m": 64, "n": 64, "k": 64, "b_layout": "nk"}
    )
    assert nk.label() == "hopper_gemm 64x64x64 nk"
    assert nk.workload_hash != as_hopper(gemm(64, 64, 64)).workload_hash
    assert codegen.generate(nk, HopperSchedule(64, 64, 6, 0)).variant == "gemm_nk"


def test_a_bmm_of_b_stored_n_by_k_runs_on_the_k_major_b_kernels():
    """Attention's Q·Kᵀ on the wgmma kernels: hopper_bmm with each B N x K, variant bmm_nk (B
    K-major in shared memory, wgmma's trans-b 0); a kn hopper_bmm keeps its hash."""
    nk = as_hopper(bmm(4, 256, 128, 64, b_layout="nk"))
    assert nk == parse_any_workload(
        {"op": "hopper_bmm", "b": 4, "m": 256, "n": 128, "k": 64, "b_layout": "nk"}
    )
    assert nk.label() == "hopper_bmm 4x256x128x64 nk"
    assert as_hopper(bmm(4, 256, 128, 64)).workload_hash == "232c73f51b2c8802"
    kernel = codegen.generate(nk, HopperSchedule(64, 64, 6, 0))
    assert kernel.variant == "bmm_nk" and "p, 1, 1, 0, 0;" in kernel.code


def test_a_gemm_with_bias_and_gelu_is_a_hopper_op_of_its_own():
    """FC1 with its bias and GELU on the wgmma kernels: the tensor-core gemm_bias_gelu's
    fields under an op of its own; its run takes the bias after C and the GELU form after K
    (before a persistent kernel's tile count), and its kernels are a generator line apart."""
    from pipetune.model.family import generator_revision_of
    from pipetune.model.workloads import gemm_bias_gelu

    fc1 = as_hopper(gemm_bias_gelu(1024, 3072, 768, b_layout="nk", approximate="tanh"))
    assert fc1 == parse_any_workload(
        {
            "op": "hopper_gemm_bias_gelu",
            **{"m": 1024, "n": 3072, "k": 768, "b_layout": "nk", "approximate": "tanh"},
        }
    )
    assert fc1.label() == "hopper_gemm_bias_gelu(tanh) 1024x3072x768 nk"
    assert family_for_op(fc1.op).name == "hopper_gemm"
    assert generator_revision_of(fc1).line == "hopper_gemm.bias_gelu"
    kernel = codegen.generate(fc1, HopperSchedule(128, 128, 4, PERSISTENT))
    assert kernel.variant == "gemm_bias_gelu_nk"
    plan = codegen.launch_plan(kernel, fc1, sm_count=132)
    assert [b.name for b in plan.buffers] == ["A", "B", "bias", "C"]
    (run,) = plan.launches
    assert run.arguments[:9] == ("A", "B", "C", "bias", "M", "N", "K", "gelu_tanh", "tiles")
    assert run.scalars["gelu_tanh"] == 1
    with pytest.raises(WorkloadError, match="approximate"):
        parse_any_workload(
            {"op": "hopper_gemm_bias_gelu", "m": 64, "n": 64, "k": 64, "approximate": "fast"}
        )


def test_a_gemm_with_its_swiglu_is_a_hopper_op_of_its_own():
    """LLaMA's gate and up projections with the SwiGLU on the wgmma kernels: the tensor-core
    gemm_swiglu's fields (B's 2n columns interleaved) under an op of its own; its kernel is the
    GEMM of 2n columns, C n wide, and a generator line apart."""
    from pipetune.model.family import generator_revision_of
    from pipetune.model.workloads import gemm_swiglu

    mlp = as_hopper(gemm_swiglu(2048, 11008, 4096, b_layout="nk"))
    assert mlp.op == "hopper_gemm_swiglu" and mlp.label() == "hopper_gemm_swiglu 2048x11008x4096 nk"
    assert generator_revision_of(mlp).line == "hopper_gemm.swiglu"
    kernel = codegen.generate(mlp, HopperSchedule(128, 256, 3, PER_TILE))
    assert kernel.variant == "gemm_swiglu_nk"
    plan = codegen.launch_plan(kernel, mlp, sm_count=132)
    shapes = {b.name: b.shape for b in plan.buffers}
    assert shapes == {"A": (2048, 4096), "B": (22016, 4096), "C": (2048, 11008)}
    (run,) = plan.launches
    assert run.scalars == {"M": 2048, "N": 22016, "K": 4096}  # the GEMM's N: both projections
    assert plan.tensor_maps[1].dims == (4096, 22016, 1)
    assert any("interleaved in groups of 8" in note for note in codegen.shape_notes(kernel, mlp))


def _config(values):
    return codegen.config_of(HopperSchedule(*values))


def test_shared_memory_is_the_kernels_own_on_every_knob_combination():
    grid = static_grid()
    model = smem_bytes(grid)
    for i in range(len(model)):
        values = [int(grid[k][i]) for k in KNOB_NAMES]
        try:
            kernel = _config(values).smem_bytes
        except ValueError:  # over the kernel's own limit: the space must say so too
            assert model[i] > H100.smem_per_block_bytes
            continue
        assert model[i] == kernel, values


def test_every_schedule_of_a_space_is_a_kernel_the_generator_builds():
    space = HopperSpace.enumerate(FC2, H100)
    assert len(space) > 50
    for schedule in space:
        assert config_problems(codegen.config_of(schedule)) == []
    ids = set(space.ids)
    assert "wg128x256s3_p" in ids and "wg128x128s4_sk" in ids and "wg64x64s6" in ids


def test_the_rules_keep_out_what_cannot_run():
    big = HopperSchedule(256, 256, 3, PER_TILE)  # 512 threads x 160 registers
    assert any("registers" in p for p in schedule_problems(big, FC2, H100))
    deep = HopperSchedule(128, 256, 5, PERSISTENT)
    assert any("shared memory" in p for p in schedule_problems(deep, FC2, H100))
    narrow = parse_hopper_workload({"op": "hopper_gemm", "m": 1024, "n": 64, "k": 2048})
    wide = HopperSchedule(64, 128, 4, PER_TILE)
    assert schedule_problems(wide, narrow, H100) == ["tile wider than the product"]
    a100 = get_gpu("a100", calibrated=False)
    assert len(HopperSpace.enumerate(FC2, a100)) == 0
    assert any("Hopper" in p for p in schedule_problems(HopperSchedule(64, 64, 6, 0), FC2, a100))


def test_the_model_prefers_the_tile_loops_where_they_pay():
    space = HopperSpace.enumerate(FC2, H100)
    prediction = evaluate(space)
    t = dict(zip(space.ids, prediction.T_kernel.tolist(), strict=True))
    steps = dict(zip(space.ids, prediction.steps_per_sm.tolist(), strict=True))
    # 48 tiles of 128 x 128 on 132 SMs, 48 K steps each: stream-K spreads them over every SM
    # (whether that wins over its partial sums is for the measurements to say).
    assert steps["wg128x128s4"] == 48 and steps["wg128x128s4_sk"] == 18
    # A ring too shallow for the latency leaves the tensor cores waiting.
    assert t["wg64x64s3_p"] > t["wg64x64s6_p"]
    qk = parse_hopper_workload({"op": "hopper_bmm", "b": 12, "m": 1024, "n": 1024, "k": 64})
    space = HopperSpace.enumerate(qk, H100)
    t = dict(zip(space.ids, evaluate(space).T_kernel.tolist(), strict=True))
    # One K step per tile: a block per tile pays its first load and its C store every tile.
    assert t["wg128x256s3_p"] < t["wg128x256s3"]


@pytest.mark.parametrize(("gpu", "floor"), [("h100", 0.7), ("h200", 0.75)])
def test_the_model_ranks_the_probes_measured_shapes(gpu, floor):
    rows = operator_rows(gpu)
    assert len(rows) >= 15 and all(shapes >= 10 for _, shapes, _, _ in rows)
    assert np.mean([rho for _, _, rho, _ in rows]) >= floor, rows


def test_the_family_names_this_generator():
    assert codegen_for("hopper_gemm") is codegen


def test_a_stream_k_run_plans_maps_workspace_and_counters():
    schedule = HopperSchedule(128, 128, 4, STREAM_K)
    kernel = codegen.generate(FC2, schedule)
    assert kernel.arch_suffix == "a" and kernel.variant == "gemm_kn"
    plan = codegen.launch_plan(kernel, FC2, sm_count=132)
    (launch,) = plan.launches
    tiles = 8 * 6
    assert launch.grid == (132, 1, 1)  # min(48 tiles x 48 K steps, SMs)
    assert launch.arguments == (
        "A", "B", "C", "M", "N", "K", "tiles", "tmap_a", "tmap_b", "W", "arrivals",
    )  # fmt: skip
    assert launch.scalars == {"M": 1024, "N": 768, "K": 3072, "tiles": tiles}
    floats, counters = stream_k_buffers(kernel.config, 132, tiles)
    assert plan.buffer("W").shape == (floats,) and plan.buffer("arrivals").shape == (counters,)
    assert {b.role for b in plan.buffers if b.name in ("W", "arrivals")} == {"workspace"}
    maps = plan.tensor_maps
    assert maps == tensor_map_specs(1024, 768, 3072, 1, kernel.config)
    assert [(m.name, m.operand) for m in maps] == [("tmap_a", "A"), ("tmap_b", "B")]
    assert codegen.grid_depends_on_occupancy(kernel)
    assert codegen.launch_plan(kernel, FC2, sm_count=114).launches[0].grid == (114, 1, 1)


def test_a_block_per_tile_run_covers_the_tiles_and_the_batch():
    w = parse_hopper_workload({"op": "hopper_bmm", "b": 12, "m": 1024, "n": 1024, "k": 64})
    kernel = codegen.generate(w, HopperSchedule(128, 256, 4, PER_TILE))
    plan = codegen.launch_plan(kernel, w, sm_count=132)
    (launch,) = plan.launches
    assert kernel.variant == "bmm"
    assert launch.grid == (8 * 4, 1, 12)
    assert launch.arguments == ("A", "B", "C", "M", "N", "K", "tmap_a", "tmap_b")
    assert [b.name for b in plan.buffers] == ["A", "B", "C"]
    assert not codegen.grid_depends_on_occupancy(kernel)


def test_the_sample_covers_every_knob_value_of_the_space():
    space = HopperSpace.enumerate(FC2, H100)
    sample = codegen.stratified_sample(space, 12, seed=3)
    assert len(sample) == 12 and len(set(sample)) == 12
    for name in KNOB_NAMES:
        assert {getattr(s, name) for s in sample} == set(space.knobs[name].tolist())
    tails = codegen.tails(FC2, HopperSchedule(192, 256, 3, 1))
    assert tails == {"m": True, "n": False, "k": False}


def test_the_stream_k_shapes_build_without_spills_within_one_blocks_registers():
    """The stream-K kernels need the most registers (their summing pass): ptxas must fit each
    into what one block per SM leaves, without spilling, or the space's register rule is
    wrong (NVRTC, sm_90a; no GPU needed)."""
    from pipetune.workers.compile import compile_many

    w = parse_hopper_workload({"op": "hopper_gemm", "m": 4096, "n": 4096, "k": 4096})
    space = HopperSpace.enumerate(w, H100)
    schedules = [s for s in space if s.tile_loop == STREAM_K]
    assert len(schedules) > 30
    kernels = [codegen.generate(w, s) for s in schedules]
    for kernel, built in zip(kernels, compile_many(kernels, "sm_90a"), strict=True):
        assert built.spill_bytes == 0, kernel.name
        assert built.registers * kernel.threads <= H100.registers_per_sm, kernel.name


@pytest.mark.parametrize("op", ["hopper_gemm_bias_gelu", "hopper_gemm_swiglu"])
def test_the_widest_stream_k_shapes_build_without_spills_with_a_fused_epilogue(op):
    """A fused epilogue (bias + GELU, SwiGLU) adds its work to the stream-K kernels' summing
    pass: the widest tiles (the most accumulators) must still fit without spilling."""
    from pipetune.workers.compile import compile_many

    w = parse_any_workload({"op": op, "m": 4096, "n": 4096, "k": 4096})
    space = HopperSpace.enumerate(w, H100)
    schedules = [s for s in space if s.tile_loop == STREAM_K and s.tile_n >= 192]
    assert len(schedules) >= 8
    kernels = [codegen.generate(w, s) for s in schedules]
    assert all(k.variant == f"{op.removeprefix('hopper_')}_kn" for k in kernels)
    for kernel, built in zip(kernels, compile_many(kernels, "sm_90a"), strict=True):
        assert built.spill_bytes == 0, kernel.name
        assert built.registers * kernel.threads <= H100.registers_per_sm, kernel.name


def test_the_probe_is_ranked_with_the_shipped_profile_not_the_users(
    users_own_h200, tmp_path, monkeypatch
):
    # The probe measured the campaign's H200, whose calibration is the shipped profile; with
    # get_gpu's own (the user's folder first), a profile of another device in that folder
    # turned MM_Square_1k's Spearman from 0.78 to NaN and its top-1 from 0.86 to 0.70.
    from pipetune.model.hardware import USER_PROFILE_DIR_ENV

    with_users_profile = operator_rows("h200")
    monkeypatch.setenv(USER_PROFILE_DIR_ENV, str(tmp_path / "none"))
    assert with_users_profile == operator_rows("h200")
