"""Occupancy: how many threadblocks of a kernel are resident on one SM at once, shared by
every kernel family's space (a family passes its threads, shared memory and registers per
block; the limits are the GPU's)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipetune.model.hardware import GPUSpec

# What the CUDA occupancy calculator (cudaOccupancy.h) adds to the limits below: each SM's
# register file is split over its four sub-partitions, a warp's registers coming from one of
# them, and a block's shared memory (its reserve included) is allocated in 128-byte units.
# Every GPU pipetune models (Ampere, Hopper) has four sub-partitions per SM.
SUB_PARTITIONS = 4
SMEM_ALLOC_UNIT_BYTES = 128


def blocks_per_sm(
    gpu: GPUSpec, threads: Any, smem: Any, registers: Any, *, cuda_rules: bool = False
) -> np.ndarray:
    """Resident threadblocks per SM under the thread, smem, register and block limits.

    `cuda_rules`: as the driver counts them (the sub-partitions' register files, shared
    memory in allocation units), where a grid must fit in one wave of resident blocks (a
    launch document's fused split: a block that cannot start leaves its row's blocks
    waiting). Without, the model's own count, which those rules make at most equal (up to a
    few blocks fewer for blocks of one or two warps, or shared memory off the unit): the
    analytical model and the spaces were calibrated with it, and changing it shifts their
    predictions by up to 6% on memory-intensive schedules, which is for a session with
    GPU measurements to judge."""
    threads = np.asarray(threads, dtype=np.int64)
    smem = np.asarray(smem, dtype=np.int64)
    registers = np.asarray(registers, dtype=np.int64)
    warps = threads // 32
    by_threads = gpu.max_threads_per_sm // threads
    smem_alloc = smem + gpu.smem_reserved_per_block_bytes
    if cuda_rules:
        smem_alloc = -(-smem_alloc // SMEM_ALLOC_UNIT_BYTES) * SMEM_ALLOC_UNIT_BYTES
    by_smem = gpu.smem_per_sm_bytes // smem_alloc
    unit = gpu.register_alloc_unit_per_warp
    regs_per_warp = -(-registers * 32 // unit) * unit
    if cuda_rules:
        per_partition = gpu.registers_per_sm // SUB_PARTITIONS // regs_per_warp
        by_regs = per_partition * SUB_PARTITIONS // warps
    else:
        by_regs = (gpu.registers_per_sm // regs_per_warp) // warps
    limit = np.minimum(np.minimum(by_threads, by_smem), by_regs)
    return np.minimum(limit, gpu.max_blocks_per_sm).astype(np.int64)
