"""Occupancy, waves and tiles against hand-computed cases."""

from __future__ import annotations

import numpy as np

from pipetune.model.analytical import evaluate
from pipetune.model.space import Schedule, Space, blocks_per_sm
from pipetune.model.workloads import gemm


def test_occupancy_limited_by_smem(h100):
    # 128 threads, 48 KiB smem, 128 regs. threads: 2048/128 = 16;
    # smem: 233472 // (49152 + 1024) = 4;
    # registers: 128*32 = 4096 per warp -> 16 warps per SM -> 4 blocks of 4 warps.
    assert blocks_per_sm(h100, 128, 49152, 128).item() == 4


def test_occupancy_limited_by_registers(h100):
    # 232 regs -> 7424 per warp (already a multiple of 256) -> 65536 // 7424 = 8 warps -> 2 blocks.
    assert blocks_per_sm(h100, 128, 8192, 232).item() == 2
    # 233 regs round up to 7680 per warp -> 8 warps still; 256 threads -> 1 block
    assert blocks_per_sm(h100, 256, 8192, 233).item() == 1


def test_occupancy_limited_by_threads_and_block_cap(a100):
    assert blocks_per_sm(a100, 1024, 1024, 32).item() == 2  # 2048 threads per SM
    assert blocks_per_sm(a100, 32, 0, 32).item() == 32  # max blocks per SM


def test_waves_of_a_large_gemm(h100):
    workload = gemm(4096, 4096, 4096)
    space = Space.enumerate(workload, h100)
    s = Schedule(
        block_row_warps=2,
        block_col_warps=4,
        warp_row_tiles=4,
        warp_col_tiles=4,
        chunk=1,
        smem_stages=3,
        reg_stages=1,
    )
    i = space.index(s)
    # 128x256 tiles: 32 * 16 = 512 tiles; 200 regs -> 6400 per warp -> 10 warps per SM,
    # so one 8-warp block per SM; 132 SMs
    assert (s.block_m, s.block_n) == (128, 256)
    assert space.tiles[i] == 512
    assert space.blocks_per_sm[i] == 1
    p = evaluate(space)
    assert p.N_threadblk_batch[i] == 4  # ceil(512 / 132)
    assert p.N_threadblk_per_threadblk_batch[i] == 132


def test_small_output_spreads_blocks_one_per_sm(h100):
    # 1024x64 output with 64x64 tiles: 16 tiles on 132 SMs -> one block per SM, one wave.
    space = Space.enumerate(gemm(1024, 64, 2048), h100)
    p = evaluate(space)
    mask = (space.block_m == 64) & (space.block_n == 64)
    assert mask.any()
    assert np.all(p.N_threadblk_per_SM[mask] == 1)
    assert np.all(p.N_threadblk_batch[mask] == 1)
    assert np.all(p.N_threadblk_per_threadblk_batch[mask] == 16)
