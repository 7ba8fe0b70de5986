"""What a worker tells the service about its GPU.

A cupy worker detects its device through CuPy in a short-lived child process (the worker
process itself never creates a CUDA context; the cupy runner's own child does the
measuring). A simulated or replay worker stands in for a GPU the model knows (`--gpu`), and
describes that GPU from model.hardware.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass

from pipetune.model.errors import PipetuneError
from pipetune.model.hardware import GPUSpec, HardwareError, get_gpu, resolve_gpu_key
from pipetune.workers.runners.base import cupy_missing

PROBE_TIMEOUT_S = 120.0


class DetectionError(PipetuneError, RuntimeError):
    """No usable GPU, or one the worker cannot describe."""


@dataclass(frozen=True)
class DeviceInfo:
    gpu: str  # model.hardware key the service matches jobs by (with arch)
    arch: str
    device_name: str
    sm_count: int | None = None
    driver: str | None = None
    clocks_mhz: int | None = None


def describe_model_gpu(gpu: str, runner: str, device_name: str | None = None) -> DeviceInfo:
    """A simulated or replay worker's stand-in GPU, from the model's spec."""
    spec: GPUSpec = get_gpu(gpu)
    return DeviceInfo(
        gpu=spec.key,
        arch=spec.arch,
        device_name=device_name or f"{runner}: {spec.name}",
        sm_count=spec.sm_count,
        driver=None,
        clocks_mhz=round(spec.boost_clock_mhz),
    )


def _nvidia_smi_driver(device: int) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(device)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def probe_cupy(device: int = 0, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """Run workers.daemon.probe in a child; its JSON answer (or DetectionError)."""
    if missing := cupy_missing():  # (the child's last line was a bare ModuleNotFoundError)
        raise DetectionError(f"no usable CUDA GPU through CuPy: {missing}")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pipetune.workers.daemon.probe", str(device)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise DetectionError(f"the GPU probe did not answer within {timeout_s:g} s") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise DetectionError(f"no usable CUDA GPU through CuPy: {last}")
    return json.loads(out.stdout)


def detect_cupy(device: int = 0, gpu: str | None = None) -> DeviceInfo:
    """The device as CuPy sees it. `gpu` (a model key) is required only for a device the
    model has no spec for; when given for a known device it must match."""
    found = probe_cupy(device)
    try:
        detected: str | None = resolve_gpu_key(found["name"])
    except HardwareError:
        detected = None
    if gpu is not None:
        key = resolve_gpu_key(gpu)
        if detected is not None and detected != key:
            raise DetectionError(f"--gpu {key} was given, but device {device} is {found['name']}")
    elif detected is None:
        raise DetectionError(
            f"device {device} is {found['name']!r}, which the model does not know; "
            "pass --gpu with the closest known GPU"
        )
    else:
        key = detected
    driver = _nvidia_smi_driver(device) or found.get("cuda_driver")
    return DeviceInfo(
        gpu=key,
        arch=found["arch"],
        device_name=found["name"],
        sm_count=found.get("sm_count"),
        driver=driver,
        clocks_mhz=found.get("clock_mhz"),
    )
