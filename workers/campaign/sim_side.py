"""The simulated twin of workers/campaign/cuda_side.py: the same functions with the same
arguments, run in the same kind of child, answering without a GPU and saying so.

- ``describe``: the stand-in GPU's spec sheet (model.hardware), every name prefixed
  "simulated";
- ``library_checks``: the same comparisons (workers.campaign.checks) with numpy standing in
  for CuPy and for cuDNN, so that the checking code runs; each answer is marked simulated;
- ``vendor_time``: a stand-in for the vendor library, the larger of the tensor-core time at
  ``LIBRARY_EFFICIENCY`` of the spec's peak (for a family whose work is FLOPs; the
  memory-intensive operators have none to speak of) and the compulsory DRAM traffic at the
  spec's bandwidth, through the timing loop on a model clock. Not a measurement of anything.
"""

from __future__ import annotations

import math
import platform
from typing import Any

import numpy as np

from pipetune.workers.campaign.checks import conv_check, direct_conv2d, matmul_checks
from pipetune.workers.runners.sim_child import ModelClock
from pipetune.workers.runners.simulated import DEFAULT_REPEAT_SIGMA, noise_rng
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

_STATE: dict[str, Any] = {}
LIBRARY_EFFICIENCY = 0.7  # of the dense fp16 peak (wgmma): a stand-in, not a claim


def init(device: int, stand_in: str | None = None) -> dict[str, Any]:
    from pipetune.model.hardware import get_gpu

    spec = get_gpu(stand_in or "h100")
    _STATE.clear()
    _STATE.update(device=device, spec=spec, flush_bytes=max(2 * spec.l2_bytes, 64 << 20))
    return {"device": device, "flush_bytes": _STATE["flush_bytes"], "simulated": True}


def describe() -> dict[str, Any]:
    spec = _STATE["spec"]
    return {
        "device": _STATE["device"],
        "name": f"simulated {spec.name}",
        "arch": spec.arch,
        "sm_count": spec.sm_count,
        "clock_mhz": round(spec.boost_clock_mhz),
        "memory_clock_mhz": None,
        "memory_bus_bits": None,
        "memory_bytes": None,
        "l2_bytes": spec.l2_bytes,
        "smem_per_block_optin": spec.smem_per_block_bytes,
        "smem_per_sm": spec.smem_per_sm_bytes,
        "cuda_driver": None,
        "cuda_driver_version": None,
        "cuda_runtime": None,
        "cuda_runtime_version": None,
        "cupy": None,
        "cupy_nvrtc": None,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "nvidia_smi": None,
        "torch": None,
        "simulated": True,
    }


def library_checks() -> dict[str, dict[str, Any]]:
    checks = matmul_checks(np, np.asarray)

    def numpy_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
        return direct_conv2d(x, w, stride, pad).astype(np.float16)

    checks["conv_fp16_cudnn"] = conv_check(numpy_conv)
    for answer in checks.values():
        answer["simulated"] = "numpy stands in for the library"
    return checks


def vendor_time(canonical: dict[str, Any], seed: int, policy: RepeatPolicy) -> dict[str, Any]:
    from pipetune.model.family import family_of, parse_any_workload

    spec = _STATE["spec"]
    workload = parse_any_workload(canonical)
    fam = family_of(workload)
    compute_s = 0.0
    if fam.work_unit == "flop":
        compute_s = fam.work(workload) / (spec.peak_tensor_tflops * 1e12 * LIBRARY_EFFICIENCY)
    memory_s = workload.compulsory_bytes / (spec.dram_bandwidth_gbs * 1e9)
    rng = noise_rng(seed, workload.workload_hash, "vendor")
    clock = ModelClock(max(compute_s, memory_s) * 1e3, rng, DEFAULT_REPEAT_SIGMA)
    samples = time_launches(lambda: None, lambda: None, clock, policy)
    assert all(math.isfinite(s) for s in samples)
    if fam.work_unit == "flop":
        library = (
            "simulated: max(flops at 70% of the spec's fp16 peak, compulsory bytes at the "
            "spec's DRAM bandwidth); not a library"
        )
    else:
        library = "simulated: compulsory bytes at the spec's DRAM bandwidth; not a library"
    return {"library": library, "samples_ms": samples, "simulated": True}
