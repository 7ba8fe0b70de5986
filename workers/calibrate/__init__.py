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


def measured_timing_floor(spec: Any, device: int) -> float | None:
    """The cupy runner's timing floor on the device (µs: an empty kernel timed as a worker
    times its trials, as the campaign's probe measures it), or None where it cannot be had
    (the profile then takes the chases' empty launch). `pipetune calibrate` wrote that lone
    launch's 9.8 µs where the campaign's profile had the floor's 3.4: a user's own profile
    replaced the shipped one and brought the memory-intensive model's 1.5x back."""
    from pipetune.workers.runners.cupy_runner import CupyRunner

    try:
        runner = CupyRunner(spec, device=device, trial_timeout_s=15.0, compile_workers=1)
    except Exception:  # (the microbenchmarks ran: a runner that cannot start is not fatal)
        return None
    try:
        return float(runner.measure_floor())
    except Exception:
        return None
    finally:
        runner.close()


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
    if timing_floor_us is None:
        timing_floor_us = measured_timing_floor(spec, device)
    if timing_floor_us is not None:
        raw = dataclasses.replace(raw, timing_floor_seconds=(timing_floor_us * 1e-6,))
    return build_profile(raw, spec)
