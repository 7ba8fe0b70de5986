"""From raw microbenchmark timings to a hardware profile (pure: no GPU, tested on the CPU).

A profile is the JSON that model.hardware reads::

    {"gpu": "h100", "device_name": "NVIDIA H100 80GB HBM3", "date": "...",
     "method": "...", "overrides": {GPUSpec field: value, ...}, "raw": {...}}

Every override name is a GPUSpec field; :func:`build_profile` checks the document through
model.hardware.parse_profile and GPUSpec.with_overrides before anyone writes it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

from pipetune.model.errors import PipetuneError
from pipetune.model.hardware import GPUSpec, HardwareError, parse_profile
from pipetune.workers.datasets.files import write_atomic

MMA_FLOPS = 2 * 16 * 8 * 16  # one mma.sync m16n8k16: 16x8 outputs, 16-deep dot products
MAX_MMA_EFFICIENCY = 1.05  # above the spec peak by more than noise: the inputs are wrong

METHOD = (
    "pipetune calibrate (CuPy RawKernels, CUDA events, median of repeats): "
    "DRAM bandwidth = grid-stride float4 copy (read + write bytes) and store-only kernel over "
    "buffers >= 8x L2; L2 bandwidth = repeated __ldcg float4 reads of a buffer of 1/4 L2; "
    "DRAM/L2 latency = single-thread __ldcg pointer chase over a random cycle of 256-byte-spaced "
    "nodes: >= 4x L2, every launch on untouched nodes / 1/4 L2 after two warm laps (minus an "
    "empty launch; includes TLB effects); "
    "shared-memory latency = pointer chase in shared memory timed with clock64; "
    "SM clock = clock64 cycles / event time of a spinning kernel on every SM; "
    "kernel_launch_ns = the timing floor where it was measured (an empty kernel, 1 block of 32 "
    "threads, timed as every trial is: the campaign's probe), else the chases' empty launch "
    "(one thread, no loads) between two events, median over both chases' runs; "
    "mma_sync_efficiency = back-to-back mma.sync.m16n8k16 f32.f16.f16.f32 on registers "
    "(8 independent chains per warp, 32 warps per SM) / "
    "(tensor_fp16_flops_per_clk_per_sm x clock x SMs), clock = the measured one if any; "
    "raw.k_step_cycles (recorded, not applied) = clock64 cycles per step of a 4-stage "
    "cp.async issue, commit, wait and barrier loop, 128 threads, one block per SM, median"
)


class CalibrationError(PipetuneError, RuntimeError):
    """Measurements that cannot make a valid profile, or a microbenchmark that failed."""


class CalibrationUnavailableError(CalibrationError):
    """No GPU (or no CuPy) to calibrate."""


class CalibrationUsageError(CalibrationError):
    """The caller's mistake, found on the device: a --gpu that is not the device's model."""


@dataclass(frozen=True)
class Throughput:
    """A kernel that moves ``bytes`` per run; wall time of each run in seconds."""

    bytes: int
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class Chase:
    """``steps`` dependent loads per run, and the same launch with no steps (overhead)."""

    steps: int
    seconds: tuple[float, ...]
    baseline_seconds: tuple[float, ...]


@dataclass(frozen=True)
class Cycles:
    """``cycles`` SM clock cycles counted per run, against the event time of each run."""

    cycles: int
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class MmaRun:
    """``mma_count`` mma.sync m16n8k16 instructions over the whole GPU per run."""

    mma_count: int
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class RawMeasurements:
    device_name: str
    sm_count: int
    l2_bytes: int
    dram_copy: Throughput
    l2_read: Throughput
    dram_chase: Chase
    l2_chase: Chase
    mma: MmaRun
    clock: Cycles | None = None
    dram_write: Throughput | None = None
    smem_chase_cycles_per_load: float | None = None
    # Recorded, not applied: the model's k_step_cycles is the value that ranks the H200
    # sweeps best (model/hardware.py); this measures the barrier-and-wait part of it, to be
    # compared with that fit before it may replace it.
    k_step_cycles: float | None = None
    # An empty kernel timed as every trial is (the runner's timing floor: the campaign's
    # probe measures it), in seconds: what one launch adds to a measured latency, which
    # kernel_launch_ns is to the memory-intensive model. The chases' lone empty launch between
    # two events took 9.8 us on the H100, where the floor is 3.4 us and the fastest measured
    # memops kernels 4.5 us: the model then predicted them at 1.5x their measured times.
    timing_floor_seconds: tuple[float, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median_s(what: str, seconds: Sequence[float]) -> float:
    if not seconds or not all(math.isfinite(s) and s > 0 for s in seconds):
        raise CalibrationError(f"{what}: timings must be positive, got {list(seconds)!r}")
    return median(seconds)


def bandwidth_gbs(what: str, run: Throughput) -> float:
    if run.bytes <= 0:
        raise CalibrationError(f"{what}: no bytes moved")
    return run.bytes / _median_s(what, run.seconds) / 1e9


def latency_ns(what: str, chase: Chase) -> float:
    if chase.steps <= 0:
        raise CalibrationError(f"{what}: no steps")
    elapsed = _median_s(what, chase.seconds) - median(chase.baseline_seconds or (0.0,))
    if elapsed <= 0:
        raise CalibrationError(f"{what}: the chase took no longer than an empty launch")
    return elapsed / chase.steps * 1e9


def clock_mhz(run: Cycles) -> float:
    if run.cycles <= 0:
        raise CalibrationError("clock: no cycles counted")
    return run.cycles / _median_s("clock", run.seconds) / 1e6


def mma_efficiency(run: MmaRun, spec: GPUSpec, clock: float, sm_count: int) -> float:
    """Achieved mma.sync FLOP/s over the spec peak at this clock and SM count."""
    achieved = run.mma_count * MMA_FLOPS / _median_s("mma", run.seconds)
    peak = spec.tensor_fp16_flops_per_clk_per_sm * clock * 1e6 * sm_count
    return achieved / peak


def build_profile(
    raw: RawMeasurements,
    spec: GPUSpec,
    *,
    date: str | None = None,
    method: str = METHOD,
) -> dict[str, Any]:
    """The profile document for ``spec``'s GPU from raw measurements (validated)."""
    overrides: dict[str, Any] = {}
    clock = spec.boost_clock_mhz
    if raw.clock is not None:
        clock = clock_mhz(raw.clock)
        overrides["boost_clock_mhz"] = clock
    # The device's own counts, where they differ from the spec (an H100 PCIe is not SXM).
    if raw.sm_count != spec.sm_count:
        overrides["sm_count"] = raw.sm_count
    if raw.l2_bytes != spec.l2_bytes:
        overrides["l2_bytes"] = raw.l2_bytes
    overrides["dram_bandwidth_gbs"] = bandwidth_gbs("DRAM copy", raw.dram_copy)
    if raw.dram_write is not None:
        overrides["dram_write_bandwidth_gbs"] = bandwidth_gbs("DRAM write", raw.dram_write)
    overrides["l2_bandwidth_gbs"] = bandwidth_gbs("L2 read", raw.l2_read)
    overrides["dram_latency_ns"] = latency_ns("DRAM chase", raw.dram_chase)
    overrides["l2_latency_ns"] = latency_ns("L2 chase", raw.l2_chase)
    empty = raw.dram_chase.baseline_seconds + raw.l2_chase.baseline_seconds
    if raw.timing_floor_seconds:
        # What one launch adds to a latency measured as trials are (the memory-intensive
        # model's T_launch): the runner's timing floor.
        overrides["kernel_launch_ns"] = _median_s("timing floor", raw.timing_floor_seconds) * 1e9
    elif empty:
        # Else the empty launch the chases time to subtract from their own runs (a lone launch
        # between two events: an overestimate, see RawMeasurements.timing_floor_seconds).
        overrides["kernel_launch_ns"] = _median_s("empty launch", empty) * 1e9
    if raw.smem_chase_cycles_per_load is not None:
        if not raw.smem_chase_cycles_per_load > 0:
            raise CalibrationError("shared-memory chase: cycles per load must be positive")
        overrides["smem_latency_ns"] = raw.smem_chase_cycles_per_load / clock * 1e3
    efficiency = mma_efficiency(raw.mma, spec, clock, raw.sm_count)
    if efficiency > MAX_MMA_EFFICIENCY:
        raise CalibrationError(
            f"mma.sync reached {efficiency:.2f}x the spec peak of {spec.key}: the spec's "
            "tensor throughput or the measured clock is wrong for this device"
        )
    overrides["mma_sync_efficiency"] = efficiency
    document = {
        "gpu": spec.key,
        "device_name": raw.device_name,
        "date": date or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "method": method,
        "overrides": overrides,
        "raw": raw.as_dict(),
    }
    validate_profile(document, spec)
    return document


def validate_profile(document: dict[str, Any], spec: GPUSpec) -> GPUSpec:
    """The spec with the profile applied; CalibrationError if model.hardware refuses it."""
    try:
        target, overrides = parse_profile(document, "calibration profile")
        if target is not None and target != spec.key:
            raise HardwareError(f"profile is for '{target}', not '{spec.key}'")
        return spec.with_overrides(overrides, profile="calibration")
    except HardwareError as exc:
        raise CalibrationError(str(exc)) from None


def write_profile(document: dict[str, Any], path: str | Path) -> Path:
    """Write the profile JSON atomically (never a half-written profile for get_gpu)."""
    return write_atomic(path, json.dumps(document, indent=2, allow_nan=False) + "\n")
