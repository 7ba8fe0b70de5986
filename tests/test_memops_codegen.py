"""The memory-intensive kernels' sources and launch plans (no compiler needed)."""

from __future__ import annotations

import re

import pytest

from pipetune.model.memops.space import (
    CACHE_REGISTERS,
    CACHE_SMEM,
    MemSchedule,
    MemSpace,
    geometry,
    workspace_bytes,
)
from pipetune.model.memops.workloads import bias_gelu, layernorm, reduce, softmax
from pipetune.model.space import ScheduleError
from pipetune.workers.codegen.memops import generate, launch_plan, shape_notes, variant_of


def test_one_entry_or_two_for_two_pass_splitting():
    w = softmax(8, 65536)
    assert generate(w, MemSchedule(256, 1, 1, 8, 0, 0, 0)).entries == (
        "pipetune_mem_softmax_m_256_1_1_8_0_0_0",
    )
    two = generate(w, MemSchedule(256, 1, 16, 8, 0, 0, 0))
    assert two.entries == (two.name, two.name + "_out")
    assert len(generate(w, MemSchedule(256, 1, 16, 8, 2, 1, 1)).entries) == 1
    # An element-wise chain splits columns but never joins them.
    assert len(generate(bias_gelu(8, 65536), MemSchedule(256, 1, 16, 8, 0, 0, 0)).entries) == 1


def test_register_cache_size_is_part_of_the_variant():
    w = softmax(4096, 768)
    assert variant_of(w, MemSchedule(32, 1, 1, 8, 2, 0, 0)) == ("softmax-r3", 3)
    assert variant_of(w, MemSchedule(32, 1, 1, 8, 0, 0, 0)) == ("softmax", 1)
    assert variant_of(bias_gelu(8, 64, "tanh"), MemSchedule(8, 4, 1, 8, 0, 0, 0))[0] == (
        "bias_gelu-tanh"
    )
    a = generate(w, MemSchedule(32, 1, 1, 8, 2, 0, 0))
    b = generate(softmax(4096, 1024), MemSchedule(32, 1, 1, 8, 2, 0, 0))
    assert a.name != b.name and "REG_VECS = 3;" in a.code and "REG_VECS = 4;" in b.code


def test_a_knob_outside_its_domain_does_not_generate():
    with pytest.raises(ScheduleError):
        generate(softmax(8, 64), MemSchedule(3, 1, 1, 8, 0, 0, 0))


def test_launch_plan_of_a_fused_split_layernorm():
    w = layernorm(100, 4096, 1e-12)
    k = generate(w, MemSchedule(64, 1, 8, 8, 1, 1, 1))
    plan = launch_plan(k, w, sm_count=4, blocks_per_sm=8)
    assert [b.name for b in plan.buffers] == ["x", "gamma", "beta", "y", "ws"]
    assert plan.buffer("ws").role == "workspace" and plan.buffer("y").shape == (100, 4096)
    (launch,) = plan.launches
    assert launch.grid == (32, 1, 1)  # 4 whole rows of 8 blocks in a wave of 32
    assert launch.block == (64, 1, 1)
    # two warp slots, the broadcast slot, the row cache (a segment: 64 vectors of 8 halves)
    assert launch.smem_bytes == 2 * 16 + 16 + 64 * 8 * 2
    assert launch.arguments == (
        "x", "gamma", "beta", "y", "ws", "rows", "cols", "eps", "scale", "queries"
    )  # fmt: skip
    # (softmax's scale and mask length: a layer norm passes the plain softmax's, unread)
    assert launch.scalars == {"rows": 100, "cols": 4096, "eps": 1e-12, "scale": 1.0, "queries": 0}
    parameters = [kind for _, kind in launch.parameters()][-5:]
    assert parameters == ["int32", "int32", "float32", "float32", "int32"]
    assert plan.as_dict()["launches"][0]["kernel"] == k.name
    with pytest.raises(ValueError, match="one wave"):
        launch_plan(k, w, sm_count=1, blocks_per_sm=4)


def test_launch_plan_of_a_two_pass_reduce():
    w = reduce(1000, 4096, "max")
    k = generate(w, MemSchedule(128, 1, 4, 8, 0, 0, 0))
    plan = launch_plan(k, w, sm_count=132, blocks_per_sm=16)
    first, second = plan.launches
    assert first.grid == (4000, 1, 1) and second.grid == (8, 1, 1)
    assert plan.buffer("y").shape == (1000,)
    assert plan.buffer("ws").nbytes == 1000 * (4 * 3 * 4 + 8)
    with pytest.raises(ValueError, match="needs"):
        launch_plan(k, softmax(1000, 4096), 132, 16)


def test_every_valid_schedule_generates(h100):
    for w in (softmax(37, 200), layernorm(5, 1032), reduce(3, 4200), bias_gelu(70, 16)):
        space = MemSpace.enumerate(w, h100)
        for s in list(space)[:: max(1, len(space) // 25)]:
            k = generate(w, s)
            assert k.threads == s.threads and 'extern "C" __global__' in k.code
            plan = launch_plan(k, w, h100.sm_count, 1)
            assert all(launch.grid[0] >= 1 for launch in plan.launches)


def _reshaped(workload, **shape):
    """The same operator on another shape (validated as any workload)."""
    return type(workload)(**{**workload.model_dump(), **shape})


def _number_after(text: str, words: str) -> int:
    match = re.search(re.escape(words) + r" (\d+)", text)
    assert match, (words, text)
    return int(match.group(1))


@pytest.mark.parametrize(
    "workload", [softmax(4, 256), layernorm(37, 1032), softmax(6, 32768)], ids=lambda w: w.label()
)
def test_shape_notes_state_the_bounds_the_kernel_checks(workload, h100):
    """The column bound a register-cached kernel's launch document states is the longest row
    it holds (REG_VECS vectors a thread: row_fits), a shared-memory cache states its bytes
    per column, and a split's workspace its bytes per row, for every valid schedule."""
    space = MemSpace.enumerate(workload, h100)
    seen = set()
    for i in range(len(space)):
        s = space[i]
        kernel = generate(workload, s)
        notes = " ".join(shape_notes(kernel, workload))
        per_segment = s.vector_width * s.blocks_per_row
        if s.row_cache == CACHE_REGISTERS:
            longest = _number_after(notes, "rows of at most")
            assert longest % per_segment == 0 and longest >= workload.cols
            # Exactly as many vectors a thread at the bound, more past it.
            fits = _reshaped(workload, cols=longest)
            assert variant_of(fits, s)[1] == kernel.reg_vecs
            past = _reshaped(workload, cols=longest + 8 * per_segment)  # whole vectors
            assert variant_of(past, s)[1] > kernel.reg_vecs
            seen.add("registers")
        elif s.row_cache == CACHE_SMEM:
            wider = _reshaped(workload, cols=2 * workload.cols)
            needed = int(geometry(s.knob_arrays(), wider).smem_bytes.reshape(-1)[0])
            segment = -(-2 * workload.cols // per_segment)
            stated = kernel.scratch_bytes + s.rows_per_block * segment * s.vector_width * 2
            assert (
                f"{kernel.scratch_bytes} + {s.rows_per_block} x ceil(cols / {per_segment})" in notes
            )
            assert stated == needed
            seen.add("smem")
        if "ws holds" in notes:
            per_row = _number_after(notes, "more rows need rows x")
            more = _reshaped(workload, rows=3 * workload.rows)
            assert workspace_bytes(s.knob_arrays(), more)[()] == 3 * workload.rows * per_row
            seen.add("ws")
    assert {"registers", "smem"} <= seen


def test_a_causal_kernel_s_notes_say_its_mask_is_an_argument(h100):
    causal = softmax(64, 1024, 0.125, causal=True, queries=8)
    schedule = MemSpace.enumerate(causal, h100)[0]
    notes = " ".join(shape_notes(generate(causal, schedule), causal))
    assert "queries: the causal mask's query length" in notes and "traps on 0" in notes
    plain = softmax(64, 1024, 0.125)
    assert "queries" not in " ".join(shape_notes(generate(plain, schedule), plain))
