"""The schedule space of the pipelined tensor-core GEMM family (docs/architecture.md,
"Kernel families").

A schedule is one value per knob. A :class:`Space` is the set of schedules that are valid
for one workload on one GPU, held as one numpy array per knob so that the models evaluate
the whole space at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from pipetune.model import knobs as knobs_module
from pipetune.model.hardware import GPUSpec
from pipetune.model.knobs import (
    Knob,
    KnobArraySpace,
    KnobSchedule,
    broken_rules,
    check_schedule_type,
    full_grid,
)
from pipetune.model.knobs import ScheduleError as ScheduleError  # callers catch it from here
from pipetune.model.occupancy import blocks_per_sm  # shared by the families (re-exported)
from pipetune.model.workloads import AnyWorkload

MMA_TILE = 16  # one warp-level tile step: mma.sync m16n8k16 covers 16 rows and 16 of K
VECTOR_ELEMS = 8  # float16 elements per 16-byte cp.async


# The seven knobs, declared once (model/knobs.py): `Schedule` below has these fields in
# this order (checked at import); KNOBS, the wire schema's enums, the tuner's codec and the
# code generator's checks are read from here. A new knob is one line here and one field.
KNOB_DECLARATION: tuple[Knob, ...] = (
    Knob("block_row_warps", (1, 2, 4), True, "warps per block along M"),
    Knob("block_col_warps", (1, 2, 4), True, "warps per block along N"),
    Knob("warp_row_tiles", (1, 2, 4), True, "16-wide tiles per warp along M"),
    Knob("warp_col_tiles", (1, 2, 4), True, "16-wide tiles per warp along N"),
    Knob("chunk", (1, 2, 4, 8), True, "the K step of a block tile: BK = 16 * chunk"),
    Knob(
        "smem_stages",
        (1, 2, 3, 4, 5, 6),
        True,
        "shared-memory pipeline depth (1: none, 2: double buffering)",
    ),
    Knob("reg_stages", (1, 2), True, "register-fragment buffers (2: double buffering)"),
)
KNOB_SPECS: dict[str, Knob] = {k.name: k for k in KNOB_DECLARATION}
KNOBS: dict[str, tuple[int, ...]] = {k.name: k.values for k in KNOB_DECLARATION}
KNOB_NAMES: tuple[str, ...] = tuple(KNOBS)

# Register estimate per thread (why: the space must not call a schedule valid that spills).
# Accumulators: the warp tile in fp32 spread over 32 lanes. Fragments per k16 step: an A
# 16x16 tile and a B 16x16 tile (two n8 halves) take 4 registers each per lane, times the
# register stages. The rest (addresses, predicates, loop state) is a fixed allowance that
# the NVRTC compile tests check against ptxas.
REGISTER_OVERHEAD = 40


@dataclass(frozen=True, order=True)
class Schedule(KnobSchedule):
    """One value per knob (KNOB_DECLARATION's, in its order)."""

    declaration: ClassVar[tuple[Knob, ...]] = KNOB_DECLARATION
    id_prefix: ClassVar[str] = "s-"
    block_row_warps: int
    block_col_warps: int
    warp_row_tiles: int
    warp_col_tiles: int
    chunk: int
    smem_stages: int
    reg_stages: int

    @property
    def block_m(self) -> int:
        return MMA_TILE * self.warp_row_tiles * self.block_row_warps

    @property
    def block_n(self) -> int:
        return MMA_TILE * self.warp_col_tiles * self.block_col_warps

    @property
    def block_k(self) -> int:
        return MMA_TILE * self.chunk

    @property
    def warps(self) -> int:
        return self.block_row_warps * self.block_col_warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def smem_bytes(self) -> int:
        return int(smem_bytes(self.smem_stages, self.block_m, self.block_n, self.block_k))

    @property
    def est_registers(self) -> int:
        return int(estimate_registers(self.warp_row_tiles, self.warp_col_tiles, self.reg_stages))


check_schedule_type(Schedule, KNOB_DECLARATION)


def knob_value_problems(values: dict[str, Any]) -> list[str]:
    """Why knob values are outside their declared domains (empty when none is); an int
    only, never a bool. Schedule.from_dict and the code generator check with this."""
    return knobs_module.knob_value_problems(KNOB_DECLARATION, values)


def smem_bytes(stages: Any, bm: Any, bn: Any, bk: Any) -> Any:
    """Shared memory of the A and B stage buffers, float16."""
    return stages * (bm + bn) * bk * 2


def estimate_registers(warp_row_tiles: Any, warp_col_tiles: Any, reg_stages: Any) -> Any:
    accumulators = 8 * warp_row_tiles * warp_col_tiles
    fragments = 4 * reg_stages * (warp_row_tiles + warp_col_tiles)
    return accumulators + fragments + REGISTER_OVERHEAD


# Registers ptxas actually allocates, for the occupancy calculation. Least-squares fit to the
# ptxas reports of 160 stratified schedules of our generator (NVRTC 13, sm_90): RMS error 15
# registers against 20 for the allowance above, which misses the live values that unrolled
# k-steps add (it is low by ~16 at chunk 1 and high by up to 84 at chunk 8). Capped at the
# per-thread limit: the kernels use __launch_bounds__(threads, 1), so ptxas never exceeds it.
def predicted_registers(
    warp_row_tiles: Any, warp_col_tiles: Any, reg_stages: Any, chunk: Any
) -> Any:
    accumulators = 8 * warp_row_tiles * warp_col_tiles
    fragments = 4 * reg_stages * (warp_row_tiles + warp_col_tiles)
    fit = 1.11 * accumulators + 0.92 * fragments + 4.9 * chunk + 21.9
    return np.minimum(255, np.rint(fit)).astype(np.int64)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def invalid_reasons(knobs: dict[str, np.ndarray], workload: AnyWorkload, gpu: GPUSpec) -> dict:
    """Boolean arrays, one per rule, True where a schedule breaks that rule."""
    view = workload.gemm_view()
    bm = MMA_TILE * knobs["warp_row_tiles"] * knobs["block_row_warps"]
    bn = MMA_TILE * knobs["warp_col_tiles"] * knobs["block_col_warps"]
    bk = MMA_TILE * knobs["chunk"]
    threads = 32 * knobs["block_row_warps"] * knobs["block_col_warps"]
    smem = smem_bytes(knobs["smem_stages"], bm, bn, bk)
    regs = estimate_registers(knobs["warp_row_tiles"], knobs["warp_col_tiles"], knobs["reg_stages"])
    k_tiles = -(-view.k // bk)
    return {
        "threads per block over the limit": threads > gpu.max_threads_per_block,
        "shared memory per block over the limit": smem > gpu.smem_per_block_bytes,
        "registers per thread over the limit": regs > gpu.max_registers_per_thread,
        "no block fits on an SM": blocks_per_sm(gpu, threads, smem, regs) < 1,
        # Every thread issues the same number of 16-byte copies per tile (no idle lanes,
        # no remainder loop in the loader).
        "tile loads not divisible by the threads": ((bm * bk // VECTOR_ELEMS) % threads != 0)
        | ((bn * bk // VECTOR_ELEMS) % threads != 0),
        # A tile more than a power of two past the problem is pure padding.
        "tile overhangs the problem": (bm > max(MMA_TILE, _next_pow2(view.m)))
        | (bn > max(MMA_TILE, _next_pow2(view.n)))
        | (bk > max(MMA_TILE, _next_pow2(view.k))),
        # More stages than K tiles only adds prologue loads that are never used.
        "more pipeline stages than K tiles": knobs["smem_stages"] > np.maximum(1, k_tiles),
    }


def schedule_problems(schedule: Schedule, workload: AnyWorkload, gpu: GPUSpec) -> list[str]:
    """Why one schedule is outside the valid space (empty when it is valid)."""
    return broken_rules(invalid_reasons(schedule.knob_arrays(), workload, gpu))


FEATURE_NAMES: tuple[str, ...] = (
    *KNOB_NAMES,
    "block_m",
    "block_n",
    "block_k",
    "warps",
    "warp_m",
    "warp_n",
    "smem_bytes",
    "est_registers",
    "blocks_per_sm",
    "tiles",
    "waves",
    "wave_efficiency",
    "k_tiles",
    "tile_intensity",
    "padding_fraction",
)


class Space(KnobArraySpace):
    """The valid schedules of one workload on one GPU, as knob arrays."""

    declaration = KNOB_DECLARATION
    schedule_type = Schedule
    workload: AnyWorkload

    invalid_reasons = staticmethod(invalid_reasons)

    @staticmethod
    def knob_grid() -> dict[str, np.ndarray]:
        return full_grid(KNOB_DECLARATION)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return FEATURE_NAMES

    @property
    def work(self) -> float:
        """FLOPs of one run: turns latency into throughput."""
        return float(self.workload.flops)

    # Derived arrays (shared by the analytical model and the features).
    @cached_property
    def block_m(self) -> np.ndarray:
        return MMA_TILE * self.knobs["warp_row_tiles"] * self.knobs["block_row_warps"]

    @cached_property
    def block_n(self) -> np.ndarray:
        return MMA_TILE * self.knobs["warp_col_tiles"] * self.knobs["block_col_warps"]

    @cached_property
    def block_k(self) -> np.ndarray:
        return MMA_TILE * self.knobs["chunk"]

    @cached_property
    def warps(self) -> np.ndarray:
        return self.knobs["block_row_warps"] * self.knobs["block_col_warps"]

    @cached_property
    def smem_bytes(self) -> np.ndarray:
        return smem_bytes(self.knobs["smem_stages"], self.block_m, self.block_n, self.block_k)

    @cached_property
    def est_registers(self) -> np.ndarray:
        k = self.knobs
        return estimate_registers(k["warp_row_tiles"], k["warp_col_tiles"], k["reg_stages"])

    @cached_property
    def predicted_registers(self) -> np.ndarray:
        k = self.knobs
        regs = predicted_registers(
            k["warp_row_tiles"], k["warp_col_tiles"], k["reg_stages"], k["chunk"]
        )
        # __launch_bounds__(threads, 1) makes ptxas fit one block per SM: per-warp register
        # allocation (in allocation units) times the block's warps within the register file.
        gpu, unit = self.gpu, self.gpu.register_alloc_unit_per_warp
        per_warp = (gpu.registers_per_sm // self.warps) // unit * unit
        return np.minimum(np.minimum(regs, gpu.max_registers_per_thread), per_warp // 32)

    @cached_property
    def blocks_per_sm(self) -> np.ndarray:
        return blocks_per_sm(self.gpu, 32 * self.warps, self.smem_bytes, self.predicted_registers)

    @cached_property
    def tile_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Tiles along M and along N of one batch entry."""
        view = self.workload.gemm_view()
        return -(-view.m // self.block_m), -(-view.n // self.block_n)

    @cached_property
    def tiles(self) -> np.ndarray:
        tm, tn = self.tile_grid
        return tm * tn * self.workload.gemm_view().batch

    @cached_property
    def k_tiles(self) -> np.ndarray:
        return -(-self.workload.gemm_view().k // self.block_k)

    def features(self) -> np.ndarray:
        """Numeric encoding for the cost model, columns named by FEATURE_NAMES."""
        view = self.workload.gemm_view()
        capacity = self.gpu.sm_count * self.blocks_per_sm
        waves = -(-self.tiles // capacity)
        tm, tn = self.tile_grid
        useful = view.m * view.n
        padded = (tm * self.block_m) * (tn * self.block_n)
        columns = [
            *(self.knobs[k] for k in KNOB_NAMES),
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps,
            MMA_TILE * self.knobs["warp_row_tiles"],
            MMA_TILE * self.knobs["warp_col_tiles"],
            self.smem_bytes,
            self.est_registers,
            self.blocks_per_sm,
            self.tiles,
            waves,
            self.tiles / (waves * capacity),
            self.k_tiles,
            self.block_m * self.block_n / (self.block_m + self.block_n),
            1.0 - useful / padded,
        ]
        return np.column_stack([np.asarray(c, dtype=np.float64) for c in columns])
