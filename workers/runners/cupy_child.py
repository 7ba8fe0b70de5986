"""The cupy runner's GPU side: functions that run inside the isolated child process.

Importable without CuPy (the parent pickles references to these functions); each function
imports CuPy itself. The child holds its state in ``_STATE``: the L2 flush buffer, and the
inputs, reference and tolerance of the one workload it is measuring.

One trial: load the cubin, set the kernel's dynamic shared-memory limit, fill C with NaN,
launch once, check C against the fp32 reference (workers.runners.reference), then
``warmup`` untimed launches and ``repeats`` timed ones, each after a write of a buffer
twice the L2's size (so every repeat starts from cold L2, as the kernel would in a
network), with a CUDA event pair around each launch. Any CUDA error ends the trial with
``poisoned=True``: a kernel fault leaves the CUDA context unusable, so the parent replaces
this process before the next trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.workers.runners.reference import check, make_inputs, operand_shapes, reference

_STATE: dict[str, Any] = {}
MIN_FLUSH_BYTES = 64 << 20


@dataclass(frozen=True)
class TrialSpec:
    """Everything the child needs to run one compiled kernel (picklable, no CuPy types)."""

    workload_hash: str
    cubin_path: str
    kernel_name: str
    threads: int
    smem_bytes: int  # dynamic shared memory per block
    grid: tuple[int, int, int]
    scalars: tuple[int, ...]  # int32 arguments after the A, B, C pointers
    warmup: int
    repeats: int


def _cuda_errors() -> tuple[type[BaseException], ...]:
    import cupy

    return (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)


def init_device(device: int) -> dict[str, Any]:
    """Select the device and describe it (the isolated worker's initializer)."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if device >= count:
        raise RuntimeError(f"CUDA device {device} requested, {count} present")
    cupy.cuda.Device(device).use()
    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    l2_bytes = int(props["l2CacheSize"])
    _STATE.clear()
    _STATE["flush"] = cupy.empty(max(2 * l2_bytes, MIN_FLUSH_BYTES), dtype=cupy.uint8)
    return {
        "device": device,
        "name": name,
        "arch": f"sm_{props['major']}{props['minor']}",
        "sm_count": int(props["multiProcessorCount"]),
        "l2_bytes": l2_bytes,
        "smem_per_block_optin": int(props["sharedMemPerBlockOptin"]),
        "cupy_version": cupy.__version__,
        "cuda_runtime_version": int(cupy.cuda.runtime.runtimeGetVersion()),
        "cuda_driver_version": int(cupy.cuda.runtime.driverGetVersion()),
    }


def prepare_workload(canonical: dict[str, Any], seed: int) -> dict[str, Any]:
    """Upload the inputs and compute the reference and tolerance for one workload."""
    import cupy

    from pipetune.model.workloads import parse_workload

    workload = parse_workload(canonical)
    _STATE.pop("workload", None)
    cupy.get_default_memory_pool().free_all_blocks()
    a_host, b_host = make_inputs(workload, seed)
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    ref, tol = reference(cupy, workload, a, b)
    c = cupy.empty(operand_shapes(workload)[2], dtype=cupy.float16)
    cupy.cuda.Device().synchronize()
    _STATE["workload"] = (workload.workload_hash, a, b, c, ref, tol)
    return {"workload_hash": workload.workload_hash}


def _failed(status: str, error: str, *, poisoned: bool) -> dict[str, Any]:
    return {"status": status, "error": error, "poisoned": poisoned}


def run_trial(spec: TrialSpec) -> dict[str, Any]:
    """Verify and time one kernel. Returns {"status", "samples_ms"?, "max_abs_error"?,
    "error"?, "poisoned"?}; status is ok, launch_error, runtime_error or wrong_result."""
    import cupy

    prepared = _STATE.get("workload")
    if prepared is None or prepared[0] != spec.workload_hash:
        raise RuntimeError("run_trial before prepare_workload for this workload")
    _, a, b, c, ref, tol = prepared
    cuda_errors = _cuda_errors()
    try:
        kernel = cupy.RawModule(path=spec.cubin_path).get_function(spec.kernel_name)
        kernel.max_dynamic_shared_size_bytes = spec.smem_bytes
    except cuda_errors as exc:
        return _failed("launch_error", f"loading the kernel: {exc}", poisoned=True)
    args = (a, b, c, *(np.int32(v) for v in spec.scalars))
    block = (spec.threads, 1, 1)

    def launch() -> None:
        kernel(spec.grid, block, args, shared_mem=spec.smem_bytes)

    c.view(cupy.uint16).fill(0xFFFF)  # fp16 NaN: an output the kernel never writes fails
    try:
        launch()
    except cuda_errors as exc:
        return _failed("launch_error", f"launch: {exc}", poisoned=True)
    try:
        cupy.cuda.get_current_stream().synchronize()
    except cuda_errors as exc:
        return _failed("runtime_error", f"kernel execution: {exc}", poisoned=True)

    passed, max_error, why = check(cupy, c, ref, tol)
    if not passed:
        return {"status": "wrong_result", "max_abs_error": max_error, "error": why}

    flush = _STATE["flush"]
    try:
        for _ in range(spec.warmup):
            launch()
        events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(spec.repeats)]
        for start, end in events:
            flush.fill(0)
            start.record()
            launch()
            end.record()
        events[-1][1].synchronize()
        samples = [float(cupy.cuda.get_elapsed_time(start, end)) for start, end in events]
    except cuda_errors as exc:
        return _failed("runtime_error", f"timed runs: {exc}", poisoned=True)
    return {"status": "ok", "samples_ms": samples, "max_abs_error": max_error}
