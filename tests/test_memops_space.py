"""The memory-intensive schedule space: knobs, ids, validity rules per GPU, features."""

from __future__ import annotations

import numpy as np
import pytest

from pipetune.model.family import full_grid
from pipetune.model.memops.space import (
    KNOB_NAMES,
    KNOBS,
    REG_CACHE_VECTORS,
    MemSchedule,
    MemSpace,
    geometry,
    grid_blocks,
    invalid_reasons,
    register_budget,
    schedule_problems,
    workspace_bytes,
)
from pipetune.model.memops.workloads import bias_gelu, layernorm, reduce, softmax
from pipetune.model.space import ScheduleError


def test_knobs_are_astitchs_mapping_decisions():
    assert KNOB_NAMES == (
        "threads_per_row",
        "rows_per_block",
        "blocks_per_row",
        "vector_width",
        "row_cache",
        "split_mode",
        "max_waves",
    )
    cats = {k.name: k for k in KNOBS if not k.ordered}
    assert set(cats) == {"row_cache", "split_mode", "max_waves"}
    assert cats["row_cache"].label(1) == "smem" and cats["max_waves"].label(0) == "unbounded"


def test_schedule_documents_are_checked_and_ids_are_stable():
    s = MemSchedule(32, 1, 4, 8, 2, 1, 1)
    assert s.id == "m-32-1-4-8-2-1-1"
    assert MemSchedule.from_dict(s.as_dict()) == s
    assert s.hash == MemSchedule.from_dict(dict(reversed(s.as_dict().items()))).hash
    bad = {**s.as_dict(), "vector_width": 3}
    with pytest.raises(ScheduleError, match="vector_width must be one of"):
        MemSchedule.from_dict(bad)
    with pytest.raises(ScheduleError, match="missing knob"):
        MemSchedule.from_dict({"threads_per_row": 32})
    with pytest.raises(ScheduleError, match="unknown knob"):
        MemSchedule.from_dict({**s.as_dict(), "chunk": 2})
    with pytest.raises(ScheduleError, match="must be one of"):
        MemSchedule.from_dict({**s.as_dict(), "row_cache": True})


def test_every_member_is_valid_and_every_id_unique(h100):
    for w in (softmax(4096, 768), layernorm(16, 65536), reduce(750000, 32), bias_gelu(64, 3072)):
        space = MemSpace.enumerate(w, h100)
        assert len(space) > 50
        assert len(set(space.ids)) == len(space)
        for i in np.random.default_rng(0).choice(len(space), 40, replace=False):
            assert schedule_problems(space[int(i)], w, h100) == []
            assert space.index(space[int(i)]) == int(i)


def _problems(w, gpu, **knobs):
    base = {"threads_per_row": 32, "rows_per_block": 1, "blocks_per_row": 1,
            "vector_width": 8, "row_cache": 0, "split_mode": 0, "max_waves": 0}  # fmt: skip
    return schedule_problems(MemSchedule(**{**base, **knobs}), w, gpu)


def test_each_validity_rule_catches_its_case(h100):
    w = softmax(4096, 768)  # 96 vectors of 8 per row
    assert _problems(w, h100) == []
    assert "threads per block over the limit" in _problems(
        w, h100, threads_per_row=64, rows_per_block=32, vector_width=1
    )
    assert "block smaller than a warp" in _problems(w, h100, threads_per_row=16)
    assert "threads of a row left without a vector" in _problems(w, h100, threads_per_row=128)
    assert "splitting takes one row per block" in _problems(
        w, h100, rows_per_block=2, blocks_per_row=2
    )
    # 96 vectors over 64 blocks: 2 per segment, the last 16 segments empty.
    assert "a split segment is empty" in _problems(
        w, h100, threads_per_row=1, rows_per_block=32, blocks_per_row=64
    )
    assert "row cache without a second pass" in _problems(reduce(4096, 768), h100, row_cache=1)
    assert "row cache without a second pass" in _problems(w, h100, blocks_per_row=2, row_cache=2)
    assert "register cache over its budget" in _problems(
        softmax(8, 65536), h100, threads_per_row=32, row_cache=2
    )
    assert "register cache of single halves" in _problems(w, h100, vector_width=1, row_cache=2)
    assert "shared memory per block over the limit" in _problems(
        softmax(16, 1 << 20), h100, threads_per_row=1024, row_cache=1
    )
    assert "split mode without a cross-block reduction" in _problems(w, h100, split_mode=1)
    assert "split mode without a cross-block reduction" in _problems(
        bias_gelu(4096, 768), h100, blocks_per_row=2, split_mode=1
    )
    assert "fused splitting needs the one-wave bound" in _problems(
        w, h100, blocks_per_row=2, split_mode=1
    )
    assert "wave bound above the grid" in _problems(w, h100, max_waves=4)
    assert _problems(w, h100, blocks_per_row=2, split_mode=1, max_waves=1) == []
    # A reduce's fused join (the last block finishes) needs no co-residency.
    assert _problems(reduce(4096, 768), h100, blocks_per_row=2, split_mode=1) == []


def test_register_budget_follows_the_block_size(h100, a100):
    assert register_budget(h100, 256) == 255
    assert register_budget(h100, 512) == 128
    assert register_budget(a100, 1024) == 64
    # Schedules whose fitted registers exceed the budget by more than the headroom are out.
    w = layernorm(512, 8192)
    rule = "registers per thread over the block's budget"
    over = invalid_reasons(full_grid(KNOBS), w, h100)[rule]
    assert over.any() and not over.all()


def test_geometry_of_a_packed_and_a_split_mapping():
    w = softmax(37, 200)  # 25 vectors of 8 per row
    g = geometry(MemSchedule(8, 4, 1, 8, 1, 0, 0).knob_arrays(), w)
    assert (int(g.seg_vecs[0]), int(g.vecs_per_thread[0]), int(g.groups[0])) == (25, 4, 10)
    assert int(g.cache_bytes[0]) == 4 * 25 * 8 * 2  # four rows' segments in shared memory
    g = geometry(MemSchedule(32, 1, 4, 1, 0, 0, 0).knob_arrays(), w)  # 200 vectors of 1
    assert (int(g.seg_vecs[0]), int(g.items[0]), int(g.launches[0])) == (50, 148, 2)


def test_grid_keeps_a_fused_row_inside_one_wave():
    w = softmax(100, 4096)
    s = MemSchedule(64, 1, 8, 8, 2, 1, 1)
    knobs = s.knob_arrays()
    g = geometry(knobs, w)
    # 30 resident blocks: 3 whole rows of 8 blocks at a time, never part of a row.
    assert int(grid_blocks(knobs, g, w.rows, 30)[0]) == 24
    assert int(grid_blocks(knobs, g, w.rows, 7)[0]) == 0  # no whole row fits: unlaunchable
    unbounded = MemSchedule(64, 1, 8, 8, 0, 0, 0).knob_arrays()
    assert int(grid_blocks(unbounded, geometry(unbounded, w), w.rows, 30)[0]) == 800
    bounded = MemSchedule(64, 1, 8, 8, 0, 0, 2).knob_arrays()
    assert int(grid_blocks(bounded, geometry(bounded, w), w.rows, 30)[0]) == 60


def test_workspace_only_for_split_reductions():
    w = softmax(100, 4096)
    assert int(workspace_bytes(MemSchedule(64, 1, 8, 8, 0, 0, 0).knob_arrays(), w)[0]) == (
        100 * (8 * 3 * 4 + 8)
    )
    assert int(workspace_bytes(MemSchedule(64, 1, 1, 8, 0, 0, 0).knob_arrays(), w)[0]) == 0
    gelu = bias_gelu(100, 4096)
    assert int(workspace_bytes(MemSchedule(64, 1, 8, 8, 0, 0, 0).knob_arrays(), gelu)[0]) == 0


def test_the_space_holds_packing_splitting_and_every_cache(h100):
    space = MemSpace.enumerate(softmax(4096, 768), h100)
    k = space.knobs
    assert (k["rows_per_block"] > 1).any() and (k["blocks_per_row"] > 1).any()
    assert set(k["row_cache"].tolist()) == {0, 1, 2}
    assert set(k["split_mode"].tolist()) == {0, 1}
    assert (space.knobs["row_cache"][space.geometry.vecs_per_thread > REG_CACHE_VECTORS] != 2).all()


def test_features_are_finite_and_named(h100):
    space = MemSpace.enumerate(layernorm(8192, 768), h100)
    x = space.features()
    assert x.shape == (len(space), len(space.feature_names))
    assert np.isfinite(x).all()
    assert space.work == layernorm(8192, 768).compulsory_bytes
    sub = space.subset(np.arange(10))
    assert len(sub) == 10 and sub.ids == space.ids[:10]
    assert space[3] in space and MemSchedule(1, 1, 1, 1, 0, 0, 0) not in space
