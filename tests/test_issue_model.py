"""The K step's instruction counts (model/issue.py) against the SASS of the generated kernels
(NVRTC and nvdisasm, no GPU), and the analytical model's issue floor (reading 8)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.sass_loop import main_loop_counts, sample_step_counts
from pipetune.model.analytical import ISSUE_OVERLAP_EXPONENT, evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.issue import operand_kind, step_instructions
from pipetune.model.space import Schedule, Space
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm

WORKLOADS = {
    "gemm": gemm(1024, 3072, 768),
    "bmm": bmm(12, 512, 64, 512),
    "conv2d": conv2d(32, 14, 14, 256, 256, 3, 3, 1, 1),
    "conv3d": conv3d(8, 4, 14, 14, 256, 256, 3, 3, 3, 1, 1),
}


def test_counts_follow_the_schedule():
    # 2x2 warps of 64x64 tiles, BK = 32: per warp and K step, 4 x 8 m16n8k16 MMAs per k16
    # slice, 4 + 4 ldmatrix.x4 per slice, and the 128x32 A and B tiles in 16-byte copies over
    # 128 threads (4 each); one part of the next tile's copies (two slices, the last commits).
    h100 = get_gpu("h100")
    schedule = Schedule(2, 2, 4, 4, 2, 4, 2)
    gemm_space = Space.enumerate(WORKLOADS["gemm"], h100)
    counts = step_instructions(gemm_space)
    i = gemm_space.index(schedule)
    assert counts.mma[i] == 64 and counts.ldmatrix[i] == 16
    assert counts.a_copies[i] == 4 and counts.b_copies[i] == 4 and counts.copy_parts[i] == 1
    # The same loop of a convolution gathers A (im2col): more integer work per copy and part.
    conv_space = Space.enumerate(WORKLOADS["conv3d"], h100)
    conv = step_instructions(conv_space)
    j = conv_space.index(schedule)
    assert conv.mma[j] == counts.mma[i] and conv.integer[j] > 2 * counts.integer[i]


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_counts_against_the_generated_sass(kind):
    # A stratified sample of the space compiled for sm_90: the loop holds a whole number of
    # K steps' MMAs (one stage's loop is unrolled twice), the ldmatrix and copy counts per
    # step are exact, and the total within a quarter for most kernels (the integer work is a
    # fit of the compiler's output, benchmarks/bench_sass.py).
    workload = WORKLOADS[kind]
    space = Space.enumerate(workload, get_gpu("h100", calibrated=False))
    model = step_instructions(space)
    total = model.total
    errors = []
    for i, schedule, sass in sample_step_counts(space, 8, seed=5):
        assert sass.mma == model.mma[i], schedule
        assert sass.ldmatrix == model.ldmatrix[i], schedule
        assert sass.copies == model.a_copies[i] + model.b_copies[i], schedule
        errors.append(abs(total[i] - sass.total) / sass.total)
    assert np.median(errors) < 0.25, errors
    assert operand_kind(workload) == ("gemm" if kind == "bmm" else kind)


def test_the_fragments_copy_between_register_buffers_is_counted():
    # BK 16 with two register stages: every step copies the next fragments from the second
    # buffer into the first (`copy_frags_1_to_0`); its instructions are the difference between
    # the SASS of the two- and one-register-stage loops, schedule for schedule (reading 15).
    from benchmarks.sass_loop import disassemble
    from pipetune.workers.codegen.generator import generate
    from pipetune.workers.compile import compile_many

    workload = WORKLOADS["gemm"]
    space = Space.enumerate(workload, get_gpu("h100", calibrated=False))
    model = step_instructions(space)
    tiles = ((2, 2), (4, 4), (4, 2))
    pairs = [(Schedule(2, 2, r, c, 1, 3, 1), Schedule(2, 2, r, c, 1, 3, 2)) for r, c in tiles]
    kernels = compile_many([generate(workload, s) for pair in pairs for s in pair], "sm_90")
    for k, (one, two) in enumerate(pairs):
        i, j = space.index(one), space.index(two)
        sass_one = main_loop_counts(disassemble(kernels[2 * k].cubin)).total
        sass_two = main_loop_counts(disassemble(kernels[2 * k + 1].cubin)).total
        assert model.fragment_copies[i] == 0
        assert model.fragment_copies[j] == pytest.approx(sass_two - sass_one, abs=1.5), two
        assert model.total[j] - model.total[i] == model.fragment_copies[j]
    # Wider K steps fill the second buffer a slice ahead: no copy.
    wide = (space.block_k > 16) & (space.knobs["reg_stages"] == 2)
    assert wide.any() and (model.fragment_copies[wide] == 0).all()


def test_a_k_step_lasts_at_least_its_issue():
    h100 = get_gpu("h100")
    space = Space.enumerate(WORKLOADS["conv3d"], h100)
    p = evaluate(space)
    assert np.all(p.T_smem_use >= p.T_issue * (1 - 1e-12))
    issue_bound = p.T_issue >= p.T_smem_use
    assert issue_bound.any()
    # Where issue-bound, the use step is the block's MMAs on the tensor pipe plus its other
    # instructions at the SM's issue rate on the sub-partitions its resident warps occupy:
    # for a lone warp on its sub-partition the two add, they do not overlap (reading 13;
    # reading 8 took the longer of the two); with w warps on each, the excess of the sum over
    # reading 8's floor counts 1 / w**ISSUE_OVERLAP_EXPONENT (reading 17).
    counts = step_instructions(space)
    n_reg_loop = space.block_k / 16
    per_scheduler = np.maximum(
        space.warps * p.N_threadblk_per_SM / h100.warps_to_saturate_tensor, 1.0
    )
    lone_seen = shared_seen = False
    for i in np.flatnonzero(issue_bound)[:: max(1, int(issue_bound.sum()) // 50)]:
        mma_time = n_reg_loop[i] * space.warps[i] * p.T_compute[i]
        issue = space.warps[i] / (h100.issue_rate_per_sm * p.Util[i])
        added = mma_time + (counts.total[i] - counts.mma[i]) * issue
        floor = max(mma_time, counts.total[i] * issue)
        expected = floor + (added - floor) / per_scheduler[i] ** ISSUE_OVERLAP_EXPONENT
        assert p.T_smem_use[i] == pytest.approx(expected)
        assert p.terms(int(i))["issue_bound"] is True
        lone_seen |= per_scheduler[i] == 1.0
        shared_seen |= per_scheduler[i] > 1.0
        if per_scheduler[i] == 1.0:
            assert p.T_smem_use[i] == pytest.approx(added)
    assert lone_seen and shared_seen
    # The floor is never below the MMAs' own time, nor below the old overlapped one (the
    # longer of the MMAs and the whole instruction stream), on any schedule.
    mma_time = n_reg_loop * space.warps * p.T_compute
    overlapped = np.maximum(
        mma_time, counts.total * space.warps / (h100.issue_rate_per_sm * p.Util)
    )
    assert np.all(p.T_issue >= overlapped * (1 - 1e-12))
    # A narrow-tiled convolution spends most of its step outside the MMAs (many copies and
    # gathers per mma: about six times their time); the widest GEMM warp tiles spend most
    # of theirs in them (the rest about half their time).
    narrow = (space.knobs["warp_row_tiles"] == 1) & (space.knobs["warp_col_tiles"] == 1)
    assert np.median((p.T_issue - mma_time)[narrow] / mma_time[narrow]) > 2.0
    g = Space.enumerate(WORKLOADS["gemm"], h100)
    pg = evaluate(g)
    wide = (g.knobs["warp_row_tiles"] == 4) & (g.knobs["warp_col_tiles"] == 4)
    wide_mma = (g.block_k / 16 * g.warps * pg.T_compute)[wide]
    assert wide.any() and np.median((pg.T_issue[wide] - wide_mma) / wide_mma) < 1.0


SYNTHETIC_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IMAD R2, R3, R4, R5 ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R6], desc[UR4][R8.64] ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R6+0x10], desc[UR4][R8.64+0x10] ;
.L_x_1:
        /*0050*/                   LDSM.16.M88.4 R12, [R10] ;
        /*0060*/                   HMMA.16816.F32 R16, R12, R14, R16 ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/                   LDSM.16.M88.4 R12, [R10+0x200] ;
        /*0090*/                   HMMA.16816.F32 R20, R12, R14, R20 ;
        /*00a0*/              @P1 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
"""


def test_the_loop_is_read_from_labels_and_backward_branches():
    counts = main_loop_counts(SYNTHETIC_SASS)
    # 0x10-0xa0: ten instructions, the copy path branched around counted once.
    assert (counts.total, counts.mma, counts.ldmatrix, counts.copies) == (10, 2, 2, 2)
    assert counts.integer == 4  # IMAD, the two branches and the barrier
    assert counts.per_step(1) == type(counts)(5, 1, 1, 1)  # a loop unrolled twice
    with pytest.raises(ValueError):
        counts.per_step(3)  # not a whole number of steps


def test_the_benchmark_fit_recovers_the_integer_work():
    from benchmarks.bench_sass import fit
    from benchmarks.sass_loop import LoopCounts

    truth = np.array([30.0, 7.0, 1.0, 100.0, 5.0])
    rows = []
    for a, b, ldm, parts in [
        (4, 2, 8, 1),
        (8, 4, 16, 3),
        (2, 2, 4, 1),
        (16, 1, 32, 7),
        (1, 8, 6, 1),
    ]:
        integer = truth @ np.array([a, b, ldm, parts, 1.0])
        mma = 32
        total = round(float(integer)) + mma + ldm + a + b
        sass = LoopCounts(total=total, mma=mma, ldmatrix=ldm, copies=a + b)
        rows.append(
            {"a_copies": a, "b_copies": b, "ldmatrix": ldm, "copy_parts": parts, "sass": sass}
        )
    coef, error = fit(rows)
    assert coef == pytest.approx(truth, abs=1e-6)
    assert error == pytest.approx(0.0, abs=1e-9)
