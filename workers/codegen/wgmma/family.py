"""The Hopper warpgroup-MMA GEMM family's code generator (model/hopper/): a schedule's kernel is
the wgmma kernel of this package with the TMA loader and the staged epilogue, one block per
tile, persistent, or stream-K as its ``tile_loop`` says.

What every family's generator module gives the workers: ``generate(workload, schedule)``,
``kernel_kind``, ``build_key``, ``launch_plan``, ``grid_depends_on_occupancy``, and for the
checks ``compile_sample``, ``stratified_sample``, ``stratum`` and ``tails``.

The run (``launch_plan``): A, B and C (and the bias of a GEMM with bias + GELU, a pointer after
C, its GELU form an argument after K) as the tensor-core family's kernels take them, of the
workload's element type (float16 or bfloat16: the kernel's pointer types, wgmma's operand type,
the output conversion and the tensor maps' data type follow it; a bf16 kernel is named
``..._bf16`` and built apart, as the mma.sync family's are), the two tensor maps the TMA unit
reads A and B through (encoded by the runner from A's and B's device addresses), and for
stream-K the f32 partial-sum workspace and the tiles' arrival counters (zeroed once; the
kernel leaves them zeroed). The persistent kinds size their grid from the SM count, so a runner
plans the run again with the device's (``grid_depends_on_occupancy``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetune.model.hopper.space import ARCH as HOPPER_ARCH
from pipetune.model.hopper.space import (
    PER_TILE,
    STREAM_K,
    TILE_LOOP_LABELS,
    HopperSchedule,
)
from pipetune.model.hopper.workloads import HopperWorkload
from pipetune.workers.codegen.cover import compile_sample, stratified_sample
from pipetune.workers.codegen.cuda_text import typed_key
from pipetune.workers.codegen.generator import SWIGLU_SHAPE_NOTE, KernelSource
from pipetune.workers.codegen.variants import (
    BIAS_GELU_VARIANTS,
    SCALAR_ARGS,
    SWIGLU_VARIANTS,
    b_layout_of,
    pointer_args,
    variant_of,
)
from pipetune.workers.codegen.wgmma.config import (
    BK,
    WgmmaConfig,
    stream_k_buffers,
    tensor_map_specs,
)
from pipetune.workers.codegen.wgmma.generator import kernel_name, launch, source_parts
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan

# The generator interface every family's module gives the workers (the samples are the
# generic cover's).
__all__ = [
    "HopperKernelSource",
    "build_key",
    "compile_sample",
    "config_of",
    "generate",
    "grid_depends_on_occupancy",
    "kernel_kind",
    "launch_plan",
    "shape_notes",
    "stratified_sample",
    "stratum",
    "tails",
]


@dataclass(frozen=True)
class HopperKernelSource:
    """One generated kernel: the family's schedule and the wgmma configuration that computes
    it (what the launch reads: the block tile, persistent, stream-K)."""

    variant: str  # one of config.VARIANTS
    schedule: HopperSchedule
    config: WgmmaConfig
    name: str
    code: str
    threads: int
    smem_bytes: int
    dtype: str = "float16"  # the operands' element type (model/workloads.py DTYPES)
    # wgmma and the TMA copies exist only in the arch-specific target (sm_90a), which the
    # compiler appends to the device's arch (workers/compile): that device's only.
    arch_suffix: str = "a"
    device_arch: str = HOPPER_ARCH


def config_of(schedule: HopperSchedule) -> WgmmaConfig:
    """The wgmma kernel configuration that computes a schedule."""
    return WgmmaConfig(
        schedule.tile_m,
        schedule.tile_n,
        schedule.stages,
        loader="tma",
        epilogue="staged",
        persistent=schedule.tile_loop != PER_TILE,
        stream_k=schedule.tile_loop == STREAM_K,
    )


def generate(
    workload_or_variant: HopperWorkload | str, schedule: HopperSchedule, dtype: str = "float16"
) -> HopperKernelSource:
    """A schedule's kernel for a workload (of its dtype), or for a variant on operands of
    ``dtype``."""
    w = workload_or_variant
    if isinstance(w, str):
        variant = w
    else:
        variant, dtype = variant_of(w), w.dtype
    config = config_of(schedule)
    code = "".join(source_parts(variant, config, dtype).values())  # (checks the dtype)
    return HopperKernelSource(
        variant=variant,
        schedule=schedule,
        config=config,
        name=kernel_name(variant, config, dtype),
        code=code,
        threads=config.threads,
        smem_bytes=config.smem_bytes,
        dtype=dtype,
    )


def kernel_kind(workload: HopperWorkload) -> str:
    return variant_of(workload)


def build_key(workload: HopperWorkload, schedule: HopperSchedule) -> str:
    """The variant and the element type: the shape is launch arguments, so one cubin per
    (variant, dtype, schedule). float16's key is the variant alone, as it was before
    bfloat16 (the mma.sync family's rule)."""
    variant = variant_of(workload)
    return typed_key(variant, workload.dtype)


def grid_depends_on_occupancy(kernel: HopperKernelSource) -> bool:
    """The persistent kinds run one block per SM: planned again on the device's SM count."""
    return kernel.config.persistent


def shape_notes(kernel: HopperKernelSource, workload: HopperWorkload) -> list[str]:
    """What a caller launching the kernel on another shape must know: the shape is launch
    arguments, but the TMA tensor maps hold it too, a stream-K workspace is sized for the
    shape's tiles, and a fused GEMM + SwiGLU's N and B are the GEMM's."""
    batch = (
        "`tiles` (the output tiles with the batch's: ceil(M / tile_m) x ceil(N / tile_n) x "
        "batch) is one too"
        if kernel.config.persistent
        else "the batch is the grid's z"
    )
    notes = [
        f"shape: M, N and K are arguments and {batch}, but the tensor maps hold the shape as "
        "well: on another shape encode them with that shape's dims and strides"
    ]
    if kernel.config.stream_k:
        notes.append("W and arrivals are sized for this shape's tiles and grid")
    if kernel.variant in SWIGLU_VARIANTS:
        notes.append(SWIGLU_SHAPE_NOTE)
    return notes


def grid_note(
    kernel: HopperKernelSource,
    workload: HopperWorkload,
    gpu: str,
    sm_count: int,
    blocks_per_sm: int,
    occupancy_from: str,
) -> str:
    """How a persistent grid is sized (grid_depends_on_occupancy): one block per SM, never
    the occupancy's blocks per SM. The note said it was sized from the occupancy and to size
    it again from cuOccupancyMaxActiveBlocksPerMultiprocessor: 3 blocks per SM of a stream-K
    kernel launched 396 blocks on an H100, writing past the end of W, sized for 132."""
    config = kernel.config
    work = "output tiles (`tiles`)"
    if config.stream_k:
        work = f"K steps of every output tile (`tiles` x ceil(K / {BK}))"
    note = (
        f"the grid is one block per SM: min({work}, SMs) blocks ({sm_count} SMs on {gpu}); "
        "pipetune.kernel and the cupy runner take the device's SM count "
        "(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), not its occupancy: on a device with "
        "another SM count launch that many"
    )
    if config.stream_k:
        note += (
            f", with W of grid x 2 x {config.threads} x {config.block_n // 2} floats (two "
            "partial tiles of each block's accumulators) and arrivals of one counter per tile"
        )
    return note


def launch_plan(
    kernel: HopperKernelSource, workload: HopperWorkload, sm_count: int = 1, blocks_per_sm: int = 1
) -> LaunchPlan:
    """The run on ``workload`` with ``sm_count`` SMs (the persistent grids' size;
    ``blocks_per_sm`` is the plan interface's: these kernels run one block per SM or per
    tile)."""
    from pipetune.workers.runners.reference import operand_shapes

    config = kernel.config
    view = workload.gemm_view()
    # The probe's launch reads its kernels' configuration as their schedule.
    probe_kernel = KernelSource(
        kernel.variant,
        config,  # type: ignore[arg-type]
        kernel.name,
        "",
        kernel.threads,
        kernel.smem_bytes,
        kernel.dtype,
    )
    grid, scalars = launch(probe_kernel, workload, sm_count)
    names = list(SCALAR_ARGS[kernel.variant])
    if config.persistent:
        names.append("tiles")
    b_layout = b_layout_of(kernel.variant)
    maps = tensor_map_specs(view.m, view.n, view.k, view.batch, config, workload.dtype, b_layout)
    a, b, c = operand_shapes(workload)
    bias = [Buffer("bias", (c[-1],), workload.dtype, "input")]  # (bias + GELU: N elements)
    buffers = [
        Buffer("A", a, workload.dtype, "input"),
        Buffer("B", b, workload.dtype, "input"),
        *(bias if kernel.variant in BIAS_GELU_VARIANTS else ()),
        Buffer("C", c, workload.dtype, "output"),
    ]
    trailing = [m.name for m in maps]
    if config.stream_k:
        tiles = int(scalars[-1])
        floats, counters = stream_k_buffers(config, grid[0], tiles)
        buffers += [
            Buffer("W", (floats,), "float32", "workspace"),
            Buffer("arrivals", (counters,), "uint32", "workspace"),
        ]
        trailing += ["W", "arrivals"]
    entry = KernelLaunch(
        kernel=kernel.name,
        grid=grid,
        block=(kernel.threads, 1, 1),
        smem_bytes=kernel.smem_bytes,
        arguments=(*pointer_args(kernel.variant), *names, *trailing),
        scalars=dict(zip(names, scalars, strict=True)),
        trailing=tuple(trailing),
    )
    return LaunchPlan(buffers=tuple(buffers), launches=(entry,), output="C", tensor_maps=maps)


# ---- the checks' strata and tails (their samples: workers/codegen/cover.py) ------------------


def stratum(schedule: HopperSchedule) -> str:
    """The stratum a correctness check counts a schedule in: its tile loop and warpgroups."""
    return f"{TILE_LOOP_LABELS[schedule.tile_loop]}-{schedule.tile_m // 64}wg"


def tails(workload: HopperWorkload, schedule: HopperSchedule) -> dict[str, bool]:
    """Where a schedule leaves a partial tile: rows ("m"), columns ("n"), a last K tile ("k")."""
    view = workload.gemm_view()
    return {
        "m": view.m % schedule.tile_m != 0,
        "n": view.n % schedule.tile_n != 0,
        "k": view.k % BK != 0,
    }
