"""The profile phase: `pipetune calibrate`'s hardware profile of the device.

On a GPU: workers.calibrate.run_calibration (the microbenchmarks in their own child). In a
simulated campaign: the spec sheet's values with noise, through the same profile builder
and validation (workers.calibrate.profile), marked ``simulated`` so that nothing can install
it as a measured profile (``pipetune campaign unpack`` refuses it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipetune.model.hardware import get_gpu
from pipetune.workers.calibrate.profile import (
    Chase,
    Cycles,
    MmaRun,
    RawMeasurements,
    Throughput,
    build_profile,
)

SIMULATED_METHOD = "simulated: the spec sheet's values x lognormal noise (sigma 0.03); not measured"


def simulated_raw(gpu_key: str, seed: int = 0) -> RawMeasurements:
    """Microbenchmark timings a device exactly like the spec sheet would give, with noise."""
    spec = get_gpu(gpu_key, calibrated=False)
    rng = np.random.default_rng(seed)

    def seconds(value: float) -> tuple[float, ...]:
        return tuple(float(value * np.exp(0.03 * z)) for z in rng.standard_normal(7))

    size = 1 << 30
    steps = 100_000
    mma_count = 10**9
    mma_s = mma_count * 4096 / (spec.sm_tensor_flops * spec.sm_count)  # 4096 flops per mma
    return RawMeasurements(
        device_name=f"simulated {spec.name}",
        sm_count=spec.sm_count,
        l2_bytes=spec.l2_bytes,
        dram_copy=Throughput(2 * size, seconds(2 * size / (spec.dram_bandwidth_gbs * 1e9))),
        dram_write=Throughput(size, seconds(size / (spec.dram_write_bandwidth_gbs * 1e9))),
        l2_read=Throughput(size, seconds(size / (spec.l2_bandwidth_gbs * 1e9))),
        dram_chase=Chase(steps, seconds(steps * spec.dram_latency_ns * 1e-9 + 5e-6), (5e-6,)),
        l2_chase=Chase(steps, seconds(steps * spec.l2_latency_ns * 1e-9 + 5e-6), (5e-6,)),
        smem_chase_cycles_per_load=spec.smem_latency_ns * spec.boost_clock_mhz / 1e3,
        clock=Cycles(10**8, seconds(10**8 / (spec.boost_clock_mhz * 1e6))),
        mma=MmaRun(mma_count, seconds(mma_s)),
    )


def run_profile(
    gpu_key: str, *, simulated: bool, device: int = 0, timing_floor_us: float | None = None
) -> dict[str, Any]:
    """The profile document (CalibrationError when the microbenchmarks fail);
    ``timing_floor_us``: the probe's, for kernel_launch_ns (run_calibration)."""
    if simulated:
        spec = get_gpu(gpu_key, calibrated=False)
        document = build_profile(simulated_raw(gpu_key), spec, method=SIMULATED_METHOD)
        return {**document, "runner": "simulated", "simulated": True}
    from pipetune.workers.calibrate import run_calibration

    document = run_calibration(gpu_key, device=device, timing_floor_us=timing_floor_us)
    return {**document, "runner": "cupy", "simulated": False}
