"""The Hopper family's analytical model: a warpgroup-MMA GEMM's time from its tiles, its ring of
TMA-loaded K tiles and how its blocks walk the tiles, over a whole space at once.

Per K step of one output tile (64 deep), an SM spends the longest of:
    T_mma  = 2 * tile_m * tile_n * 64 / (the SM's tensor FLOPs per second * n_eff)
             n_eff = tile_n / (tile_n + N_ISSUE): a narrow wgmma spends relatively more of
             its time issuing and waiting than multiplying;
    T_load = (tile_m + tile_n) * 64 * 2 bytes / the SM's share of the L2 bandwidth (at most
             its port);
    T_lat  = the memory latency / (stages - 2) tiles in flight / the blocks on the SM: a ring
             too shallow for the latency leaves the tensor cores waiting (ALCOP's point, here for
             the TMA unit's loads).
Per output tile, a block also waits once for its first tile (the latency) and writes its C tile
(T_epi: tile_m * tile_n * 2 bytes at the SM's share of the DRAM write bandwidth).

How the blocks walk the tiles sets how often those are paid, on the busiest SM:
- one block per tile: ceil(tiles / SMs) tiles; co-resident blocks hide one another's latency and
  fixed costs (they are paid once per round of co-resident blocks);
- persistent: one block per SM walks ceil(tiles / SMs) tiles; the next tile's loads run during a
  tile's C store, so the first-tile wait is paid once, the C stores each time;
- stream-K: one block per SM takes an equal share of all tiles' K steps (ceil(steps / SMs)), and
  a tile that several blocks share costs its partial sums: each sharing block stores one f32
  tile and the last to finish reads them back (FIXUP).
The run takes at least its compulsory DRAM traffic at the DRAM bandwidth.

The constants are the GPU spec's (or its calibrated profile's) and two assumptions (N_ISSUE, the
L2 port). Checked against the family's first sweep (the H200's 15 operators, 1,749 schedules,
2026-11-30; benchmarks/RESULTS.md "GPU calls on H200, 2026-11-30"): top-10 0.975, mean Spearman
0.72; N_ISSUE from 0 to 128 and the port from 32 B/clk to unbounded move top-10 between 0.956
and 0.990 and Spearman between 0.63 and 0.72, the assumed pair among the best on both; no tile
loop, stage count or tile size is mispredicted as a class by more than 6% (each operator's median
error taken out), the latency- and DRAM-bound schedules (124) run 11-13% slower than modelled.
Left as they are until a second GPU's sweep can tell a fit from noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pipetune.model.hopper.space import (
    BK,
    PER_TILE,
    PERSISTENT,
    STREAM_K,
    TILE_LOOP_LABELS,
    HopperSpace,
)
from pipetune.model.knobs import PredictedLatencies

N_ISSUE = 32  # columns' worth of a wgmma's fixed issue and wait cost (assumed)
L2_PORT_BYTES_PER_CLK = 64  # what one SM can draw from L2 per clock (assumed)
F32 = 4
F16 = 2


@dataclass(frozen=True)
class HopperPrediction(PredictedLatencies):
    """The model's terms for every schedule of a space (arrays aligned with it; seconds)."""

    space: HopperSpace
    T_kernel: np.ndarray
    T_step: np.ndarray  # one K step of one tile on the busiest SM
    T_mma: np.ndarray
    T_load: np.ndarray
    T_lat: np.ndarray
    T_epi: np.ndarray
    T_fixed: np.ndarray  # first-tile waits, C stores and stream-K fix-ups of the busiest SM
    T_dram: np.ndarray
    steps_per_sm: np.ndarray  # K steps the busiest SM runs
    blocks_per_sm: np.ndarray

    @cached_property
    def bottleneck(self) -> np.ndarray:
        names = np.array(["mma", "load", "latency"])
        which = np.argmax(np.column_stack([self.T_mma, self.T_load, self.T_lat]), axis=1)
        return np.where(self.T_dram >= self.T_kernel, "dram", names[which])

    def terms(self, i: int) -> dict[str, Any]:
        us = 1e6
        return {
            "predicted_us": float(self.T_kernel[i] * us),
            # (as the mma.sync family's terms say it: `model rank --json` had no TFLOP/s for
            # these kernels while its table showed one)
            "predicted_tflops": float(self.space.workload.flops / self.T_kernel[i] / 1e12),
            "tile_loop": TILE_LOOP_LABELS[int(self.space.knobs["tile_loop"][i])],
            "tiles": int(self.space.tiles[i]),
            "steps_per_sm": int(self.steps_per_sm[i]),
            "blocks_per_sm": int(self.blocks_per_sm[i]),
            "T_step_us": float(self.T_step[i] * us),
            "T_mma_us": float(self.T_mma[i] * us),
            "T_load_us": float(self.T_load[i] * us),
            "T_lat_us": float(self.T_lat[i] * us),
            "T_fixed_us": float(self.T_fixed[i] * us),
            "T_dram_us": float(self.T_dram[i] * us),
            "bottleneck": str(self.bottleneck[i]),
        }


def evaluate(space: HopperSpace) -> HopperPrediction:
    gpu = space.gpu
    view = space.workload.gemm_view()
    k = space.knobs
    tm, tn = k["tile_m"].astype(np.float64), k["tile_n"].astype(np.float64)
    stages, loop = k["stages"], k["tile_loop"]
    clock = gpu.boost_clock_mhz * 1e6
    sms = gpu.sm_count
    ks = -(-view.k // BK)
    tiles = space.tiles
    steps = tiles * ks

    # Blocks on the busiest SM at once: the occupancy for one block per tile (never more than
    # its share of the tiles), one for the persistent kinds (one block per SM).
    resident = space.blocks_per_sm
    per_sm_tiles = -(-tiles // sms)
    together = np.where(loop == PER_TILE, np.minimum(np.maximum(resident, 1), per_sm_tiles), 1)
    active = np.minimum(np.where(loop == STREAM_K, steps, tiles), sms)

    T_mma = 2 * tm * tn * BK / (gpu.tensor_fp16_flops_per_clk_per_sm * clock) * (tn + N_ISSUE) / tn
    l2_share = np.minimum(gpu.l2_bandwidth_gbs * 1e9 / active, L2_PORT_BYTES_PER_CLK * clock)
    T_load = (tm + tn) * BK * F16 / l2_share
    latency = gpu.dram_latency_ns * 1e-9
    T_lat = latency / (stages - 2) / together
    T_step = np.maximum(np.maximum(T_mma, T_load), T_lat)
    write_share = gpu.dram_write_bandwidth_gbs * 1e9 / active
    T_epi = tm * tn * F16 / write_share

    per_block_steps = -(-steps // active)  # stream-K: each block's share
    tiles_touched = -(-per_block_steps // ks) + 1  # a share crosses at most this many tiles
    shared = (steps % active != 0) | (per_block_steps % ks != 0)
    sharers = -(-active // tiles) + 1  # blocks whose shares touch one tile, at most
    T_fixup = np.where(shared, (2 + sharers) * tm * tn * F32 / l2_share, 0.0)

    rounds = -(-per_sm_tiles // together)  # rounds of co-resident blocks (one block per tile)
    steps_per_sm = np.select(
        [loop == PER_TILE, loop == PERSISTENT],
        [per_sm_tiles * ks, per_sm_tiles * ks],
        per_block_steps,
    )
    T_fixed = np.select(
        [loop == PER_TILE, loop == PERSISTENT],
        [rounds * (latency + T_epi), latency + per_sm_tiles * T_epi],
        latency + np.minimum(tiles_touched, per_sm_tiles + 1) * T_epi + T_fixup,
    )
    T_sm = steps_per_sm * T_step + T_fixed
    T_dram = np.full(len(space), space.workload.compulsory_bytes / (gpu.dram_bandwidth_gbs * 1e9))
    return HopperPrediction(
        space=space,
        T_kernel=np.maximum(T_sm, T_dram),
        T_step=T_step,
        T_mma=T_mma,
        T_load=T_load,
        T_lat=T_lat,
        T_epi=T_epi,
        T_fixed=T_fixed,
        T_dram=T_dram,
        steps_per_sm=steps_per_sm,
        blocks_per_sm=together,
    )


def per_tile_blocks(space: HopperSpace) -> np.ndarray:
    """The family's baseline: one block per output tile (the kernel the probe began with), so a
    gain over the best of these is the tile loop's (persistent or stream-K)."""
    return space.knobs["tile_loop"] == PER_TILE
