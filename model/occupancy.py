"""Occupancy: how many threadblocks of a kernel are resident on one SM at once, shared by
every kernel family's space (a family passes its threads, shared memory and registers per
block; the limits are the GPU's)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipetune.model.hardware import GPUSpec


def blocks_per_sm(gpu: GPUSpec, threads: Any, smem: Any, registers: Any) -> np.ndarray:
    """Resident threadblocks per SM under the thread, smem, register and block limits."""
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
