"""The schedule space of the pipelined tensor-core GEMM family (docs/architecture.md,
"Kernel families").

A schedule is one value per knob. A :class:`Space` is the set of schedules that are valid
for one workload on one GPU, held as one numpy array per knob so that the models evaluate
the whole space at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Annotated, Any, get_type_hints

import numpy as np

from pipetune.model.hardware import GPUSpec
from pipetune.model.workloads import AnyWorkload

MMA_TILE = 16  # one warp-level tile step: mma.sync m16n8k16 covers 16 rows and 16 of K
VECTOR_ELEMS = 8  # float16 elements per 16-byte cp.async


@dataclass(frozen=True)
class KnobSpec:
    """One tunable of the kernel family: the values it takes and what it sets (the family
    interface's Knob, model/family.py, is built from these)."""

    values: tuple[int, ...]
    meaning: str


@dataclass(frozen=True)
class KnobValues:
    """The seven knobs, declared once. `Schedule` (below) and the wire's `ScheduleDoc`
    inherit these fields; `KNOBS`, the wire schema's enums and the code generator's checks
    are read from the annotations. A new knob is one line here."""

    block_row_warps: Annotated[int, KnobSpec((1, 2, 4), "warps per block along M")]
    block_col_warps: Annotated[int, KnobSpec((1, 2, 4), "warps per block along N")]
    warp_row_tiles: Annotated[int, KnobSpec((1, 2, 4), "16-wide tiles per warp along M")]
    warp_col_tiles: Annotated[int, KnobSpec((1, 2, 4), "16-wide tiles per warp along N")]
    chunk: Annotated[int, KnobSpec((1, 2, 4, 8), "the K step of a block tile: BK = 16 * chunk")]
    smem_stages: Annotated[
        int,
        KnobSpec((1, 2, 3, 4, 5, 6), "shared-memory pipeline depth (1: none, 2: double buffering)"),
    ]
    reg_stages: Annotated[int, KnobSpec((1, 2), "register-fragment buffers (2: double buffering)")]


def _declared_knobs() -> dict[str, KnobSpec]:
    hints = get_type_hints(KnobValues, include_extras=True)
    return {
        f.name: next(m for m in hints[f.name].__metadata__ if isinstance(m, KnobSpec))
        for f in fields(KnobValues)
    }


KNOB_SPECS: dict[str, KnobSpec] = _declared_knobs()
KNOBS: dict[str, tuple[int, ...]] = {name: knob.values for name, knob in KNOB_SPECS.items()}
KNOB_NAMES: tuple[str, ...] = tuple(KNOBS)

# Register estimate per thread (why: the space must not call a schedule valid that spills).
# Accumulators: the warp tile in fp32 spread over 32 lanes. Fragments per k16 step: an A
# 16x16 tile and a B 16x16 tile (two n8 halves) take 4 registers each per lane, times the
# register stages. The rest (addresses, predicates, loop state) is a fixed allowance that
# the NVRTC compile tests check against ptxas.
REGISTER_OVERHEAD = 40


class ScheduleError(ValueError):
    """A schedule document with unknown knobs or values outside the space."""


@dataclass(frozen=True, order=True)
class Schedule(KnobValues):
    """One value per knob (the fields of KnobValues, in their order)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        if not isinstance(data, dict):
            raise ScheduleError("a schedule must be an object of knob values")
        unknown = sorted(set(data) - set(KNOB_NAMES))
        if unknown:
            raise ScheduleError(f"unknown knob(s): {', '.join(unknown)}")
        missing = [k for k in KNOB_NAMES if k not in data]
        if missing:
            raise ScheduleError(f"missing knob(s): {', '.join(missing)}")
        problems = knob_value_problems(data)
        if problems:
            raise ScheduleError(problems[0])
        return cls(**{k: data[k] for k in KNOB_NAMES})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def id(self) -> str:
        """Stable, readable id: the knob values in KNOB_NAMES order."""
        return "s-" + "-".join(str(getattr(self, k)) for k in KNOB_NAMES)

    @property
    def hash(self) -> str:
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:12]

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


def knob_value_problems(values: dict[str, Any]) -> list[str]:
    """Why knob values are outside their declared domains (empty when none is); an int
    only, never a bool. Schedule.from_dict and the code generator check with this."""
    problems = []
    for name, allowed in KNOBS.items():
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
            problems.append(f"{name} must be one of {list(allowed)}, got {value!r}")
    return problems


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


def blocks_per_sm(gpu: GPUSpec, threads: Any, smem: Any, registers: Any) -> np.ndarray:
    """Occupancy: resident threadblocks per SM under the thread, smem, register, block limits."""
    threads = np.asarray(threads, dtype=np.int64)
    smem = np.asarray(smem, dtype=np.int64)
    registers = np.asarray(registers, dtype=np.int64)
    warps = threads // 32
    by_threads = gpu.max_threads_per_sm // threads
    smem_alloc = smem + gpu.smem_reserved_per_block_bytes
    by_smem = gpu.smem_per_sm_bytes // smem_alloc
    unit = gpu.register_alloc_unit_per_warp
    regs_per_warp = -(-registers * 32 // unit) * unit
    by_regs = (gpu.registers_per_sm // regs_per_warp) // warps
    limit = np.minimum(np.minimum(by_threads, by_smem), by_regs)
    return np.minimum(limit, gpu.max_blocks_per_sm).astype(np.int64)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _full_grid() -> dict[str, np.ndarray]:
    mesh = np.meshgrid(*[np.array(v, dtype=np.int64) for v in KNOBS.values()], indexing="ij")
    return {name: grid.ravel() for name, grid in zip(KNOB_NAMES, mesh, strict=True)}


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
    knobs = {k: np.array([v], dtype=np.int64) for k, v in schedule.as_dict().items()}
    return [rule for rule, bad in invalid_reasons(knobs, workload, gpu).items() if bad[0]]


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


class Space:
    """The valid schedules of one workload on one GPU, as knob arrays."""

    def __init__(self, workload: AnyWorkload, gpu: GPUSpec, knobs: dict[str, np.ndarray]):
        self.workload = workload
        self.gpu = gpu
        self.knobs = {k: np.ascontiguousarray(knobs[k], dtype=np.int64) for k in KNOB_NAMES}

    @classmethod
    def enumerate(cls, workload: AnyWorkload, gpu: GPUSpec) -> Space:
        grid = _full_grid()
        bad = np.zeros(len(grid[KNOB_NAMES[0]]), dtype=bool)
        for mask in invalid_reasons(grid, workload, gpu).values():
            bad |= mask
        return cls(workload, gpu, {k: v[~bad] for k, v in grid.items()})

    def __len__(self) -> int:
        return len(self.knobs[KNOB_NAMES[0]])

    def __getitem__(self, i: int) -> Schedule:
        return Schedule(**{k: int(self.knobs[k][i]) for k in KNOB_NAMES})

    def __iter__(self) -> Iterator[Schedule]:
        for i in range(len(self)):
            yield self[i]

    def subset(self, index: np.ndarray) -> Space:
        return Space(self.workload, self.gpu, {k: v[index] for k, v in self.knobs.items()})

    @cached_property
    def ids(self) -> list[str]:
        return [s.id for s in self]

    @cached_property
    def _position(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.ids)}

    def index(self, schedule: Schedule) -> int:
        """Position of a schedule in the space; KeyError if it is not a valid member."""
        return self._position[schedule.id]

    @property
    def cache_key(self) -> tuple:
        """Identifies the space's contents, for caches of per-space arrays."""
        return (self.workload.workload_hash, self.gpu.key, self.gpu.profile, len(self))

    @property
    def feature_names(self) -> tuple[str, ...]:
        return FEATURE_NAMES

    @property
    def work(self) -> float:
        """FLOPs of one run: turns latency into throughput."""
        return float(self.workload.flops)

    def __contains__(self, schedule: object) -> bool:
        return isinstance(schedule, Schedule) and schedule.id in self._position

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
