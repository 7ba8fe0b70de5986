"""Table 1's pipeline latency model and the terms evaluate() builds from it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipetune.model.analytical import (
    evaluate,
    multistage_latency,
    one_stage_load,
    pipeline_latency,
)
from pipetune.model.space import Space
from pipetune.model.workloads import bmm, conv2d, gemm


def test_switches_to_load_bound_exactly_past_table1_threshold():
    # N_pipe=2, N_mplx=2: loads hide while T_load <= (2*2 - 1) * T_use = 3.
    t_load = np.array([2.0, 3.0, 3.0 + 1e-9, 5.0])
    loop, load_bound = pipeline_latency(t_load, 1.0, 10, 2, 2)
    assert load_bound.tolist() == [False, False, True, True]
    # use-bound: the two workers share the unit, 2 * 1 * 10
    assert loop[:2] == pytest.approx([20.0, 20.0])
    # load-bound: (T_load + T_use) * N_loop / N_pipe
    assert loop[3] == pytest.approx((5.0 + 1.0) * 10 / 2)


def test_the_two_cases_meet_at_the_switch_point():
    for n_pipe in (1, 2, 3, 6):
        for n_mplx in (1, 2, 4):
            threshold = (n_pipe * n_mplx - 1) * 0.7
            below, _ = pipeline_latency(threshold, 0.7, 8, n_pipe, n_mplx)
            above, bound = pipeline_latency(threshold * (1 + 1e-12) + 1e-15, 0.7, 8, n_pipe, n_mplx)
            assert bound
            assert above == pytest.approx(below, rel=1e-9)


def test_no_pipelining_and_one_worker_is_serial():
    loop, load_bound = pipeline_latency(3.0, 1.0, 5, 1, 1)
    assert load_bound
    assert loop == pytest.approx((3.0 + 1.0) * 5)


def test_more_stages_never_slow_a_load_bound_loop():
    stages = np.arange(1, 7)
    loop, _ = pipeline_latency(10.0, 1.0, 100, stages, 1)
    assert np.all(np.diff(loop) <= 0)
    assert loop[-1] < loop[0]


@pytest.mark.parametrize(
    "workload",
    [
        gemm(1024, 64, 2048),
        gemm(4096, 4096, 4096),
        bmm(12, 1024, 1024, 64),
        conv2d(64, 14, 14, 256, 256, 3, 3, pad=1),
    ],
)
def test_more_smem_stages_never_slow_the_main_loop_until_occupancy_drops(workload, h100):
    # From two stages on. A second stage against one is another loop (reading 9's one-stage
    # block contends only with the blocks loading with it; a multistage block always has a
    # copy in flight and waits out its latency's spread, reading 12), and the measurements
    # agree that it need not be faster: over the H100's and the H200's twin schedules it
    # measured 0.994 / 0.987 of the one-stage time in the median and more than 5% slower in
    # a fifth of the pairs (tests/test_measured_data.py compares them pair by pair).
    space = Space.enumerate(workload, h100)
    pred = evaluate(space)
    others = [k for k in space.knobs if k != "smem_stages"]
    groups: dict = {}
    for i in range(len(space)):
        key = tuple(int(space.knobs[k][i]) for k in others)
        groups.setdefault(key, []).append(i)
    compared = 0
    for members in groups.values():
        members.sort(key=lambda i: space.knobs["smem_stages"][i])
        for a, b in itertools.pairwise(members):
            if space.knobs["smem_stages"][a] < 2:
                continue
            if pred.N_threadblk_per_SM[a] != pred.N_threadblk_per_SM[b]:
                continue  # occupancy dropped: the model may rightly predict a slowdown
            compared += 1
            assert pred.T_main_loop[b] <= pred.T_main_loop[a] * (1 + 1e-12)
    assert compared > 100


def test_evaluate_reports_the_bottleneck_by_the_per_step_criterion(h100):
    space = Space.enumerate(gemm(2048, 2048, 2048), h100)
    p = evaluate(space)
    n_pipe = space.knobs["smem_stages"]
    n_mplx = p.N_threadblk_per_SM
    # Table 1's switch for one stage, on the load a one-stage block meets (reading 9); with
    # S >= 2 a load has S - 1 steps of N_mplx uses.
    latency = max(h100.dram_latency_ns, h100.l2_latency_ns) * 1e-9
    one_stage = one_stage_load(p.T_smem_load, latency, p.T_smem_use)
    expected = np.where(
        n_pipe >= 2,
        p.T_smem_load > (n_pipe - 1) * n_mplx * p.T_smem_use,
        one_stage > (n_pipe * n_mplx - 1) * p.T_smem_use,
    )
    assert np.array_equal(p.smem_load_bound, expected)
    assert p.smem_load_bound.any() and (~p.smem_load_bound).any()


def test_a_multistage_step_waits_for_a_load_issued_s_minus_1_steps_before():
    # Load-bound: each load has S-1 steps to land, so a step lasts T_load / (S-1); Table 1's
    # (T_load + T_use) / S is up to twice as fast at S = 2.
    loop, bound = multistage_latency(6.0, 1.0, 10, np.array([2, 3, 4]), 1)
    assert bound.all()
    assert loop == pytest.approx([6.0 * 10, 3.0 * 10, 2.0 * 10])
    table1, _ = pipeline_latency(6.0, 1.0, 10, 2, 1)
    assert table1 == pytest.approx((6.0 + 1.0) * 10 / 2)
    # Use-bound: the N_mplx workers share the unit, as in Table 1; one stage is Table 1's.
    assert multistage_latency(1.0, 1.0, 10, 3, 2)[0] == pytest.approx(2 * 1.0 * 10)
    for n_mplx in (1, 2):
        assert multistage_latency(3.0, 1.0, 5, 1, n_mplx)[0] == pytest.approx(
            pipeline_latency(3.0, 1.0, 5, 1, n_mplx)[0]
        )
    # The two cases meet at the switch, T_load = (S - 1) * N_mplx * T_use.
    for n_pipe, n_mplx in itertools.product((2, 3, 6), (1, 2, 4)):
        threshold = (n_pipe - 1) * n_mplx * 0.7
        below, _ = multistage_latency(threshold, 0.7, 8, n_pipe, n_mplx)
        above, bound = multistage_latency(threshold * (1 + 1e-12), 0.7, 8, n_pipe, n_mplx)
        assert bound and above == pytest.approx(below, rel=1e-9)


def test_a_multistage_load_waits_out_its_latency_s_spread_beyond_the_slack():
    # Reading 12: a load is latency (exponential about its mean, L) plus a steady stream; a
    # step lasts E[max(U, (stream + latency) / (S - 1))], U = N_mplx * T_use.
    rng = np.random.default_rng(12)
    L = 1.5
    for t_load, t_use, n_pipe, n_mplx in [(4.0, 1.0, 2, 2), (4.0, 1.0, 3, 1), (2.0, 3.0, 2, 1)]:
        loop, _ = multistage_latency(t_load, t_use, 10, n_pipe, n_mplx, L)
        draws = (t_load - L + rng.exponential(L, 400_000)) / (n_pipe - 1)
        expected = np.mean(np.maximum(n_mplx * t_use, draws)) * 10
        assert loop == pytest.approx(expected, rel=0.01)
    # Never faster than reading 4's figure (the loads at their mean), and that figure where
    # there is no latency, or where the stream alone fills the steps.
    for t_load, latency in [(0.5, 0.3), (2.0, 1.0), (6.0, 0.5), (3.0, 0.0)]:
        with_spread, _ = multistage_latency(t_load, 1.0, 10, np.array([2, 3, 6]), 2, latency)
        at_mean, _ = multistage_latency(t_load, 1.0, 10, np.array([2, 3, 6]), 2)
        assert (with_spread >= at_mean * (1 - 1e-12)).all()
        assert np.all(np.diff(with_spread) <= 1e-12)  # more stages: more slack, less wait
    assert multistage_latency(6.0, 1.0, 10, 2, 2, 0.5)[0] == pytest.approx(6.0 * 10)
    # Continuous where the slack runs out (the stream alone fills the S - 1 steps).
    stream = 2 * 1.0  # (S - 1) * N_mplx * T_use at S = 2, N_mplx = 2
    below = multistage_latency(stream + 0.7 - 1e-9, 1.0, 10, 2, 2, 0.7)[0]
    above = multistage_latency(stream + 0.7 + 1e-9, 1.0, 10, 2, 2, 0.7)[0]
    assert below == pytest.approx(above, rel=1e-6)


def test_a_multistage_load_leaves_as_the_step_issues_its_parts():
    # Reading 14: the generated loop issues the next tile's copies in P = N_reg_loop - 1 parts,
    # one in each of the step's first P k16 slices (workers/codegen/pipeline.py); the last
    # part leaves (P - 1) / N_reg_loop of the way through the step and streams its share of
    # the bytes from there. Simulated per step: the load lands at the latest of its parts'
    # departures plus their streams (one after another at the shared bandwidth), plus the
    # latency (exponential about L), and the step lasts until both its uses and S - 1 steps
    # for that load are done.
    rng = np.random.default_rng(14)
    L = 0.5
    later = 0
    for t_load, t_use, n_pipe, n_mplx, n_reg in [
        (0.8, 1.0, 2, 1, 4),  # a short stream: its last part leaves half-way through
        (0.9, 1.0, 3, 1, 8),
        (1.0, 0.5, 2, 2, 4),
        (4.0, 1.0, 2, 1, 4),  # the stream outlasts the slices that issue it: no change
    ]:
        use, stream, parts = n_mplx * t_use, t_load - L, n_reg - 1
        # The stream's end: each part starts at its slice or when the one before it ends.
        end = 0.0
        for j in range(parts):
            end = max(end, j / n_reg * use) + stream / parts
        draws = (end + rng.exponential(L, 400_000)) / (n_pipe - 1)
        expected = np.mean(np.maximum(use, draws)) * 10
        loop, _ = multistage_latency(t_load, t_use, 10, n_pipe, n_mplx, L, n_reg)
        assert loop == pytest.approx(expected, rel=0.01)
        # Later than copies issued all at the step's start, where the stream is shorter
        # than the slices that issue it.
        at_start, _ = multistage_latency(t_load, t_use, 10, n_pipe, n_mplx, L)
        if stream >= (parts - 1) / n_reg * use + stream / parts:
            assert loop == pytest.approx(at_start)
        else:
            assert loop > at_start
            later += 1
    assert later == 3
    # One or two slices: one part, at the step's start (readings 4 and 12).
    for n_reg in (1, 2):
        assert multistage_latency(2.5, 1.0, 10, 2, 1, L, n_reg)[0] == pytest.approx(
            multistage_latency(2.5, 1.0, 10, 2, 1, L)[0]
        )


def test_a_one_stage_load_streams_only_while_it_loads():
    # (T_load, T_latency, T_use): T_load streams T_load - T_latency of the wave's bytes.
    assert one_stage_load(5.0, 2.0, 0.0) == pytest.approx(5.0)  # no use: every block loads
    assert one_stage_load(2.0, 2.0, 3.0) == pytest.approx(2.0)  # nothing to stream
    assert one_stage_load(4.0, 0.0, 1.0) == pytest.approx(3.0)  # no latency: max(use, stream)
    assert one_stage_load(1.0, 0.0, 4.0) == pytest.approx(0.0)  # (the stream hides in uses)
    rng = np.random.default_rng(5)
    latency, stream, use = rng.uniform(0.01, 3.0, (3, 200))
    load = one_stage_load(latency + stream, latency, use)
    step = load + use
    # The share of its step a block spends loading is the share of the stream it meets.
    share = load / step
    np.testing.assert_allclose(load, latency + share * stream, rtol=1e-9)
    # Never more than Table 1's load, and the step never shorter than a load that always
    # streams the whole wave's bytes (the step of a block with a copy always in flight).
    assert (load <= latency + stream + 1e-12).all()
    assert (step >= latency + stream - 1e-12).all()


def test_the_first_tile_is_loaded_once_in_the_prologue(h100):
    # T_init loads tile 0; the loop loads the other N_loop - 1 and uses all N_loop. A loop of
    # one K step is then one use: no load inside it at all.
    space = Space.enumerate(gemm(1024, 1024, 64), h100)
    p = evaluate(space)
    one_step = p.N_smem_loop == 1
    assert one_step.any()
    use = p.N_threadblk_per_SM * p.T_smem_use + p.N_smem_loop * h100.k_step_s
    np.testing.assert_allclose(p.T_main_loop[one_step], use[one_step])
    assert (p.T_main_loop[~one_step] > use[~one_step]).all()


def test_kernel_is_full_waves_then_the_last_one(h100):
    # (The 1k GEMM has schedules of one wave, whose last wave is their only, full one.)
    for workload in (gemm(1024, 1024, 1024), gemm(4096, 4096, 4096)):
        space = Space.enumerate(workload, h100)
        p = evaluate(space)
        waves = p.N_threadblk_batch
        table = p.T_threadblk * (waves - 1) + p.T_threadblk_last
        # No faster than a lone block per SM (reading 11), which binds only on some one-wave
        # schedules.
        assert np.allclose(p.T_kernel, np.maximum(table, p.T_threadblk_lone))
        # The last wave holds the remainder, spread over the SMs (reading 7).
        capacity = h100.sm_count * space.blocks_per_sm
        remainder = space.tiles - (waves - 1) * capacity
        np.testing.assert_array_equal(
            p.N_threadblk_per_SM_last,
            np.minimum(space.blocks_per_sm, np.ceil(remainder / h100.sm_count)),
        )
        whole = remainder == np.minimum(space.tiles, capacity)
        np.testing.assert_array_equal(p.T_threadblk_last[whole], p.T_threadblk[whole])
        # A smaller last wave shares the bandwidth with fewer blocks: never slower per block,
        # and faster where it also puts fewer blocks on each SM.
        assert (p.T_threadblk_last <= p.T_threadblk).all()
        fewer = p.N_threadblk_per_SM_last < p.N_threadblk_per_SM
        # (Not every one: a block of one warp runs on its own sub-partition whether or not
        # another shares the SM, and the MMAs and the issue then take as long; reading 13. Nor
        # one whose k16 steps wait on their fragments longer than a co-resident block's MMAs
        # take: the other block's MMAs fill that wait, reading 16; 13 of 1,247 on the 4k GEMM.)
        assert (p.T_threadblk_last[fewer] < p.T_threadblk[fewer]).mean() > 0.98
        if workload.m == 1024:
            assert whole.any()
        else:
            assert fewer.any() and not whole.any()
    # Co-resident blocks overlap each other's prologue and epilogue (reading 6).
    exposed = (p.T_init + p.T_epilogue) / p.N_threadblk_per_SM
    assert np.allclose(p.T_threadblk, p.T_main_loop + exposed)
    one = p.N_threadblk_per_SM == 1  # one block per SM: Table 1's sum
    assert one.any() and (p.N_threadblk_per_SM > 1).any()
    assert np.allclose(p.T_threadblk[one], (p.T_init + p.T_main_loop + p.T_epilogue)[one])
    assert np.allclose(p.T_smem_load, np.maximum(p.T_LLC_load, p.T_DRAM_load))


def test_every_k_step_costs_its_fixed_cycles_outside_the_pipeline():
    from dataclasses import replace

    from pipetune.model.hardware import get_gpu

    gpu = get_gpu("h200", calibrated=False)
    space = Space.enumerate(gemm(1024, 1024, 1024), gpu)
    with_step = evaluate(space)
    without = evaluate(Space(space.workload, replace(gpu, k_step_cycles=0.0), space.knobs))
    extra = with_step.T_main_loop - without.T_main_loop
    np.testing.assert_allclose(extra, with_step.N_smem_loop * gpu.k_step_cycles / gpu.clock_hz)
    # A BK = 16 tile makes twice the K steps of the same tile at BK = 32, so pays twice.
    chunk = space.knobs["chunk"]
    assert extra[chunk == 1].min() == pytest.approx(2 * extra[chunk == 2].max())
