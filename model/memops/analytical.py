"""The memory-intensive family's latency model, evaluated over a whole space with numpy.

Times are in seconds, bytes are bytes. A run is one or two kernel launches (two-pass
splitting); a launch processes ``items`` work items (a row group's segment each, see
model/memops/space.py) with ``grid`` blocks, ``conc`` of which run at once.

Kernel level: waves and the tail wave
    T_kernel      = Σ_launches [T_launch + (N_waves − 1)·T_item(conc) + T_item(tail)]
    conc          = min(grid, capacity)          capacity = N_SM · blocks_per_SM (occupancy)
    N_waves       = ceil(items / conc)           rounds of concurrent work items
    tail          = items − (N_waves − 1)·conc   work items in the last, partial round
    T_launch      = GPUSpec.kernel_launch_ns: GPU time one launch adds in a stream.
  Blocks that loop over items (``max_waves``) and blocks that replace finished ones both
  run ``conc`` items at a time, so waves count rounds of items either way; what the bound
  changes is how many blocks there are (the fused cross-block reduction needs all of a
  row's blocks resident at once, i.e. one wave).

Work-item level: memory latency and bandwidth (Little's law), reductions, issue
    T_item(n)     = max(T_mem(n) + T_reduce + T_split, T_issue(n))
    T_mem(n)      = R_1·LAT_1 + R_2·LAT_2 + T_xfer(n)
    T_xfer(n)     = max(n·(B_dram_rd/BW_DRAM + B_dram_wr/BW_DRAM_wr),
                        n_SM·B_port/BW_port, n_SM·B_smem/BW_smem)
  n blocks run concurrently (n_SM = ceil(n / N_SM) of them per SM). A thread issues a batch
  of independent vector loads, waits one latency, uses them, issues the next batch:
  R_p = ceil(vecs_per_thread / depth) batches ("load rounds") in pass p, with depth =
  LOAD_BATCH (4) for streaming passes and the thread's whole share for the register cache.
  One round moves bytes_in_flight = n·threads·depth·vector bytes in LAT + bytes/BW: the
  achieved bandwidth is bytes_in_flight / (LAT + bytes_in_flight / BW), Little's law with
  the peak as the ceiling. Few bytes in flight (small blocks, narrow vectors, few blocks)
  leave it latency bound; that is what packing (more rows in flight per block, more
  resident threads) and splitting (more blocks, more SMs and their ports) repair.
  LAT_1 = LAT_DRAM: the first read of x. LAT_2 is where the output pass finds the row:
  registers (no loads: R_2 = 0), shared memory (LAT_smem), or global (re-read:
  h·LAT_L2 + (1 − h)·LAT_DRAM with the L2 hit fraction h = min(1, L2 bytes / reuse
  distance); the reuse distance is the bytes all concurrent blocks read between the two
  reads of a row, or the whole input for a second kernel). Layer norm's gamma and beta
  and bias_gelu's bias are read through L2 (LAT_L2 where no x load hides them).
  BW_port = BW_L2 / N_SM: an SM receives data over its own crossbar port (every byte from
  DRAM passes L2; the L2 bandwidth is the sum of the SM ports), so a few busy SMs cannot
  draw the whole DRAM bandwidth. BW_smem = shared-memory bytes per clock × clock.
  Bytes per item: B_dram_rd = x of the segment (and its re-read share 1 − h),
  B_dram_wr = the output of the segment (or one value per row for reduce, or the
  partials), B_port = everything the SM reads or writes (x, params, outputs, partials,
  re-reads that hit L2), B_smem = the shared-memory cache's writes and reads.
    T_reduce      = log2(min(threads_per_row, 32))·LAT_shfl
                    + [threads_per_row > 32]·(2·T_bar + LAT_smem)
  one statistic reduction per work item (sum; max; softmax's (max, sum) in one online
  pass; layer norm's (count, mean, M2) by Welford/Chan): a butterfly of warp shuffles, and
  for rows wider than a warp the warps' partials through shared memory between two
  barriers. LAT_shfl and T_bar are taken as one shared-memory access (LAT_smem): a shuffle
  and a barrier release both cross the SM's crossbar.
    T_split       cross-block reduction of split rows (blocks_per_row > 1):
      fused (softmax, layernorm): 4·LAT_L2 + 5·LAT_shfl + 2·T_bar: publish the partial
        and fence, arrive on the row's counter (an atomic), wait for the row's last block,
        read the row's partials (the first warp, a shuffle butterfly) and broadcast them
        through shared memory between two barriers;
      fused (reduce): 3·LAT_L2 + 5·LAT_shfl: publish, fence and count; the last block
        of the row reads the partials and writes the result;
      two-pass: the first kernel writes partials (no wait); the second reads them
        (LAT_L2 + 5·LAT_shfl + 2·T_bar per item) and makes the output pass from global
        with the same broadcast (reduce's second kernel: one thread per row combines its
        partials).
    T_issue(n)    = n_SM · warps · I_item / (N_SMSP · f_clk)
  warp instructions of one work item (loads, conversions, the op's arithmetic per
  element from OP_INSTRUCTIONS, loop overhead per vector) at one warp instruction per
  clock per sub-partition (N_SMSP = GPUSpec.warps_to_saturate_tensor, one warp scheduler
  per sub-partition); it overlaps with memory, so it enters as a max.

The op instruction counts are estimates from the generated code, not measured; the
hardware constants come from the GPU profile (model/hardware.py), so ``pipetune
calibrate`` improves this model as it does ALCOP's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pipetune.model.knobs import PredictedLatencies
from pipetune.model.memops.space import (
    BYTES_FP16,
    CACHE_GLOBAL,
    CACHE_REGISTERS,
    CACHE_SMEM,
    LOAD_BATCH,
    MODE_FUSED,
    PARTIAL_FLOATS,
    WARP,
    MemSpace,
)
from pipetune.model.memops.workloads import op_key

# Warp instructions per element in the first (statistics or only) pass and the output pass.
# reduce: convert + add/max. softmax: convert, max, subtract, exp (ex2 + scale), fma; then
# convert, subtract, exp, multiply, convert. layernorm: convert, add, subtract, fma (Welford
# per vector); then convert x, gamma, beta, subtract, multiply, fma, convert. rmsnorm:
# convert, fma; then convert x and gamma, two multiplies, convert. bias_gelu: two converts,
# add, the GELU (erf or tanh: about ten), multiplies, convert. silu_mul: two converts, the
# SiLU (negate, exp, add, divide: about five), multiply, convert.
OP_INSTRUCTIONS: dict[str, tuple[float, float]] = {
    "reduce-sum": (2.0, 0.0),
    "reduce-max": (2.0, 0.0),
    "softmax": (6.0, 6.0),
    "layernorm": (4.0, 7.0),
    "rmsnorm": (3.0, 5.0),
    "bias_gelu": (16.0, 0.0),
    "silu_mul": (10.0, 0.0),
}
INSTRUCTIONS_PER_VECTOR = 4.0  # address, load or store, loop test, predicate


@dataclass(frozen=True)
class MemPrediction(PredictedLatencies):
    """The model's terms for every schedule of a space (arrays aligned with the space)."""

    space: MemSpace
    T_kernel: np.ndarray
    T_item: np.ndarray  # one work item at full concurrency, first launch
    T_item_second: np.ndarray  # the same for the second launch (0 without one)
    T_mem: np.ndarray
    T_reduce: np.ndarray
    T_split: np.ndarray
    T_issue: np.ndarray
    T_xfer: np.ndarray
    N_waves: np.ndarray
    tail_fraction: np.ndarray
    conc: np.ndarray
    load_rounds: np.ndarray  # first pass
    reread_rounds: np.ndarray  # output pass
    l2_hit: np.ndarray  # of the output pass's re-read
    bytes_in_flight_per_sm: np.ndarray
    bytes_dram: np.ndarray  # DRAM bytes of the whole run (reads + writes)
    bottleneck: np.ndarray  # "latency" | "dram" | "port" | "smem" | "issue"

    @cached_property
    def effective_gbs(self) -> np.ndarray:
        """Compulsory bytes per second: the bandwidth the run delivers to the operator."""
        return self.space.work / self.T_kernel / 1e9

    def terms(self, i: int) -> dict[str, Any]:
        us = 1e6
        space = self.space
        return {
            "predicted_us": float(self.T_kernel[i] * us),
            "predicted_gbs": float(self.effective_gbs[i]),
            "bottleneck": str(self.bottleneck[i]),
            "waves": int(self.N_waves[i]),
            "tail_fraction": float(self.tail_fraction[i]),
            "blocks_per_sm": int(space.blocks_per_sm[i]),
            "grid": int(space.grid[i]),
            "threads": int(space.geometry.threads[i]),
            "launches": int(space.geometry.launches[i]),
            "registers": int(space.registers[i]),
            "smem_bytes": int(space.geometry.smem_bytes[i]),
            "load_rounds": int(self.load_rounds[i]),
            "reread_rounds": int(self.reread_rounds[i]),
            "l2_hit": float(self.l2_hit[i]),
            "bytes_in_flight_per_sm": int(self.bytes_in_flight_per_sm[i]),
            "dram_bytes": int(self.bytes_dram[i]),
            "T_item_us": float(self.T_item[i] * us),
            "T_mem_us": float(self.T_mem[i] * us),
            "T_xfer_us": float(self.T_xfer[i] * us),
            "T_reduce_us": float(self.T_reduce[i] * us),
            "T_split_us": float(self.T_split[i] * us),
            "T_issue_us": float(self.T_issue[i] * us),
        }


def _ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b)


def evaluate(space: MemSpace) -> MemPrediction:
    """Evaluate the model for every schedule in the space at once."""
    gpu, w = space.gpu, space.workload
    g = space.geometry
    k = space.knobs
    f64 = np.float64
    key = op_key(w)
    instr_first, instr_out = OP_INSTRUCTIONS[key]

    LAT_DRAM = gpu.dram_latency_ns * 1e-9
    LAT_L2 = gpu.l2_latency_ns * 1e-9
    LAT_smem = gpu.smem_latency_ns * 1e-9
    LAT_shfl = T_bar = LAT_smem
    BW_DRAM = gpu.dram_bandwidth_gbs * 1e9
    BW_DRAM_wr = gpu.dram_write_bandwidth_gbs * 1e9
    BW_L2 = gpu.l2_bandwidth_gbs * 1e9
    BW_port = BW_L2 / gpu.sm_count
    BW_smem = gpu.smem_bandwidth_per_sm
    issue_rate = gpu.issue_rate_per_sm  # warp instructions / s / SM
    T_launch = gpu.kernel_launch_ns * 1e-9

    tpr = k["threads_per_row"].astype(f64)
    spl = k["blocks_per_row"].astype(f64)
    vec = k["vector_width"].astype(f64)
    cache = k["row_cache"]
    fused = k["split_mode"] == MODE_FUSED
    split = g.split
    two_pass = split & ~fused
    threads = g.threads.astype(f64)
    warps = g.warps.astype(f64)
    vpt = g.vecs_per_thread.astype(f64)
    rows_item = np.asarray(g.rows_per_item, dtype=f64)
    # A partial last row group makes the average item smaller than a full one. The DRAM
    # terms carry the whole grid's bytes (the average is right there), but an SM's own
    # terms (its port, its shared memory) wait for the fullest item it holds: a full group.
    # With the average alone, 129 rows in blocks of 128 came out faster than 128 rows.
    full_over_average = g.rows_per_full_item.astype(f64) / rows_item
    items = g.items.astype(f64)

    # Concurrency: blocks at once, per SM; the rounds of work items (waves) and the tail.
    capacity = space.capacity.astype(f64)
    grid = space.grid.astype(f64)
    conc = np.minimum(grid, capacity)
    N_waves = _ceil_div(items, conc)
    tail = items - (N_waves - 1) * conc

    # Bytes of one work item.
    seg_bytes = rows_item * (w.cols / spl) * BYTES_FP16  # x of the segment (average)
    # What the passes read of x: silu_mul's gate and up, twice the output's segment; a causal
    # softmax only the keys it shows (on average: a split row's later segments show fewer).
    read_bytes = seg_bytes * w.read_fraction
    in_bytes = read_bytes * w.row_inputs
    param_bytes = w.param_vectors * (w.cols / spl) * BYTES_FP16  # bias / gamma+beta, via L2
    partial_bytes = np.where(split, rows_item * PARTIAL_FLOATS * 4.0, 0.0)
    if w.op == "reduce":
        out_first = np.where(split, partial_bytes, rows_item * BYTES_FP16)
    elif w.has_output_pass:
        out_first = np.where(two_pass, partial_bytes, 0.0)  # one kernel writes in pass 2
    else:
        out_first = seg_bytes  # bias_gelu writes as it reads
    out_second = seg_bytes if w.has_output_pass else np.zeros_like(seg_bytes)

    # Load rounds and latencies of the first pass (x from DRAM).
    depth = np.where(cache == CACHE_REGISTERS, vpt, np.minimum(vpt, LOAD_BATCH))
    R_1 = _ceil_div(vpt, depth)
    bytes_in_flight_per_sm = space.blocks_per_sm * threads * depth * vec * BYTES_FP16 * w.row_inputs

    # The output pass: where it finds the row, and the L2 hit fraction of a re-read.
    reuse_one_kernel = conc * read_bytes  # read by all concurrent blocks in between
    reuse = np.where(two_pass, w.read_fraction * w.rows * w.cols * BYTES_FP16, reuse_one_kernel)
    l2_hit = np.minimum(1.0, gpu.l2_bytes / np.maximum(reuse, 1.0))
    if w.has_output_pass:
        streaming = _ceil_div(vpt, np.minimum(vpt, LOAD_BATCH))
        LAT_reread = l2_hit * LAT_L2 + (1 - l2_hit) * LAT_DRAM
        # gamma and beta (layernorm) come from L2 even when x is kept on chip.
        LAT_param = LAT_L2 if w.param_vectors else 0.0
        R_2 = np.where(
            cache == CACHE_REGISTERS,
            1.0 if w.param_vectors else 0.0,  # all of a thread's param loads at once
            streaming,
        )
        LAT_2 = np.select(
            [cache == CACHE_REGISTERS, cache == CACHE_SMEM],
            [LAT_param, np.maximum(LAT_smem, LAT_param)],
            np.maximum(LAT_reread, LAT_param),
        )
        reread_dram = np.where(cache == CACHE_GLOBAL, (1 - l2_hit) * read_bytes, 0.0)
        reread_port = np.where(cache == CACHE_GLOBAL, read_bytes, 0.0)
        smem_traffic = np.where(cache == CACHE_SMEM, 2.0 * read_bytes, 0.0)
    else:
        R_2 = np.zeros_like(vpt)
        LAT_2 = np.zeros_like(vpt)
        reread_dram = reread_port = smem_traffic = np.zeros_like(vpt)

    # Reductions inside the block, and the cross-block part of splitting.
    if w.has_reduction:
        T_reduce = np.log2(np.minimum(tpr, WARP)) * LAT_shfl + np.where(
            tpr > WARP, 2 * T_bar + LAT_smem, 0.0
        )
    else:
        T_reduce = np.zeros_like(tpr)
    combine = 5 * LAT_shfl  # a warp's butterfly over the row's partials
    if w.op == "reduce":
        T_split = np.where(split & fused, 3 * LAT_L2 + combine, 0.0)
    else:
        T_split = np.where(split & fused, 4 * LAT_L2 + combine + 2 * T_bar, 0.0)

    def transfer(n, dram_rd, dram_wr, port, smem):
        n_sm = np.ceil(n / gpu.sm_count)
        # The rows' share of an item's port bytes scaled to a full group (param_bytes are
        # per item, whatever its rows).
        port_full = (port - param_bytes) * full_over_average + param_bytes
        return np.maximum.reduce(
            [
                n * (dram_rd / BW_DRAM + dram_wr / BW_DRAM_wr),
                n_sm * port_full / BW_port,
                n_sm * smem * full_over_average / BW_smem,
            ]
        )

    def issue(n, instructions):
        return np.ceil(n / gpu.sm_count) * warps * instructions / issue_rate

    per_vector_first = INSTRUCTIONS_PER_VECTOR * (
        w.row_inputs + w.param_vectors * (not w.has_output_pass)
    )
    per_vector_out = INSTRUCTIONS_PER_VECTOR * (1 + w.param_vectors)
    # (A causal softmax's hidden keys: neither read nor computed, only stored as 0.)
    shown = w.read_fraction
    instr_first_item = vpt * shown * (per_vector_first + vec * instr_first)
    instr_out_item = (
        vpt * (per_vector_out + shown * vec * instr_out) if w.has_output_pass else 0 * vpt
    )

    # --- first launch: the whole op, or two-pass splitting's statistics kernel ----------------
    one_kernel_out = w.has_output_pass & ~two_pass
    first_dram_rd = in_bytes + np.where(one_kernel_out, reread_dram, 0.0)
    first_dram_wr = out_first + np.where(one_kernel_out, out_second, 0.0)
    first_port = (
        in_bytes + param_bytes + out_first + np.where(one_kernel_out, reread_port + out_second, 0.0)
    )
    first_smem = np.where(one_kernel_out, smem_traffic, 0.0)
    first_lat = R_1 * LAT_DRAM + np.where(one_kernel_out, R_2 * LAT_2, 0.0)
    if w.op == "bias_gelu":
        first_lat = R_1 * np.maximum(LAT_DRAM, LAT_L2)  # bias loads ride with x's
    first_instr = instr_first_item + np.where(one_kernel_out, instr_out_item, 0.0)

    def item_time(n, lat, dram_rd, dram_wr, port, smem, fixed, instructions):
        xfer = transfer(n, dram_rd, dram_wr, port, smem)
        mem = lat + xfer
        t_issue = issue(n, instructions)
        return np.maximum(mem + fixed, t_issue), mem, xfer, t_issue

    fixed_first = T_reduce + T_split
    T_item, T_mem, T_xfer, T_issue = item_time(
        conc, first_lat, first_dram_rd, first_dram_wr, first_port, first_smem, fixed_first,
        first_instr,
    )  # fmt: skip
    T_tail_item = item_time(
        tail, first_lat, first_dram_rd, first_dram_wr, first_port, first_smem, fixed_first,
        first_instr,
    )[0]  # fmt: skip
    T_first = T_launch + (N_waves - 1) * T_item + T_tail_item

    # --- second launch of two-pass splitting --------------------------------------------------
    T_item_second = np.zeros_like(T_item)
    T_second = np.zeros_like(T_item)
    if w.has_output_pass:
        lat2 = LAT_L2 + streaming * np.maximum(LAT_reread, LAT_param)
        port2 = read_bytes + param_bytes + out_second + spl * PARTIAL_FLOATS * 4.0
        fixed2 = combine + 2 * T_bar
        second = item_time(
            conc, lat2, (1 - l2_hit) * read_bytes, out_second, port2, 0.0, fixed2,
            instr_out_item,
        )[0]  # fmt: skip
        second_tail = item_time(
            tail, lat2, (1 - l2_hit) * read_bytes, out_second, port2, 0.0, fixed2,
            instr_out_item,
        )[0]  # fmt: skip
        T_item_second = np.where(two_pass, second, 0.0)
        T_second = np.where(two_pass, T_launch + (N_waves - 1) * second + second_tail, 0.0)
    elif w.op == "reduce":
        # One thread per row combines its partials: one L2 round and the row's combines.
        finish_blocks = np.ceil(w.rows / threads)
        finish_port = threads * spl * PARTIAL_FLOATS * 4.0
        finish_xfer = transfer(finish_blocks, 0.0, threads * BYTES_FP16, finish_port, 0.0)
        finish = LAT_L2 + finish_xfer + spl * 4.0 / gpu.clock_hz
        T_item_second = np.where(two_pass, finish, 0.0)
        T_second = np.where(two_pass, T_launch + finish, 0.0)

    T_kernel = T_first + T_second

    # DRAM bytes of the whole run, and which term bounds a full round of items.
    # Only an operator with an output pass re-reads its input in the second launch; a
    # reduce's second launch combines partials in L2 (its time is `finish` above).
    second_dram = (1 - l2_hit) * read_bytes + out_second if w.has_output_pass else 0.0
    bytes_dram = items * (first_dram_rd + first_dram_wr) + np.where(
        two_pass, items * second_dram, 0.0
    )
    n_sm = np.ceil(conc / gpu.sm_count)
    candidates = np.stack(
        [
            first_lat + fixed_first,
            conc * (first_dram_rd / BW_DRAM + first_dram_wr / BW_DRAM_wr),
            n_sm * first_port / BW_port,
            n_sm * first_smem / BW_smem,
            T_issue,
        ]
    )
    labels = np.array(["latency", "dram", "port", "smem", "issue"])
    bottleneck = labels[np.argmax(candidates, axis=0)]

    return MemPrediction(
        space=space,
        T_kernel=T_kernel,
        T_item=T_item,
        T_item_second=T_item_second,
        T_mem=T_mem,
        T_reduce=np.broadcast_to(T_reduce, T_kernel.shape).astype(f64),
        T_split=np.broadcast_to(T_split, T_kernel.shape).astype(f64),
        T_issue=T_issue,
        T_xfer=T_xfer,
        N_waves=N_waves,
        tail_fraction=tail / conc,
        conc=conc,
        load_rounds=R_1,
        reread_rounds=np.broadcast_to(R_2, T_kernel.shape).astype(f64),
        l2_hit=np.broadcast_to(l2_hit, T_kernel.shape).astype(f64),
        bytes_in_flight_per_sm=bytes_in_flight_per_sm,
        bytes_dram=bytes_dram,
        bottleneck=bottleneck,
    )


def one_row_per_block(space: MemSpace) -> np.ndarray:
    """The fixed mapping AStitch compares against (XLA's): one block per row, no splitting,
    no wave bound. Threads per row, vector width and row cache stay free, so a gain over
    the best of these is the thread mapping's alone."""
    k = space.knobs
    return (k["rows_per_block"] == 1) & (k["blocks_per_row"] == 1) & (k["max_waves"] == 0)


@dataclass(frozen=True)
class MappingGain:
    best_s: float
    best_fixed_s: float  # best one-row-per-block schedule (nan when the space has none)
    best_packed_s: float  # best with rows_per_block > 1
    best_split_s: float  # best with blocks_per_row > 1

    @property
    def speedup_over_fixed(self) -> float:
        return self.best_fixed_s / self.best_s


def _best(latency: np.ndarray, mask: np.ndarray) -> float:
    return float(latency[mask].min()) if mask.any() else float("nan")


def mapping_gain(space: MemSpace, latency: np.ndarray) -> MappingGain:
    """Best latency per mapping class, for any per-schedule latency (predicted or measured)."""
    latency = np.asarray(latency, dtype=np.float64)
    k = space.knobs
    return MappingGain(
        best_s=float(latency.min()),
        best_fixed_s=_best(latency, one_row_per_block(space)),
        best_packed_s=_best(latency, k["rows_per_block"] > 1),
        best_split_s=_best(latency, k["blocks_per_row"] > 1),
    )
