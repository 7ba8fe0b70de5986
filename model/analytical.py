"""ALCOP's analytical latency model (Table 1), evaluated over a whole space with numpy.

Every term keeps the paper's name. Times are in seconds. Two readings of Table 1 are made
explicit here because the table leaves them implicit:

1. Time frames. ``T_use`` passed to the pipeline latency model (PLM) is the *dedicated*
   time of one use step: the time it takes when the worker has the use unit to itself,
   at the utilisation that all resident workers together reach. The switch between the
   load-bound and use-bound cases is exactly Table 1's ``T_load <= (N_pipe·N_mplx − 1)·T_use``.
   In the use-bound case the N_mplx workers take turns on the unit, so one worker's loop
   takes ``N_mplx·T_use·N_loop`` of wall time (Table 1 writes ``T_use·N_loop`` with
   T_use as that worker's share); with this reading the two cases meet at the switch point
   and the model is continuous in every input.
2. Bandwidth. Pipelining hides latency, not bandwidth: a loop never runs faster than its
   loads can stream at the shared bandwidth, ``N_loop × (bytes moved per iteration ÷ BW)``.
   Without this floor deep pipelines would be predicted to beat the memory system.
3. The cost of a K step. Each main-loop iteration ends with a cp.async wait and a barrier
   that every warp of the block waits on; Table 1 has no term for them. They add
   ``N_smem_loop × k_step_cycles`` of clock to the loop, outside the pipeline model (no
   stage count hides a barrier). Without it the model prefers the shortest K chunk on
   nearly every operator, which measured 1.3-2.2x slower than the optimum on an H200.
4. When a shared-memory stage is refilled. Table 1's load-bound case, ``(T_load + T_use) ×
   N_loop / N_pipe``, lets a stage start loading the moment its use ends and its use start
   the moment its load lands. The kernels synchronise per K step instead (workers/codegen/
   pipeline.py, as CUTLASS's multistage loop): the copy of tile kt+S-1 is issued at the
   start of step kt and must have landed at the end of step kt+S-2 (``wait_group(S-2)`` and
   the barrier), so each load has S-1 whole steps, and a step lasts
   ``max(N_mplx·T_use, T_load / (S-1))`` with loads of their mean time (multistage_latency;
   reading 12 lets their latency vary). With two stages that is up to twice Table 1's figure,
   with six 1.2x; measured on the H100 and the H200, Table 1 predicted the two-stage
   schedules 12% too fast against the deeper ones. One stage (load, wait, barrier, use) is
   Table 1's own case and keeps its formula.
5. The first tile is loaded once. ``T_init`` is the load of tile 0 (the prologue), so the
   main loop pays for the loads of the other N_loop - 1 tiles, in steady state, and then
   for the use of the last one; Table 1 charges a load in every one of the N_loop steps on
   top of ``T_init``. The extra load is 1/N_loop of the loop: little on a long K loop, half
   of it at N_loop = 2, and it made the model rank large K chunks (one or two steps) below
   what they measured on the short-K operators of the H100 and H200 campaigns.
6. The blocks of a wave are not in lockstep. Table 1 times a wave as one block's init, main
   loop and epilogue, as if its N_threadblk_per_SM co-resident blocks waited on their first
   tile and wrote their output all at the same moments. They drift apart: while one block
   waits on memory in its prologue or epilogue (no tensor work), the others run their main
   loops, whose time already counts their sharing of the tensor unit (N_mplx·T_use). Evenly
   staggered, a block's prologue and epilogue stay exposed 1/N_mplx of the time:
   ``T_threadblk = T_main_loop + (T_init + T_epilogue) / N_threadblk_per_SM``. In lockstep
   (one block per SM) it is Table 1's sum. Measured on both Hopper GPUs, Table 1 predicted
   schedules with few warps per SM 0.6-0.8x of their time and those with many 1.3-1.7x,
   most on the short-K operators, where prologue and epilogue are most of the kernel.
7. The last wave holds the remainder. Table 1 charges ``N_threadblk_batch`` full waves. The
   last one holds only ``tiles - (N_threadblk_batch - 1) x N_SM x occupancy`` blocks, spread
   over the SMs, so ceil(remainder / N_SM) of them share an SM's tensor unit and the wave's
   loads share the bandwidth with fewer others: it is timed as a wave of that many blocks
   (``T_kernel = (N_threadblk_batch - 1) x T_threadblk + T_threadblk(last wave)``). With one
   block per SM, or a whole number of waves, nothing changes.
8. A K step issues its instructions. Table 1 times a use step by its MMAs alone. Each of an
   SM's warp schedulers issues one warp instruction per clock, and a K step of our kernels
   issues, beside its mma.sync instructions, its ldmatrix fragments, the next tile's cp.async
   copies and the integer work that forms their addresses (model/issue.py, counted in the
   generated kernels' SASS). Where those outnumber what the tensor pipe takes in the same
   time (on Hopper, about 6.6 clocks per m16n8k16 at the measured mma.sync efficiency), the
   step lasts as long as its issue: ``T_smem_use >= instructions x N_warp_per_threadblk /
   (issue rate of the SM x Util)``. The convolutions' gathered A operand costs about 40-50
   instructions per copy and about 55 per part of the next tile (the K index split into
   filter tap and channel; 110 while that split divided by the filter sizes), so their wide
   K steps are issue-bound: measured on both Hopper GPUs with the dividing loader, BK = 64
   and 128 ran 15-23% slower against BK = 32 than Table 1 predicted, and BK = 16 40-43%
   slower, where the GEMMs' errors were 3-5% (and 19% at BK = 16).
9. A one-stage block's load competes with the loads in flight, not with every block's.
   ``T_smem_load`` streams the whole wave's bytes at the shared bandwidth, as if every block
   loaded at once; so they do in a multistage loop, where each block always has a copy in
   flight. A one-stage block loads, waits, then uses its tile, and the blocks are not in
   step (reading 6): at any moment only the share of them in their load phase streams
   (one_stage_load). Measured on the H100 and the H200 over the schedules that differ only in
   one shared-memory stage against two, at equal occupancy (7,153 pairs each): the second
   stage gained almost nothing in the median (0.994 and 0.995 of the one-stage time), where
   Table 1 predicted 0.87 and 0.86 (now 0.93 and 0.92); the pairs' ratios are predicted with
   a median error of 0.10 and 0.11 (log) instead of 0.14 and 0.16, and ranked at a Spearman
   of 0.39 and 0.40 instead of 0.25 (tests/test_measured_data.py).
10. A block's warps load their register fragments together. With one register stage a
   warp's k16 step loads its fragments (ldmatrix), waits for them, then issues its MMAs.
   Table 1's register-level pipeline takes the block's warps as workers that hide each
   other's loads, but the barrier that closes each K step keeps them in step: they load at
   the same moment, and until the first fragments land (the shared-memory latency) none of
   them has an MMA to issue; from then on their MMAs overlap the rest of the loads. Other
   blocks on the SM are out of step with it (reading 6) and fill that wait, so a block
   exposes it 1/N_threadblk_per_SM of the time: ``T_smem_use`` gains ``N_reg_loop x
   smem latency / N_threadblk_per_SM`` where reg_stages = 1. A second register stage loads
   the next fragments under the MMAs and hides it. Measured on the H100 and the H200 over the
   schedules that differ only in the register stages (smem_stages >= 2, equal occupancy),
   lone blocks ran 0.918 and 0.916 of their one-stage time with two, and from five blocks
   per SM on about the same (0.99); the model predicted 1.000 for every pair, so its ten
   best-ranked schedules were mostly pairs of such twins, the slower one first. Now 0.922
   and 0.896 for lone blocks (tests/test_measured_data.py).
11. No block finishes sooner than it would alone on its SM. Readings 6 and 1 are rates of
   co-resident blocks: a share of each one's prologue and epilogue hides behind the others'
   main loops, and Util counts every resident warp, so a block's K step runs at the tensor
   and issue rate of the whole SM (a one-warp block issuing two instructions a clock). A
   wave that puts a second block on only some SMs got both at once, and a bigger problem was
   predicted faster than a smaller one (GEMM 1032x1024x1024 9% faster than 1024x1024x1024 on
   the H100, the first with 136 blocks of 64x128, the second with 128). Sharing an SM only
   slows a block, so the kernel lasts at least one block's life alone on its SM, in a wave of
   min(tiles, N_SM) blocks: ``T_kernel >= T_threadblk(lone)``. On the 23 ALCOP operators it
   binds only on one-wave schedules with two or more blocks on an SM (1,020 of 51,971 on the
   H100, 1,163 on the H200); over the committed campaigns it raised the model's top-1 from
   0.849 to 0.852 (H100) and 0.898 to 0.903 (H200) and its mean Spearman from 0.714 to 0.718
   and 0.738 to 0.742, and lowered no operator's top-10 (top-1 fell on two: BMM_BERT_QK on
   the H100, 0.935 to 0.868, and BMM_BERT_SV on the H200, 0.880 to 0.863).
12. A load's latency varies. A multistage load is its latency (the farther memory level's)
   plus its bytes streamed at the shared bandwidth, and reading 4 hides it whenever its mean
   fits in the S-1 steps it has: a step lasts ``max(U, T_load / (S-1))``, ``U =
   N_mplx·T_use``. The stream is steady, but the latency is a wait in the memory system's
   queues, which varies from load to load: taken as exponential about its mean (the sojourn
   of a single queue, M/M/1: no constant to fit), a load overruns the slack its S-1 steps
   leave it, ``(S-1)·U - stream``, by ``latency·exp(-slack / latency)`` on average, spread
   over those steps. Where the stream alone fills them the mean is reading 4's; with more
   stages the slack grows and the wait hides. Measured on the H100 and the H200 over twin
   schedules (equal but for the stages, at equal occupancy): two stages against three ran
   0.14 / 0.15 (log, median) slower, predicted 0.22 / 0.23 before and 0.23 / 0.24 now, the
   twins' median error 0.121 / 0.130 -> 0.110 / 0.111 and their rank correlation 0.51 /
   0.48 -> 0.56 / 0.52; one stage against two, 0.104 / 0.109 -> 0.087 / 0.086 (three against
   four: 0.018 -> 0.020 / 0.022, the one pairing it does not help). Over the measured spaces
   (the H200's 18 held-out GEMM and BMM shapes; the H200's and the H100's 15 ALCOP GEMM and
   BMM operators; the 16 convolutions of both) the model's top-1 rose from 0.890 / 0.901 /
   0.856 / 0.876 to 0.892 / 0.909 / 0.861 / 0.880, its top-10 from 0.935 / 0.952 / 0.938 /
   0.962 to 0.937 / 0.954 / 0.938 / 0.973, and its mean Spearman from 0.791 / 0.702 / 0.684
   / 0.800 to 0.803 / 0.716 / 0.696 / 0.804 (benchmarks/RESULTS.md, "a load's latency
   varies").
13. A K step's MMAs and its other instructions do not overlap. Reading 8 times a step as the
   longer of its MMAs on the tensor pipe and its instructions at the issue rate, as if a
   sub-partition issued its ldmatrix, cp.async and address work while its tensor core
   worked. Taken here (not measured directly): an m16n8k16 mma.sync holds the sub-
   partition's register-file read ports for its pipe interval (its A, B and C fragments, 10
   registers per lane, about 6.6 clocks at the measured efficiency), and every other
   instruction needs those ports for its operands: so the step lasts its MMAs' time plus
   the issue of the rest,
   ``T_issue = N_reg_loop x N_warp_per_threadblk x T_compute + (instructions - MMAs) x
   N_warp_per_threadblk / (issue rate of the SM x Util)``. Nothing is fitted: the MMAs' time
   is Table 1's T_compute, the rest reading 8's count. Measured on the H100 and the H200 the
   residual log(measured / predicted) rose with the ratio of a step's MMA time to its issue
   time, from -0.2 (mostly issue, narrow warp tiles) to +0.24 (mostly MMAs, 4x4 warp tiles),
   whatever the warps per scheduler, and grew 0.07-0.09 per doubling of the block tile
   (0.02-0.06 now). Over the measured spaces (shapes / h200 / h100 / conv) top-1 rose from
   0.892 / 0.909 / 0.861 / 0.880 to 0.916 / 0.912 / 0.897 / 0.937, top-10 from 0.937 / 0.954
   / 0.938 / 0.973 to 0.945 / 0.951 / 0.943 / 0.974, mean Spearman from 0.803 / 0.716 /
   0.696 / 0.804 to 0.833 / 0.748 / 0.727 / 0.848; the stage twins' median errors held or
   fell (1 vs 2: 0.087 / 0.086 -> 0.087 / 0.080; 2 vs 3: 0.110 / 0.111 -> 0.105 / 0.106),
   but their rank correlation fell (2 vs 3: 0.56 / 0.52 -> 0.47 / 0.46; H100 / H200): the
   longer step of the MMA-heavy schedules gives their loads more slack (reading 12), and the
   measured penalty of their second stage does not shrink with the step's length. Measured
   variants that kept the twins (the added time after the pipeline, or left out of the
   slack) lost part of the whole-space gain or other twins' ranking (benchmarks/RESULTS.md,
   "MMAs and the other instructions add up").
14. The next tile leaves part by part. Reading 4 issues a step's copies at its start. The
   generated loop (workers/codegen/pipeline.py, LOAD_PARTS) issues them in P = max(N_reg_loop
   - 1, 1) parts, one in each of the step's first P k16 slices, interleaved with the MMAs,
   so the last part leaves (P - 1) / N_reg_loop of the way through the step and its bytes
   stream from there: a load's stream ends at ``max(stream, (P - 1) / N_reg_loop x U +
   stream / P)`` (multistage_latency), and the S - 1 steps leave that much less slack.
   Nothing fitted. With a short stream, a load lands up to half a step later at BK 64 and
   three quarters at BK 128; at BK 16-32 (one part) nothing changes. Measured on the H100
   and the H200 over the stage twins: one against two stages, median error 0.087 / 0.080 ->
   0.078 / 0.070 and rank correlation 0.50 / 0.49 -> 0.53 / 0.52; two against three, 0.105 /
   0.106 -> 0.097 / 0.098 and 0.47 / 0.46 -> 0.51 / 0.50 (H100 / H200); whole spaces (shapes
   / h200 / h100 / conv) mean Spearman 0.833 / 0.748 / 0.727 / 0.848 -> 0.835 / 0.751 /
   0.730 / 0.848, top-1 and top-10 as before but for shapes' top-10 0.945 -> 0.946. The
   SASS also shows ptxas placing the step's cp.async wait above the last k16 slice's MMAs
   (above all of them with one register stage at BK 16-32); charging that wait as well
   raised mean Spearman by 0.013-0.022 on three groups but predicted two stages against
   three 0.25-0.31 slower from two blocks per SM up (measured 0.02-0.20: co-resident blocks
   fill the wait) and halved the one-against-two twins' rank correlation: not taken
   (benchmarks/RESULTS.md, "the next tile leaves part by part").
15. Two register stages wait like one where a K step is one k16 slice. Reading 10 lets a
   second register stage hide the fragments' shared-memory latency, loading a slice's
   fragments under the MMAs of the slice before. With BK 16 there is no slice before within
   the step: the generated loop (workers/codegen/pipeline.py) loads the next step's
   fragments after the step's wait and barrier, into the second buffer, and copies them
   into the first before the next step, a copy that waits for them as one stage's MMAs do;
   so reading 10's wait applies to both. Nothing fitted. Measured on the H100 and the H200
   over the register-stage twins at BK 16 (843 per GPU), the second stage ran 0.047 / 0.049
   (log, median) slower; the model had predicted it 0.024 / 0.034 faster, level with the
   wait (0.000; median error 0.090 / 0.113 -> 0.066 / 0.084), and 0.041 / 0.073 slower with
   the copy's own instructions counted in its issue (model/issue.py, 8 per fragment tile row
   and column, read in the SASS; median error 0.038 / 0.049). Over the measured spaces
   (shapes / h200 / h100 / conv) top-1 0.916 / 0.912 / 0.897 / 0.937 -> 0.920 / 0.923 /
   0.897 / 0.937, top-10 0.946 -> 0.954 on the shapes (the rest unchanged), mean Spearman
   0.835 / 0.751 / 0.730 / 0.848 -> 0.846 / 0.764 / 0.740 / 0.858.
16. Co-resident blocks fill the register level's wait too. Where Table 1's register-level
   pipeline is load-bound (one or few warps a block, one register stage: ``T_reg_load >
   (N_reg_pipe·N_warp − 1)·T_compute``), its step ``(T_reg_load + T_compute) x N_reg_loop /
   N_reg_pipe`` is the warps' tensor time ``N_reg_loop x N_warp x T_compute`` plus the
   fragments' latency, and the main loop multiplied all of it by the blocks on the SM
   (``N_threadblk_per_SM x T_smem_use``), as if a block's wait for its fragments kept the SM's
   tensor pipes from the others. The others are out of step with it (reading 6) and issue their
   MMAs meanwhile, as they fill reading 10's wait: the excess counts 1/N_threadblk_per_SM,
   ``T_smem_use = T_mma + (T_smem_use(Table 1) - T_mma) / N_threadblk_per_SM`` (``T_mma`` the
   tensor time). Nothing fitted. Measured over the register-stage twins with a shared-memory
   pipeline (smem_stages >= 2, equal occupancy), from five blocks per SM on a second register
   stage ran 0.012 / 0.012 (log, median; H100 / H200) faster; predicted 0.006 / 0.054 before,
   0.000 / 0.002 now (median error 0.031 / 0.057 -> 0.025 / 0.030); lone blocks unchanged
   (benchmarks/RESULTS.md, "co-resident blocks fill the register level's wait").
17. Warps sharing a sub-partition overlap their instructions. Reading 13 adds a K step's
   MMAs and its other instructions, as one warp alone on its sub-partition issues them in
   turn; reading 8 had taken the longer of the two, as if they overlapped fully. Measured
   over pairs of schedules with the same block tile, K step, stages and occupancy, split
   over eight warps instead of four (narrower warp tiles: a third more instructions per
   block), the eight-warp one ran +0.007 / -0.003 (log, median; H100 / H200), where the sum
   predicted +0.14 / +0.16: with two warps on a scheduler, one issues under the other's MMAs.
   So with w = resident warps / sub-partitions (at least 1) the lone warp's excess over
   reading 8's floor counts ``1 / w**ISSUE_OVERLAP_EXPONENT``: ``T_issue = T_overlapped +
   (T_added - T_overlapped) / w**e``, reading 13 at w = 1 and reading 8 as w grows. The
   exponent is chosen, not derived: ½, where the whole measured spaces rank best among 0.25
   to 0.75 and before the convolutions' top picks collapse (0.6 and up). The pairs: +0.06 /
   +0.09; whole spaces (shapes / h200 / h100 / conv) top-1 0.920 / 0.923 / 0.897 / 0.937 ->
   0.920 / 0.927 / 0.910 / 0.935, top-10 0.952 / 0.952 / 0.942 / 0.974 -> 0.960 / 0.958 /
   0.953 / 0.983, mean Spearman 0.845 / 0.767 / 0.742 / 0.858 -> 0.849 / 0.778 / 0.748 /
   0.860; the stage twins lose (two against three, median error 0.096 / 0.099 -> 0.101 /
   0.103: shorter steps leave their loads less slack) (benchmarks/RESULTS.md, "warps on a
   sub-partition overlap").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pipetune.model.hardware import GPUSpec
from pipetune.model.issue import step_instructions
from pipetune.model.knobs import PredictedLatencies
from pipetune.model.space import MMA_TILE, Space
from pipetune.model.workloads import AnyWorkload, Conv2d, Conv3d, GemmSwiglu

BYTES_FP16 = 2
# How the overlap of a K step's MMAs and its other instructions grows with the warps on each
# sub-partition, w: their sum's excess over the longer of the two counts
# 1 / w**ISSUE_OVERLAP_EXPONENT (reading 17).
# Chosen, not derived: the measured spaces rank best from 0.25 to 0.5, and the convolutions'
# top picks collapse from 0.6 on (benchmarks/RESULTS.md, "warps on a sub-partition overlap").
ISSUE_OVERLAP_EXPONENT = 0.5


def pipeline_latency(
    T_load: Any, T_use: Any, N_loop: Any, N_pipe: Any, N_mplx: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Table 1's Pipeline Latency Model. Returns (T_load_use_loop, load_bound).

    load-bound when ``T_load > (N_pipe·N_mplx − 1)·T_use``:
        T_load_use_loop = (T_load + T_use) · N_loop / N_pipe
    otherwise (use-bound; the N_mplx workers share the use unit):
        T_load_use_loop = N_mplx · T_use · N_loop
    """
    T_load, T_use, N_loop, N_pipe, N_mplx = np.broadcast_arrays(
        *(np.asarray(x, dtype=np.float64) for x in (T_load, T_use, N_loop, N_pipe, N_mplx))
    )
    load_bound = T_load > (N_pipe * N_mplx - 1.0) * T_use
    loop = np.where(
        load_bound,
        (T_load + T_use) * N_loop / N_pipe,
        N_mplx * T_use * N_loop,
    )
    return loop, load_bound


def multistage_latency(
    T_load: Any,
    T_use: Any,
    N_loop: Any,
    N_pipe: Any,
    N_mplx: Any,
    T_latency: Any = 0.0,
    N_reg_loop: Any = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The main loop of an N_pipe >= 2 stage shared-memory pipeline synchronised per step
    (readings 4 and 12 above). Returns (T_load_use_loop, load_bound). ``T_latency``: the
    part of ``T_load`` that is latency (the rest streams at the shared bandwidth).

    load-bound when ``T_load > (N_pipe − 1)·N_mplx·T_use`` (by the loads' mean). Per step,
    with ``U = N_mplx·T_use`` (the N_mplx workers share the use unit, as in Table 1) and the
    latency exponential about its mean ``L``, the slack its N_pipe - 1 steps leave a load,
    ``slack = (N_pipe − 1)·U − stream``:
        slack > 0:  T_load_use_loop = (U + L·exp(−slack/L) / (N_pipe − 1)) · N_loop
        otherwise:  T_load_use_loop = T_load · N_loop / (N_pipe − 1)
    which meet where the stream alone fills the steps. Without latency it is reading 4's
    ``max(U, T_load / (N_pipe − 1))``. One stage has no step to overlap: Table 1's formula.

    Reading 14: the next tile's copies go out in P = max(N_reg_loop − 1, 1) parts, one in each
    of the step's first P k16 slices, so its last part leaves ``(P − 1) / N_reg_loop`` of the
    way through the step and its bytes (``stream / P``) stream from there: the stream in
    ``slack`` (and in a load-bound step) is ``max(stream, (P − 1)/N_reg_loop·U + stream/P)``.
    With one or two k16 slices (P = 1) it is the formula above.
    """
    T_load, T_use, N_loop, N_pipe, N_mplx, T_latency, N_reg_loop = np.broadcast_arrays(
        *(
            np.asarray(x, dtype=np.float64)
            for x in (T_load, T_use, N_loop, N_pipe, N_mplx, T_latency, N_reg_loop)
        )
    )
    table1, table1_bound = pipeline_latency(T_load, T_use, N_loop, N_pipe, N_mplx)
    in_flight = np.maximum(N_pipe - 1.0, 1.0)  # (unused where N_pipe = 1)
    use = N_mplx * T_use
    latency = np.minimum(T_latency, T_load)
    stream = T_load - latency
    # The next tile's copies go out in parts over the step (reading 14; the generated loop's
    # LOAD_PARTS): the last part leaves (parts - 1) / N_reg_loop of the way through it.
    parts = np.maximum(N_reg_loop - 1.0, 1.0)
    arrive = np.maximum(stream, (parts - 1.0) / N_reg_loop * use + stream / parts)
    slack = in_flight * use - arrive
    # E[(stream + X - (S-1)·U)+] for X exponential about `latency`: latency·exp(-slack /
    # latency) where slack >= 0, all of the mean load beyond the steps' uses where not.
    with np.errstate(over="ignore"):
        overrun = latency * np.exp(
            -np.maximum(slack, 0.0) / np.maximum(latency, np.finfo(np.float64).tiny)
        )
    step = np.where(slack > 0.0, use + overrun / in_flight, (latency + arrive) / in_flight)
    load_bound = T_load > in_flight * use
    loop = step * N_loop
    multistage = N_pipe >= 2
    return np.where(multistage, loop, table1), np.where(multistage, load_bound, table1_bound)


def one_stage_load(T_load: Any, T_latency: Any, T_use: Any) -> np.ndarray:
    """The load time of a one-stage block's K step (reading 9): ``T_load`` is ``T_latency``
    plus the time the whole wave's bytes take at the shared bandwidth (``stream``), as if
    every block loaded at once; a one-stage block loads only for the share d of its step
    ``c = T_latency + d·stream + T_use``, and the blocks, out of step, contend as that share
    of them: ``d = (c - T_use) / c``. So c is the larger root of
    ``c² - (T_latency + T_use + stream)·c + stream·T_use = 0``, and the load is ``c - T_use``.
    Without a use it is ``T_load``; without streaming ``T_latency``; without latency
    ``max(T_use, stream) - T_use`` (one block's loads overlap the others' uses). The load is
    never more than Table 1's ``T_load``, and the step c never less than ``T_load``, the step
    of a block that always has a copy in flight: a second stage still never slows the loop."""
    T_load, T_latency, T_use = np.broadcast_arrays(
        *(np.asarray(x, dtype=np.float64) for x in (T_load, T_latency, T_use))
    )
    latency = np.minimum(T_latency, T_load)
    stream = T_load - latency
    total = latency + T_use + stream
    step = 0.5 * (total + np.sqrt(np.maximum(total * total - 4.0 * stream * T_use, 0.0)))
    return step - T_use


def warps_per_sub_partition(
    gpu: GPUSpec, N_warp_per_threadblk: Any, N_threadblk_per_SM: Any
) -> Any:
    """The SM's resident warps per sub-partition (one scheduler and tensor core each); below 1
    some sub-partitions have no warp."""
    resident = np.asarray(N_warp_per_threadblk) * np.asarray(N_threadblk_per_SM)
    return resident / gpu.warps_to_saturate_tensor


def tensor_utilisation(gpu: GPUSpec, N_warp_per_threadblk: Any, N_threadblk_per_SM: Any) -> Any:
    """Util(N_warp_per_threadblk, N_threadblk_per_SM): share of the SM's tensor throughput
    that its resident warps reach; each sub-partition's tensor core needs a warp to feed it."""
    return np.minimum(1.0, warps_per_sub_partition(gpu, N_warp_per_threadblk, N_threadblk_per_SM))


def _a_reuse_factor(workload: AnyWorkload) -> float:
    """Fraction of the implicit-GEMM A tile that is unique input data (im2col overlap)."""
    if isinstance(workload, Conv2d | Conv3d):
        view = workload.gemm_view()
        return min(1.0, (workload.operand_bytes[0] / BYTES_FP16) / (view.m * view.k))
    return 1.0


def _output_share(workload: AnyWorkload) -> float:
    """Bytes a block writes per element of its GEMM tile: 1 element of C each, but the
    fused GEMM + SwiGLU writes one output for each gate-and-up pair of columns."""
    return 0.5 if isinstance(workload, GemmSwiglu) else 1.0


@dataclass(frozen=True)
class Prediction(PredictedLatencies):
    """The model's terms for every schedule of a space (arrays aligned with the space)."""

    space: Space
    T_kernel: np.ndarray
    T_threadblk: np.ndarray  # one block's latency in a full wave
    N_threadblk_batch: np.ndarray
    N_threadblk_per_SM: np.ndarray
    N_threadblk_per_threadblk_batch: np.ndarray
    T_init: np.ndarray
    T_main_loop: np.ndarray
    T_epilogue: np.ndarray
    T_smem_load: np.ndarray
    T_smem_use: np.ndarray
    T_reg_load: np.ndarray
    T_compute: np.ndarray
    T_LLC_load: np.ndarray
    T_DRAM_load: np.ndarray
    N_smem_loop: np.ndarray
    N_reg_loop: np.ndarray
    Util: np.ndarray
    smem_load_bound: np.ndarray
    reg_load_bound: np.ndarray
    # One block's K step at the SM's issue rate (reading 8): the floor of T_smem_use.
    T_issue: np.ndarray
    # Where the K step's issue is its longest part, before reading 10's fragment wait is
    # added on top (which lengthens an issue-bound step as much as any other).
    issue_bound: np.ndarray
    # The last wave (reading 7): its blocks per SM and one block's latency in it; the terms
    # above are a full wave's. Equal to the full wave's where the waves are whole.
    T_threadblk_last: np.ndarray
    N_threadblk_per_SM_last: np.ndarray
    # One block's latency alone on its SM, in a wave of min(tiles, N_SM) blocks: the floor of
    # T_kernel (reading 11).
    T_threadblk_lone: np.ndarray

    @cached_property
    def tflops(self) -> np.ndarray:
        return self.space.workload.flops / self.T_kernel / 1e12

    def terms(self, i: int) -> dict[str, Any]:
        """The model's view of schedule i, in microseconds and counts."""
        us = 1e6
        return {
            "predicted_us": float(self.T_kernel[i] * us),
            "predicted_tflops": float(self.tflops[i]),
            "bottleneck": "load" if self.smem_load_bound[i] else "use",
            "reg_bottleneck": "load" if self.reg_load_bound[i] else "use",
            "issue_bound": bool(self.issue_bound[i]),
            "waves": int(self.N_threadblk_batch[i]),
            "blocks_per_sm": int(self.N_threadblk_per_SM[i]),
            "T_threadblk_us": float(self.T_threadblk[i] * us),
            "last_wave_blocks_per_sm": int(self.N_threadblk_per_SM_last[i]),
            "T_threadblk_last_us": float(self.T_threadblk_last[i] * us),
            "T_threadblk_lone_us": float(self.T_threadblk_lone[i] * us),
            "T_init_us": float(self.T_init[i] * us),
            "T_main_loop_us": float(self.T_main_loop[i] * us),
            "T_epilogue_us": float(self.T_epilogue[i] * us),
            "T_smem_load_us": float(self.T_smem_load[i] * us),
            "T_smem_use_us": float(self.T_smem_use[i] * us),
            "T_reg_load_us": float(self.T_reg_load[i] * us),
            "T_compute_us": float(self.T_compute[i] * us),
            "T_issue_us": float(self.T_issue[i] * us),
        }


def evaluate(space: Space) -> Prediction:
    """Evaluate ALCOP Table 1 for every schedule in the space at once."""
    gpu, workload = space.gpu, space.workload
    view = workload.gemm_view()
    BM = space.block_m.astype(np.float64)
    BN = space.block_n.astype(np.float64)
    BK = space.block_k.astype(np.float64)
    N_smem_pipe_stage = space.knobs["smem_stages"].astype(np.float64)
    N_reg_pipe_stage = space.knobs["reg_stages"].astype(np.float64)
    N_warp_per_threadblk = space.warps.astype(np.float64)
    WM = MMA_TILE * space.knobs["warp_row_tiles"].astype(np.float64)
    WN = MMA_TILE * space.knobs["warp_col_tiles"].astype(np.float64)

    # Kernel level: threadblock batches ("waves") of N_SM × N_threadblk_per_SM blocks.
    tiles = space.tiles.astype(np.float64)
    occupancy = space.blocks_per_sm.astype(np.float64)
    capacity = gpu.sm_count * occupancy
    N_threadblk_batch = np.ceil(tiles / capacity)
    N_smem_loop = np.ceil(view.k / BK)
    N_reg_loop = BK / MMA_TILE

    # What does not depend on how many blocks share the wave, computed once for both waves.
    FLOPs_one_reg_loop = 2.0 * WM * WN * MMA_TILE
    # Register level: ldmatrix of one warp's A and B fragments, the block's warps sharing
    # the SM's shared-memory bandwidth (other blocks are accounted one level up).
    Bytes_one_reg_loop = (WM + WN) * MMA_TILE * BYTES_FP16
    reg_stream = Bytes_one_reg_loop * N_warp_per_threadblk / gpu.smem_bandwidth_per_sm
    T_reg_load = gpu.smem_latency_ns * 1e-9 + reg_stream
    # A's rows past the matrix edge count, B's columns past it do not: so two skinny GEMMs
    # measured on the H200 rank best (tests/test_measured_data.py). Counting both (the
    # whole tile), the model's pick on 4096x72x4096 held 0.739 of the optimum, against 0.859
    # with B clipped; clipping A too (as _wave_working_set clips both for DRAM) dropped
    # 72x12288x4096 from 0.902 to 0.790. Both are cp.async zero-fills (source size 0); why
    # only A's cost the L2 stream is not established, only measured.
    Bytes_one_smem_loop = (BM + np.minimum(BN, view.n)) * BK * BYTES_FP16
    # Warp instructions of one K step of one warp (reading 8).
    step = step_instructions(space)
    # Beside its MMAs (reading 13): they hold the tensor pipe, the rest issue after them.
    step_other = step.total - step.mma
    Bytes_output_tile = (
        np.minimum(BM, view.m) * np.minimum(BN, view.n) * BYTES_FP16 * _output_share(workload)
    )
    load_latency = max(gpu.dram_latency_ns, gpu.l2_latency_ns) * 1e-9
    fragment_wait = gpu.smem_latency_ns * 1e-9

    def wave(N_threadblk_per_threadblk_batch: np.ndarray) -> dict[str, np.ndarray]:
        """The terms of one wave of N_threadblk_per_threadblk_batch blocks."""
        # With fewer blocks than the GPU holds, the scheduler spreads them over the SMs, so
        # fewer blocks share an SM than occupancy would allow (the small-output case, and
        # the last wave: reading 7).
        N_threadblk_per_SM = np.minimum(
            occupancy, np.ceil(N_threadblk_per_threadblk_batch / gpu.sm_count)
        )

        # Computation latency model: one warp's mma work for one k16 step.
        Util = tensor_utilisation(gpu, N_warp_per_threadblk, N_threadblk_per_SM)
        T_compute = FLOPs_one_reg_loop / (gpu.sm_tensor_flops * Util)
        T_smem_use, reg_load_bound = pipeline_latency(
            T_reg_load, T_compute, N_reg_loop, N_reg_pipe_stage, N_warp_per_threadblk
        )
        # The block's MMAs on the tensor pipe: its warps' k16 slices at the SM's rate.
        T_mma = N_reg_loop * N_warp_per_threadblk * T_compute
        # What Table 1's load-bound register level adds over them is the fragments' latency,
        # which co-resident blocks fill as they fill reading 10's wait (reading 16).
        T_smem_use = T_mma + (T_smem_use - T_mma) / N_threadblk_per_SM
        T_smem_use = np.maximum(T_smem_use, N_reg_loop * reg_stream)
        # The block's warps issue their K step at the SM's rate, on the sub-partitions they
        # occupy (Util: one warp per scheduler, as one per tensor core) (reading 8); their
        # MMAs take the tensor pipe's time, and the other instructions add to it (reading 13).
        issue_time = N_warp_per_threadblk / (gpu.issue_rate_per_sm * Util)
        T_added = T_mma + step_other * issue_time  # reading 13: a lone warp's step
        T_overlapped = np.maximum(T_mma, step.total * issue_time)  # reading 8's floor
        # With more warps on a sub-partition, one warp's instructions issue under another's
        # MMAs part of the time (reading 17): the lone warp's excess over the floor shrinks.
        warps_per_scheduler = np.maximum(
            warps_per_sub_partition(gpu, N_warp_per_threadblk, N_threadblk_per_SM), 1.0
        )
        T_issue = T_overlapped + (T_added - T_overlapped) / (
            warps_per_scheduler**ISSUE_OVERLAP_EXPONENT
        )
        T_smem_use = np.maximum(T_smem_use, T_issue)
        # Judged here: the wait below lengthens an issue-bound step too, and compared after it
        # the issue floor would look hidden where it is what sets the step.
        issue_bound = T_issue >= T_smem_use
        # With one register stage a block's warps, in step, wait out the shared-memory
        # latency of their fragments in every k16 step; co-resident blocks, out of step with
        # it, fill that wait (reading 10). So do two stages where a K step is one k16 slice:
        # the next fragments are loaded after the step's barrier (reading 15).
        waits_for_fragments = (N_reg_pipe_stage == 1) | (N_reg_loop == 1)
        T_smem_use = T_smem_use + np.where(
            waits_for_fragments, N_reg_loop * fragment_wait / N_threadblk_per_SM, 0.0
        )

        # Memory latency model: global -> shared copies of one K step for the whole wave.
        llc_stream = (
            Bytes_one_smem_loop * N_threadblk_per_threadblk_batch / (gpu.l2_bandwidth_gbs * 1e9)
        )
        T_LLC_load = gpu.l2_latency_ns * 1e-9 + llc_stream
        Bytes_threadblk_batch_workset = _wave_working_set(
            space, BM, BN, BK, view, N_threadblk_per_threadblk_batch
        )
        dram_stream = Bytes_threadblk_batch_workset / (gpu.dram_bandwidth_gbs * 1e9)
        T_DRAM_load = gpu.dram_latency_ns * 1e-9 + dram_stream
        T_smem_load = np.maximum(T_LLC_load, T_DRAM_load)

        # Threadblock latency model.
        T_init = T_smem_load + T_reg_load
        # Tile 0's load is T_init; the loop loads the other N_loop - 1 and uses the last one too.
        # A one-stage block's load contends only with the blocks loading with it (reading 9);
        # its latency is the farther level's (a tile's first touch of a line misses the L2).
        T_loop_load = np.where(
            N_smem_pipe_stage == 1,
            one_stage_load(T_smem_load, load_latency, T_smem_use),
            T_smem_load,
        )
        T_steady, smem_load_bound = multistage_latency(
            T_loop_load,
            T_smem_use,
            N_smem_loop - 1.0,
            N_smem_pipe_stage,
            N_threadblk_per_SM,
            load_latency,
            N_reg_loop,
        )
        T_main_loop = T_steady + N_threadblk_per_SM * T_smem_use
        T_main_loop = np.maximum(
            T_main_loop, (N_smem_loop - 1.0) * np.maximum(llc_stream, dram_stream)
        )
        T_main_loop = T_main_loop + N_smem_loop * gpu.k_step_s
        T_epilogue = gpu.dram_latency_ns * 1e-9 + Bytes_output_tile * (
            N_threadblk_per_threadblk_batch
        ) / (gpu.dram_write_bandwidth_gbs * 1e9)
        # Co-resident blocks drift apart: each one's prologue and epilogue overlap the others'
        # main loops (reading 6).
        T_threadblk = T_main_loop + (T_init + T_epilogue) / N_threadblk_per_SM
        return {
            "N_threadblk_per_SM": N_threadblk_per_SM,
            "N_threadblk_per_threadblk_batch": N_threadblk_per_threadblk_batch,
            "T_threadblk": T_threadblk,
            "T_init": T_init,
            "T_main_loop": T_main_loop,
            "T_epilogue": T_epilogue,
            "T_smem_load": T_smem_load,
            "T_smem_use": T_smem_use,
            "T_reg_load": T_reg_load,
            "T_compute": T_compute,
            "T_LLC_load": T_LLC_load,
            "T_DRAM_load": T_DRAM_load,
            "Util": Util,
            "smem_load_bound": smem_load_bound,
            "reg_load_bound": reg_load_bound,
            "T_issue": T_issue,
            "issue_bound": issue_bound,
        }

    full = wave(np.minimum(tiles, capacity))
    # The last wave holds what the full ones left: fewer blocks per SM share its tensor
    # unit and bandwidth, so it is shorter than a full one (reading 7). With one wave, or a
    # whole number of them, it is a full one.
    last = wave(tiles - (N_threadblk_batch - 1.0) * capacity)
    # Never longer than a full wave: no SM holds more blocks in it. Reading 6's exposed
    # prologue, which grows as the blocks per SM fall, made one schedule in 2,840 (4k GEMM,
    # one warp of 2x4 tiles, two blocks per SM to one) 0.14% longer per block once reading
    # 13 left its lone warp's step no shorter; no hardware reason supports that.
    last["T_threadblk"] = np.minimum(last["T_threadblk"], full["T_threadblk"])
    T_kernel = full["T_threadblk"] * (N_threadblk_batch - 1.0) + last["T_threadblk"]
    # A block shares its SM only to its cost: the kernel lasts at least one block's life alone
    # on an SM, in a wave that spreads min(tiles, N_SM) blocks one to an SM (reading 11).
    lone = wave(np.minimum(tiles, gpu.sm_count))
    T_kernel = np.maximum(T_kernel, lone["T_threadblk"])
    return Prediction(
        space=space,
        T_kernel=T_kernel,
        N_threadblk_batch=N_threadblk_batch,
        N_smem_loop=N_smem_loop,
        N_reg_loop=N_reg_loop,
        T_threadblk_last=last["T_threadblk"],
        N_threadblk_per_SM_last=last["N_threadblk_per_SM"],
        T_threadblk_lone=lone["T_threadblk"],
        **full,
    )


def _wave_working_set(
    space: Space, BM: np.ndarray, BN: np.ndarray, BK: np.ndarray, view, blocks: np.ndarray
) -> Any:
    """Bytes_threadblk_batch_workset: distinct A and B data one wave reads per K step.

    Blocks are rasterised N-tiles fastest, then M-tiles, then batch; a wave of c blocks
    touches ceil(c / tn) rows of A tiles and min(c, tn) columns of B tiles per batch entry
    it reaches. Rows and columns past the problem edge are predicated off and not read.
    """
    tm, tn = (x.astype(np.float64) for x in space.tile_grid)
    c = np.asarray(blocks, dtype=np.float64)
    per_batch = tm * tn
    batches = np.minimum(view.batch, np.ceil(c / per_batch))
    a_rows = np.minimum(tm * batches, np.ceil(c / tn))
    b_cols = np.minimum(tn, c) * batches
    a_bytes = a_rows * np.minimum(BM, view.m) * BK * BYTES_FP16 * _a_reuse_factor(space.workload)
    b_bytes = b_cols * np.minimum(BN, view.n) * BK * BYTES_FP16
    return a_bytes + b_bytes


@dataclass(frozen=True)
class RankedSchedule:
    index: int
    schedule: dict[str, int]
    schedule_id: str
    terms: dict[str, Any]


def rank(
    workload: AnyWorkload, gpu: GPUSpec, top: int | None = None
) -> tuple[Space, Prediction, list[RankedSchedule]]:
    """The space, the model's prediction and its top schedules, fastest first."""
    space = Space.enumerate(workload, gpu)
    prediction = evaluate(space)
    order = prediction.order if top is None else prediction.order[:top]
    ranked = []
    for i in order:
        schedule = space[int(i)]
        ranked.append(
            RankedSchedule(
                index=int(i),
                schedule=schedule.as_dict(),
                schedule_id=schedule.id,
                terms=prediction.terms(int(i)),
            )
        )
    return space, prediction, ranked
