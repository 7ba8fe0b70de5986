"""The bottleneck baseline ALCOP compares against (Section 5.4).

Latency is the largest of compute, shared-memory loading and device-memory time at full
throughput: tensor cores aggregated over the GPU, the L2 -> shared copies of every tile at
the L2 bandwidth, and the compulsory DRAM traffic at the DRAM bandwidth. It ignores
occupancy and latency hiding, which is what the analytical model adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipetune.model.analytical import BYTES_FP16
from pipetune.model.space import Space


@dataclass(frozen=True)
class RooflinePrediction:
    T_compute: np.ndarray
    T_smem_load: np.ndarray
    T_DRAM_load: np.ndarray

    @property
    def T_kernel(self) -> np.ndarray:
        return np.maximum(np.maximum(self.T_compute, self.T_smem_load), self.T_DRAM_load)

    @property
    def bottleneck(self) -> np.ndarray:
        stacked = np.stack([self.T_compute, self.T_smem_load, self.T_DRAM_load])
        return np.array(["compute", "smem", "dram"])[np.argmax(stacked, axis=0)]


def evaluate(space: Space) -> RooflinePrediction:
    gpu, workload = space.gpu, space.workload
    tiles = space.tiles.astype(np.float64)
    k_steps = space.k_tiles.astype(np.float64) * space.block_k
    # The kernel computes whole (padded) tiles, so padding costs compute.
    padded_flops = 2.0 * tiles * space.block_m * space.block_n * k_steps
    T_compute = padded_flops / (gpu.sm_count * gpu.sm_tensor_flops)
    smem_bytes = tiles * (space.block_m + space.block_n) * k_steps * BYTES_FP16
    T_smem_load = smem_bytes / (gpu.l2_bandwidth_gbs * 1e9)
    T_dram = np.full(len(space), workload.compulsory_bytes / (gpu.dram_bandwidth_gbs * 1e9))
    return RooflinePrediction(T_compute=T_compute, T_smem_load=T_smem_load, T_DRAM_load=T_dram)
