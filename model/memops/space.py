"""The schedule space of the memory-intensive family: AStitch's adaptive thread mapping.

AStitch (ASPLOS'22) section 3.3 maps row-wise operators to threads by *task packing*
(several short rows per block: horizontally side by side, vertically one after another
when the grid is bounded to a number of waves) and *task splitting* (one long row over
several blocks, joined by a cross-block reduction), and keeps reused data at the level of
the memory hierarchy its reuse needs (section 3.2: registers, shared memory, global). The
knobs below are those decisions; one schedule is one int per knob.

A *row group* is the ``rows_per_block`` rows one block holds side by side; a *segment* is
the 1/``blocks_per_row`` part of a row one block handles; a *work item* is one
(row group, segment) pair, and a block loops over work items (``item += gridDim.x``) when
``max_waves`` bounds the grid. In a row group, ``threads_per_row`` threads share each row:
thread t of a row reads vectors t, t + threads_per_row, ... of its segment (adjacent
threads, adjacent 16 bytes: coalesced). The streaming passes issue ``LOAD_BATCH`` vector
loads per thread before using any; the register cache issues all of a thread's loads at
once. Everything derived here is a numpy array over the schedules (or a scalar for one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, ClassVar

import numpy as np

from pipetune.model.hardware import GPUSpec
from pipetune.model.knobs import (
    Knob,
    KnobArraySpace,
    KnobSchedule,
    broken_rules,
    check_schedule_type,
    full_grid,
)
from pipetune.model.memops.workloads import OP_CODES, MemWorkload, op_key
from pipetune.model.occupancy import blocks_per_sm

KNOBS: tuple[Knob, ...] = (
    Knob(
        "threads_per_row",
        (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        True,
        "threads that share one row segment: a sub-warp group, one warp or several warps",
    ),
    Knob(
        "rows_per_block",
        (1, 2, 4, 8, 16, 32, 64, 128),
        True,
        "horizontal task packing: rows one block processes side by side",
    ),
    Knob(
        "blocks_per_row",
        (1, 2, 4, 8, 16, 32, 64, 128),
        True,
        "task splitting: blocks that share one row, each a contiguous segment",
    ),
    Knob("vector_width", (1, 2, 4, 8), True, "float16 elements per load and store (2-16 B)"),
    Knob(
        "row_cache",
        (0, 1, 2),
        False,
        "where a row is kept between the statistics pass and the output pass",
        {0: "global", 1: "smem", 2: "registers"},
    ),
    Knob(
        "split_mode",
        (0, 1),
        False,
        "how split blocks combine their partials: a second kernel, or a cross-block "
        "reduction in the same kernel",
        {0: "two_pass", 1: "fused"},
    ),
    Knob(
        "max_waves",
        (0, 1, 2, 4),
        False,
        "blocks-per-wave bound: the grid holds at most this many waves of resident blocks, "
        "which loop over the remaining work items (vertical packing); 0 = unbounded",
        {0: "unbounded"},
    ),
)
KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)
KNOB_DOMAINS: dict[str, tuple[int, ...]] = {k.name: k.values for k in KNOBS}
CACHE_GLOBAL, CACHE_SMEM, CACHE_REGISTERS = 0, 1, 2
MODE_TWO_PASS, MODE_FUSED = 0, 1

WARP = 32
LOAD_BATCH = 4  # vector loads a thread issues before using any, in the streaming passes
REG_CACHE_WORDS = 64  # 32-bit registers a thread may spend on keeping its share of a row
# Vectors a thread may keep: the unrolled passes over more keep so many converted values
# alive that ptxas's use stops following any simple estimate (measured up to 190 registers).
REG_CACHE_VECTORS = 8
STATS_SLOT_BYTES = 16  # one partial statistic (at most 3 floats) in shared memory
PARTIAL_FLOATS = 3  # floats per partial in the global workspace (count, mean, M2 at most)
BYTES_FP16 = 2


@dataclass(frozen=True, order=True)
class MemSchedule(KnobSchedule):
    declaration: ClassVar[tuple[Knob, ...]] = KNOBS
    id_prefix: ClassVar[str] = "m-"
    threads_per_row: int
    rows_per_block: int
    blocks_per_row: int
    vector_width: int
    row_cache: int
    split_mode: int
    max_waves: int

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_block


check_schedule_type(MemSchedule, KNOBS)


def _ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b)


# Registers ptxas allocates (NVRTC 13, the larger of sm_80 and sm_90), for occupancy: a
# least-squares fit to the ptxas reports of 447 kernels (30 random valid schedules of each
# of 12 workloads over every op, 15 more with a register cache for softmax and layernorm):
# a base per op, a cost per 32-bit word of a streamed vector (the BATCH vectors in flight,
# with gamma/beta or bias beside them), and per cached vector and word of the register
# cache. RMS error 8 registers, under by at most 19 (test_memops_compile holds every
# compiled kernel to REGISTER_FIT_ERROR). Under __launch_bounds__ ptxas squeezes a kernel
# into the block's budget, spilling only past a margin that varies by kernel (a fit 14
# over a 64-register budget spilled on sm_80, others 26 over did not; a layer norm of 1024
# threads, 2 blocks a row fused, vector 4, its fit 8 over, spilled 8 bytes on sm_80 and
# sm_90): a schedule is valid when its fit is within REGISTER_HEADROOM of the budget, under
# the smallest excess seen to spill (tests/test_memops_compile.py compiles those nearest it).
REGISTER_FIT: dict[str, tuple[float, float, float, float]] = {
    # op: (base, per streamed vector word, per cached vector, per cached word)
    "reduce-sum": (37.5, 0.0, 0.0, 0.0),
    "reduce-max": (46.4, -2.9, 0.0, 0.0),
    "softmax": (32.8, 10.1, 1.2, 1.0),
    "layernorm": (40.9, 16.6, -0.5, 2.4),
    # rmsnorm: fitted on its own (450 kernels: 45 schedules of each of 5 shapes, a third
    # register-cached, on sm_80 and sm_90) by least squares with the under-estimate held to
    # 20: its vector-width-1 kernels take 80 registers, 30 over the plain fit (RMS 14).
    "rmsnorm": (50.0, 10.0, -1.3, 1.5),
    "bias_gelu": (25.5, 16.5, 0.0, 0.0),
    # silu_mul: fitted on its own (300 kernels: 30 schedules of each of 5 shapes on sm_80 and
    # sm_90): RMS 6, under by at most 17.
    "silu_mul": (35.3, 10.1, 0.0, 0.0),
}
REGISTER_SPLIT = -2.4  # splitting: a split row holds less state
REGISTER_HEADROOM = 7
REGISTER_FIT_ERROR = 24


def fitted_registers(workload: MemWorkload, knobs: dict[str, Any], g: Geometry) -> np.ndarray:
    base, per_stream, per_vector, per_word = REGISTER_FIT[op_key(workload)]
    words = np.maximum(1, np.asarray(knobs["vector_width"]) // 2)
    cached = np.asarray(knobs["row_cache"]) == CACHE_REGISTERS
    fit = (
        base
        + per_stream * np.where(cached, 0, words)
        + per_vector * np.where(cached, g.vecs_per_thread, 0)
        + per_word * np.asarray(g.cache_words)
        + REGISTER_SPLIT * (np.asarray(knobs["blocks_per_row"]) > 1)
    )
    return np.rint(fit).astype(np.int64)


def register_budget(gpu: GPUSpec, threads: Any) -> np.ndarray:
    """Registers per thread a block of ``threads`` may use (__launch_bounds__(threads, 1)):
    the register file over the block's warps, in allocation units, at most the ISA limit."""
    warps = _ceil_div(np.asarray(threads, dtype=np.int64), WARP)
    unit = gpu.register_alloc_unit_per_warp
    per_warp = (gpu.registers_per_sm // np.maximum(warps, 1)) // unit * unit
    return np.minimum(gpu.max_registers_per_thread, per_warp // WARP)


@dataclass(frozen=True)
class Geometry:
    """How one workload's rows map onto blocks and threads, per schedule (arrays)."""

    threads: Any  # per block: threads_per_row * rows_per_block
    warps: Any
    nvec: Any  # vectors per row
    seg_vecs: Any  # vectors per segment (the last segment may be shorter)
    vecs_per_thread: Any  # a thread's vectors of one segment (at most)
    groups: Any  # row groups
    items: Any  # work items: groups * blocks_per_row
    rows_per_item: Any  # rows of an average row group (the last group may be partial)
    rows_per_full_item: Any  # rows of a full row group: min(rows_per_block, rows)
    cache_words: Any  # registers spent on the register cache (0 unless row_cache = 2)
    scratch_bytes: Any  # shared memory for the reductions (per block)
    cache_bytes: Any  # shared memory for the row cache (per block)
    split: Any  # blocks_per_row > 1 with a reduction to join
    fused_wait: Any  # split blocks wait for each other (needs a row's blocks co-resident)
    launches: Any  # kernels per run: 2 for two-pass splitting
    segments_ok: Any  # every segment of a row has at least one vector

    @property
    def smem_bytes(self) -> Any:
        return self.scratch_bytes + self.cache_bytes


def geometry(knobs: dict[str, Any], workload: MemWorkload) -> Geometry:
    """The mapping's derived sizes for every schedule given as knob arrays."""
    tpr = np.asarray(knobs["threads_per_row"], dtype=np.int64)
    rpb = np.asarray(knobs["rows_per_block"], dtype=np.int64)
    spl = np.asarray(knobs["blocks_per_row"], dtype=np.int64)
    vec = np.asarray(knobs["vector_width"], dtype=np.int64)
    cache = np.asarray(knobs["row_cache"], dtype=np.int64)
    mode = np.asarray(knobs["split_mode"], dtype=np.int64)
    threads = tpr * rpb
    warps = _ceil_div(threads, WARP)
    nvec = workload.cols // vec
    seg_vecs = _ceil_div(nvec, spl)
    vecs_per_thread = _ceil_div(seg_vecs, tpr)
    groups = _ceil_div(workload.rows, rpb)
    split = (spl > 1) & workload.has_reduction
    cache_words = np.where(cache == CACHE_REGISTERS, vecs_per_thread * np.maximum(1, vec // 2), 0)
    multiwarp_row = tpr > WARP
    scratch = np.where(multiwarp_row, warps * STATS_SLOT_BYTES, 0) + np.where(
        split, STATS_SLOT_BYTES, 0
    )
    cache_bytes = np.where(cache == CACHE_SMEM, rpb * seg_vecs * vec * BYTES_FP16, 0)
    fused_wait = split & (mode == MODE_FUSED) & workload.has_output_pass
    return Geometry(
        threads=threads,
        warps=warps,
        nvec=nvec,
        seg_vecs=seg_vecs,
        vecs_per_thread=vecs_per_thread,
        groups=groups,
        items=groups * spl,
        rows_per_item=workload.rows / groups,
        rows_per_full_item=np.minimum(rpb, workload.rows),
        cache_words=cache_words,
        scratch_bytes=scratch,
        cache_bytes=cache_bytes,
        split=split,
        fused_wait=fused_wait,
        launches=1 + (split & (mode == MODE_TWO_PASS)),
        segments_ok=(spl - 1) * seg_vecs < nvec,
    )


def grid_blocks(knobs: dict[str, Any], g: Geometry, rows: int, capacity: Any) -> np.ndarray:
    """Blocks launched, given the resident blocks of one wave (``capacity`` = SMs × blocks
    per SM: predicted by the model, read from the driver by a runner).

    Unbounded: one block per work item. Bounded to w waves: at most w × capacity blocks,
    which loop over the items. Fused splitting (blocks wait for their row's other blocks):
    whole rows' blocks only, all resident at once (one wave), so the wait cannot deadlock.
    """
    waves = np.asarray(knobs["max_waves"], dtype=np.int64)
    spl = np.asarray(knobs["blocks_per_row"], dtype=np.int64)
    capacity = np.asarray(capacity, dtype=np.int64)
    bounded = np.where(waves > 0, np.minimum(g.items, waves * capacity), g.items)
    fused = np.minimum(rows, capacity // spl) * spl
    return np.where(g.fused_wait, fused, bounded).astype(np.int64)


def workspace_bytes(knobs: dict[str, Any], workload: MemWorkload) -> np.ndarray:
    """Global scratch a split schedule needs: a partial per (row, segment) and two counters
    per row (arrivals, departures), zeroed once; the kernels return the counters to zero
    (the partials they leave are written before they are read again)."""
    g = geometry(knobs, workload)
    spl = np.asarray(knobs["blocks_per_row"], dtype=np.int64)
    per_row = spl * PARTIAL_FLOATS * 4 + 2 * 4
    return np.where(g.split, workload.rows * per_row, 0).astype(np.int64)


def _occupancy(gpu: GPUSpec, workload: MemWorkload, knobs: dict[str, Any], g: Geometry):
    """(fitted registers, the block's register budget, resident blocks per SM)."""
    fit = fitted_registers(workload, knobs, g)
    budget = register_budget(gpu, g.threads)
    regs = np.maximum(1, np.minimum(fit, budget))  # a budget of 0: the block cannot fit
    bps = blocks_per_sm(gpu, g.warps * WARP, g.smem_bytes, regs)
    return fit, budget, bps


def invalid_reasons(knobs: dict[str, np.ndarray], workload: MemWorkload, gpu: GPUSpec) -> dict:
    """Boolean arrays, one per rule, True where a schedule breaks that rule."""
    g = geometry(knobs, workload)
    tpr, spl = knobs["threads_per_row"], knobs["blocks_per_row"]
    cache, mode, waves = knobs["row_cache"], knobs["split_mode"], knobs["max_waves"]
    regs, budget, bps = _occupancy(gpu, workload, knobs, g)
    capacity = gpu.sm_count * bps
    return {
        "threads per block over the limit": g.threads > gpu.max_threads_per_block,
        # Fewer threads than a warp leave lanes of every warp idle.
        "block smaller than a warp": g.threads < WARP,
        # A thread with no vector of its segment only idles in the loads and reductions.
        "threads of a row left without a vector": g.seg_vecs < tpr,
        "splitting takes one row per block": (spl > 1) & (knobs["rows_per_block"] > 1),
        "a split segment is empty": ~g.segments_ok,
        # Row caching only matters for a second pass over the row in the same kernel.
        "row cache without a second pass": (cache != CACHE_GLOBAL)
        & ~(workload.has_output_pass & ~(g.split & (mode == MODE_TWO_PASS))),
        "register cache over its budget": (g.cache_words > REG_CACHE_WORDS)
        | ((cache == CACHE_REGISTERS) & (g.vecs_per_thread > REG_CACHE_VECTORS)),
        "shared memory per block over the limit": g.smem_bytes > gpu.smem_per_block_bytes,
        "split mode without a cross-block reduction": (mode != MODE_TWO_PASS) & ~g.split,
        # A schedule ptxas would have to spill is not valid (see REGISTER_HEADROOM).
        "registers per thread over the block's budget": regs > budget + REGISTER_HEADROOM,
        # One fp16 per 32-bit register wastes half of each: vector width 2 keeps the same
        # row in half the registers.
        "register cache of single halves": (cache == CACHE_REGISTERS)
        & (knobs["vector_width"] == 1),
        "no block fits on an SM": bps < 1,
        # Blocks that wait for each other must all be resident: the grid is one wave.
        "fused splitting needs the one-wave bound": g.fused_wait & (waves != 1),
        "a row's blocks do not fit in one wave": g.fused_wait & (capacity < spl),
        # A bound the grid never reaches launches the same grid as no bound.
        "wave bound above the grid": (waves > 0) & ~g.fused_wait & (g.items <= waves * capacity),
    }


def schedule_problems(schedule: MemSchedule, workload: MemWorkload, gpu: GPUSpec) -> list[str]:
    """Why one schedule is outside the valid space (empty when it is valid)."""
    return broken_rules(invalid_reasons(schedule.knob_arrays(), workload, gpu))


@cache
def static_grid() -> dict[str, np.ndarray]:
    """The knob grid without the combinations no workload or GPU allows (nine in ten):
    enumeration then checks every rule on the rest only (the rules still include these)."""
    grid = full_grid(KNOBS)
    threads = grid["threads_per_row"] * grid["rows_per_block"]
    keep = (
        (threads >= WARP)
        & ~((grid["blocks_per_row"] > 1) & (grid["rows_per_block"] > 1))
        & ~((grid["split_mode"] != MODE_TWO_PASS) & (grid["blocks_per_row"] == 1))
        & ~((grid["row_cache"] == CACHE_REGISTERS) & (grid["vector_width"] == 1))
    )
    return {k: v[keep] for k, v in grid.items()}


FEATURE_NAMES: tuple[str, ...] = (
    *KNOB_NAMES,
    "op_code",
    "threads",
    "seg_vecs",
    "vecs_per_thread",
    "lane_utilisation",
    "rows_per_item",
    "items",
    "grid",
    "items_per_block",
    "blocks_per_sm",
    "waves",
    "tail_fraction",
    "smem_bytes",
    "registers",
    "launches",
    "load_rounds",
    "bytes_in_flight_per_sm",
)


class MemSpace(KnobArraySpace):
    """The valid schedules of one memory-intensive workload on one GPU, as knob arrays."""

    declaration = KNOBS
    schedule_type = MemSchedule

    knob_grid = staticmethod(static_grid)
    invalid_reasons = staticmethod(invalid_reasons)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return FEATURE_NAMES

    @property
    def work(self) -> float:
        """Compulsory DRAM bytes of one run: throughput is effective bandwidth."""
        return float(self.workload.compulsory_bytes)

    @cached_property
    def geometry(self) -> Geometry:
        return geometry(self.knobs, self.workload)

    @cached_property
    def _occupancy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _occupancy(self.gpu, self.workload, self.knobs, self.geometry)

    @property
    def registers(self) -> np.ndarray:
        """Registers per thread ptxas is expected to use (the fit, within the budget)."""
        return np.minimum(self._occupancy[0], self._occupancy[1])

    @property
    def blocks_per_sm(self) -> np.ndarray:
        return self._occupancy[2]

    @property
    def smem_bytes(self) -> np.ndarray:
        """Shared memory per block: the reductions' scratch and the row cache."""
        return np.asarray(self.geometry.smem_bytes, dtype=np.int64)

    @cached_property
    def capacity(self) -> np.ndarray:
        """Resident blocks in one wave: SMs × blocks per SM."""
        return self.gpu.sm_count * self.blocks_per_sm

    @cached_property
    def grid(self) -> np.ndarray:
        return grid_blocks(self.knobs, self.geometry, self.workload.rows, self.capacity)

    @cached_property
    def load_depth(self) -> np.ndarray:
        """Vector loads a thread has in flight in its first pass."""
        g = self.geometry
        cached = self.knobs["row_cache"] == CACHE_REGISTERS
        return np.where(cached, g.vecs_per_thread, np.minimum(g.vecs_per_thread, LOAD_BATCH))

    def features(self) -> np.ndarray:
        """Numeric encoding for the cost model, columns named by FEATURE_NAMES."""
        g = self.geometry
        k = self.knobs
        grid = self.grid
        items_per_block = _ceil_div(g.items, grid)
        concurrent = np.minimum(grid, self.capacity)
        waves = _ceil_div(g.items, concurrent)
        tail = g.items - (waves - 1) * concurrent
        in_flight = (
            self.blocks_per_sm * g.threads * self.load_depth * k["vector_width"] * BYTES_FP16
        )
        columns = [
            *(k[n] for n in KNOB_NAMES),
            np.full(len(self), OP_CODES[op_key(self.workload)]),
            g.threads,
            g.seg_vecs,
            g.vecs_per_thread,
            g.seg_vecs / (g.vecs_per_thread * k["threads_per_row"]),
            np.broadcast_to(g.rows_per_item, (len(self),)),
            g.items,
            grid,
            items_per_block,
            self.blocks_per_sm,
            waves,
            tail / concurrent,
            g.smem_bytes,
            self.registers,
            g.launches,
            _ceil_div(g.vecs_per_thread, self.load_depth),
            in_flight,
        ]
        return np.column_stack([np.asarray(c, dtype=np.float64) for c in columns])
