"""The schedule space of the Hopper warpgroup-MMA GEMM family.

A schedule is the block's output tile (``tile_m`` x ``tile_n``, one 128-thread warpgroup per 64
rows), the depth of the shared-memory ring the TMA unit fills with 64-deep K tiles
(``stages``), and how blocks walk the output tiles (``tile_loop``): one block per tile, a
persistent grid of one block per SM walking tiles, or stream-K (the blocks share out all the
tiles' K steps evenly). The kernel is workers/codegen/wgmma/ with the TMA loader and the staged
epilogue (the probe's fastest kind on every operator: benchmarks/RESULTS.md, "wgmma probe on
H100 ..."); its shared memory is computed here as that module's ``WgmmaConfig.smem_bytes`` does
(tests/test_hopper_family.py checks the two agree on every knob combination).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, ClassVar

import numpy as np

from pipetune.model.hardware import GPUSpec
from pipetune.model.hopper.workloads import HopperWorkload
from pipetune.model.knobs import (
    Knob,
    KnobArraySpace,
    KnobSchedule,
    broken_rules,
    check_schedule_type,
    full_grid,
)
from pipetune.model.occupancy import blocks_per_sm

TILE_LOOP_LABELS = {0: "tile_per_block", 1: "persistent", 2: "stream_k"}
PER_TILE, PERSISTENT, STREAM_K = 0, 1, 2

KNOBS: tuple[Knob, ...] = (
    Knob("tile_m", (64, 128, 192, 256), True, "output tile rows: one warpgroup per 64"),
    Knob("tile_n", (64, 128, 192, 256), True, "output tile columns (one wgmma's N)"),
    Knob("stages", (3, 4, 5, 6, 7, 8), True, "shared-memory ring of 64-deep K tiles"),
    Knob(
        "tile_loop",
        (PER_TILE, PERSISTENT, STREAM_K),
        False,
        "how blocks walk the output tiles: one block per tile, one block per SM walking "
        "tiles, or one block per SM with an equal share of all tiles' K steps (stream-K)",
        TILE_LOOP_LABELS,
    ),
)
KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)

ARCH = "sm_90"  # wgmma and the TMA unit: Hopper only
BK = 64  # halves per K tile (one 128-byte swizzle line per row of A)
WARPGROUP_ROWS = 64
WARPGROUP_THREADS = 128
# The kernel's own shared memory besides its stages (workers/codegen/wgmma/config.py):
ALIGN_SLACK = 1024  # the ring starts on a 1024-byte boundary (the swizzle reads bits 7-9)
MBARRIER_BYTES = 8  # one per stage
C_ROW_PAD_BYTES = 16  # the staged C tile's rows are padded (bank conflicts)
STREAM_K_FLAG_BYTES = 16
# Registers per thread besides the f32 accumulators (tile_n / 2 per thread: a warpgroup's
# m64nNk16 accumulators spread over its 128 threads): addresses, loop state, the epilogue's
# conversions. ptxas used 26-32 more for every shape of the family (sm_90a, NVRTC 13); the
# stream-K kernel's summing pass asks for more, but ptxas fits it into what one block per SM
# leaves without spilling (every stream-K shape of the space, checked).
REGISTER_OVERHEAD = 32
MAX_REGISTERS_PER_THREAD = 255


@dataclass(frozen=True, order=True)
class HopperSchedule(KnobSchedule):
    declaration: ClassVar[tuple[Knob, ...]] = KNOBS
    tile_m: int
    tile_n: int
    stages: int
    tile_loop: int

    @property
    def id(self) -> str:
        """Stable, readable id, as the wgmma probe names its shapes: "wg128x256s3_p"."""
        return f"wg{self.tile_m}x{self.tile_n}s{self.stages}{_LOOP_SUFFIX[self.tile_loop]}"

    @classmethod
    def from_id(cls, text: str) -> HopperSchedule | None:
        """The schedule whose `id` is `text`; None where `text` is no such id."""
        match = _ID.fullmatch(text)
        if match is None:
            return None
        tile_m, tile_n, stages, suffix = match.groups()
        loop = {v: k for k, v in _LOOP_SUFFIX.items()}[suffix]
        return cls.from_dict(
            {"tile_m": int(tile_m), "tile_n": int(tile_n), "stages": int(stages), "tile_loop": loop}
        )


_LOOP_SUFFIX = {PER_TILE: "", PERSISTENT: "_p", STREAM_K: "_sk"}
_ID = re.compile(r"wg(\d+)x(\d+)s(\d+)(|_p|_sk)")


check_schedule_type(HopperSchedule, KNOBS)


def _ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b)


def threads(knobs: dict[str, Any]) -> np.ndarray:
    return np.asarray(knobs["tile_m"], dtype=np.int64) // WARPGROUP_ROWS * WARPGROUP_THREADS


def smem_bytes(knobs: dict[str, Any]) -> np.ndarray:
    """Dynamic shared memory per block: the ring, its barriers, and for the persistent kinds a
    C tile of their own (the staged epilogue of a one-tile block reuses the ring)."""
    tm = np.asarray(knobs["tile_m"], dtype=np.int64)
    tn = np.asarray(knobs["tile_n"], dtype=np.int64)
    stages = np.asarray(knobs["stages"], dtype=np.int64)
    loop = np.asarray(knobs["tile_loop"], dtype=np.int64)
    after = stages * MBARRIER_BYTES
    c_tile = tm * (tn * 2 + C_ROW_PAD_BYTES)
    after = np.where(loop != PER_TILE, _ceil_div(after, 16) * 16 + c_tile, after)
    after = after + np.where(loop == STREAM_K, STREAM_K_FLAG_BYTES, 0)
    return stages * (tm + tn) * BK * 2 + ALIGN_SLACK + after


def registers(knobs: dict[str, Any]) -> np.ndarray:
    """Estimated registers per thread: the accumulators plus a fixed allowance."""
    return np.asarray(knobs["tile_n"], dtype=np.int64) // 2 + REGISTER_OVERHEAD


def invalid_reasons(
    knobs: dict[str, np.ndarray], workload: HopperWorkload, gpu: GPUSpec
) -> dict[str, np.ndarray]:
    """Boolean arrays, one per rule, True where a schedule breaks that rule."""
    view = workload.gemm_view()
    tm = np.asarray(knobs["tile_m"], dtype=np.int64)
    tn = np.asarray(knobs["tile_n"], dtype=np.int64)
    t = threads(knobs)
    regs = registers(knobs)
    hopper = np.full(len(tm), gpu.arch == ARCH)
    return {
        "needs a Hopper GPU (sm_90: wgmma and the TMA unit)": ~hopper,
        "shared memory over the per-block limit": smem_bytes(knobs) > gpu.smem_per_block_bytes,
        "registers over the SM's (accumulators of the whole tile)": (
            (t * regs > gpu.registers_per_sm) | (regs > MAX_REGISTERS_PER_THREAD)
        ),
        # A tile a whole warpgroup or 64 columns wider than the product only computes padding.
        "tile taller than the product": tm > _ceil_div(view.m, WARPGROUP_ROWS) * WARPGROUP_ROWS,
        "tile wider than the product": tn > _ceil_div(view.n, 64) * 64,
    }


def schedule_problems(
    schedule: HopperSchedule, workload: HopperWorkload, gpu: GPUSpec
) -> list[str]:
    """Why one schedule is outside the valid space (empty when it is valid)."""
    return broken_rules(invalid_reasons(schedule.knob_arrays(), workload, gpu))


@cache
def static_grid() -> dict[str, np.ndarray]:
    return full_grid(KNOBS)


FEATURE_NAMES: tuple[str, ...] = (
    "tile_m",
    "tile_n",
    "stages",
    "persistent",
    "stream_k",
    "log_tiles",
    "tiles_per_sm",
    "k_steps",
    "log_smem",
    "tile_waste",
)


class HopperSpace(KnobArraySpace):
    """The valid schedules of one Hopper workload on one GPU (one int64 array per knob)."""

    declaration = KNOBS
    schedule_type = HopperSchedule

    knob_grid = staticmethod(static_grid)
    invalid_reasons = staticmethod(invalid_reasons)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return FEATURE_NAMES

    @property
    def work(self) -> float:
        return float(self.workload.flops)

    @property
    def smem_bytes(self) -> np.ndarray:
        return smem_bytes(self.knobs)

    @cached_property
    def blocks_per_sm(self) -> np.ndarray:
        """Resident blocks per SM: the occupancy for one block per tile; one for the persistent
        kinds, whose grid is one block per SM."""
        resident = blocks_per_sm(
            self.gpu, threads(self.knobs), self.smem_bytes, registers(self.knobs)
        )
        return np.where(self.knobs["tile_loop"] == PER_TILE, resident, 1).astype(np.int64)

    @cached_property
    def tiles(self) -> np.ndarray:
        """Output tiles of the whole batch."""
        view = self.workload.gemm_view()
        k = self.knobs
        return _ceil_div(view.m, k["tile_m"]) * _ceil_div(view.n, k["tile_n"]) * view.batch

    def features(self) -> np.ndarray:
        view = self.workload.gemm_view()
        k = self.knobs
        tm, tn = k["tile_m"], k["tile_n"]
        computed = self.tiles * tm * tn / view.batch
        columns = [
            tm,
            tn,
            k["stages"],
            k["tile_loop"] == PERSISTENT,
            k["tile_loop"] == STREAM_K,
            np.log(self.tiles),
            self.tiles / self.gpu.sm_count,
            np.full(len(self), _ceil_div(view.k, BK)),
            np.log(self.smem_bytes),
            computed / (view.m * view.n) - 1.0,  # padding computed beyond the product
        ]
        return np.column_stack([np.asarray(c, dtype=np.float64) for c in columns])
