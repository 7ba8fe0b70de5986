"""`pipetune calibrate`: measure the GPU's memory and tensor-core constants and write a
hardware profile that model.hardware applies over the spec sheet.

The microbenchmarks (workers.calibrate.microbench) need CuPy and a GPU and run in an
isolated child process with a time limit; turning their timings into a profile
(workers.calibrate.profile) is pure and tested without a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipetune.model.hardware import HardwareError, get_gpu, resolve_gpu_key
from pipetune.workers.calibrate.profile import (
    METHOD,
    CalibrationError,
    CalibrationUnavailableError,
    CalibrationUsageError,
    Chase,
    Cycles,
    MmaRun,
    RawMeasurements,
    Throughput,
    build_profile,
    validate_profile,
    write_profile,
)
from pipetune.workers.runners.base import cupy_missing

__all__ = [
    "METHOD",
    "CalibrationError",
    "CalibrationUnavailableError",
    "CalibrationUsageError",
    "Chase",
    "Cycles",
    "MmaRun",
    "RawMeasurements",
    "Throughput",
    "build_profile",
    "run_calibration",
    "validate_profile",
    "write_profile",
]


def run_calibration(
    gpu: str | None = None,
    *,
    device: int = 0,
    timeout_s: float = 600.0,
    timing_floor_us: float | None = None,
) -> dict[str, Any]:
    """Run the microbenchmarks on CUDA device ``device`` and return the profile document.
    ``timing_floor_us``: the runner's timing floor on the device, where it was measured (the
    campaign's probe), for kernel_launch_ns (RawMeasurements.timing_floor_seconds).

    ``gpu`` names the spec to calibrate (default: the one the device's name resolves to).
    Raises CalibrationUnavailableError without CuPy or a GPU, CalibrationError if a benchmark
    fails or its numbers make no valid profile.
    """
    if missing := cupy_missing():
        raise CalibrationUnavailableError(f"calibrate needs CuPy and an NVIDIA GPU; {missing}")
    from pipetune.workers.calibrate import microbench
    from pipetune.workers.runners.isolation import IsolatedWorker

    with IsolatedWorker(name="pipetune-calibrate") as worker:
        probe = worker.call(microbench.probe_device, device, timeout_s=120)
        if not probe.ok:
            raise CalibrationUnavailableError(f"no usable CUDA GPU: {probe.error}")
        device_name = probe.value
        try:
            key = resolve_gpu_key(gpu) if gpu else resolve_gpu_key(device_name)
        except HardwareError as exc:
            if gpu:
                raise
            raise CalibrationError(
                f"the model has no spec for device '{device_name}'; name one with --gpu"
            ) from exc
        if gpu:
            try:
                detected = resolve_gpu_key(device_name)
            except HardwareError:
                detected = key  # a device the model cannot name: take the caller's word
            if detected != key:
                raise CalibrationUsageError(
                    f"--gpu: asked to calibrate {key}, but the device is {detected} ({device_name})"
                )
        spec = get_gpu(key, calibrated=False)  # calibrate against the spec sheet itself
        outcome = worker.call(microbench.run_microbenchmarks, device, spec, timeout_s=timeout_s)
        if not outcome.ok:
            raise CalibrationError(f"microbenchmarks failed: {outcome.error}")
    raw = outcome.value
    if timing_floor_us is not None:
        raw = dataclasses.replace(raw, timing_floor_seconds=(timing_floor_us * 1e-6,))
    return build_profile(raw, spec)
