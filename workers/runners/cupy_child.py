"""The cupy runner's GPU side: functions that run inside the isolated child process.

Importable without CuPy (the parent pickles references to these functions); each function
imports CuPy itself. The child holds its state in ``_STATE``: the L2 flush buffer, and the
inputs, reference and tolerance of the one workload it is measuring.
workers/runners/sim_child.py is this module's simulated twin: the same functions with the
same arguments, answering from the analytical model (tests/test_campaign_sides.py checks
that the two stay in step).

One trial: load the cubin, set the kernel's dynamic shared-memory limit, fill C with NaN,
launch once, check C against the fp32 reference (workers.runners.reference), then time it
as workers.runners.timing says (warm-up, then repeats each after a write of a buffer twice
the L2's size, so every repeat starts from cold L2 as the kernel would in a network, with
a CUDA event pair around each launch). Any CUDA error ends the trial with
``poisoned=True``: a kernel fault leaves the CUDA context unusable, so the parent replaces
this process before the next trial. Trials come in batches (:func:`run_trials`), which stop
at the first poisoned trial.

References are kept on local disk across child restarts (workers.runners.reference_cache).
Convolutions can take their reference from cuDNN (PyTorch, channels-last, fp32 math, TF32
off) instead of the im2col product through cuBLAS: an implementation of convolution that
shares nothing with pipetune's, used by the campaign's correctness phase.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipetune.workers.runners import reference_cache
from pipetune.workers.runners.reference import (
    check,
    make_inputs,
    operand_shapes,
    reference,
    tolerance,
)
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

_STATE: dict[str, Any] = {}
MIN_FLUSH_BYTES = 64 << 20
CONV_REFERENCES = ("cublas", "cudnn")


@dataclass(frozen=True)
class TrialSpec:
    """Everything the child needs to run one compiled kernel (picklable, no CuPy types)."""

    workload_hash: str
    schedule_id: str
    cubin_path: str | None  # None: generated but not compiled (simulated launches only)
    kernel_name: str
    threads: int
    smem_bytes: int  # dynamic shared memory per block
    grid: tuple[int, int, int]
    scalars: tuple[int, ...]  # int32 arguments after the A, B, C pointers
    policy: RepeatPolicy
    model_us: float | None = None  # the analytical model's latency (the simulated twin's)


class CupyClock:
    """CUDA events on CuPy's current stream (workers.runners.timing.Clock)."""

    def __init__(self, cupy: Any):
        self.cupy = cupy

    def pair(self) -> tuple[Any, Any]:
        return self.cupy.cuda.Event(), self.cupy.cuda.Event()

    def record(self, event: Any) -> None:
        event.record()

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.cupy.cuda.get_elapsed_time(start, end))


def _cuda_errors() -> tuple[type[BaseException], ...]:
    import cupy

    return (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)


def init_device(device: int, stand_in: str | None = None) -> dict[str, Any]:
    """Select the device and describe it (the isolated worker's initializer). ``stand_in``
    is the simulated twin's GPU; a real device describes itself."""
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
        "flush_bytes": int(_STATE["flush"].nbytes),
    }


def cudnn_reference(cupy: Any, workload: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """(ref, tol) of a convolution through cuDNN (PyTorch): channels-last tensors, fp32 math
    on the fp16 inputs with TF32 off, and |x|*|w| through the same convolution for the
    tolerance's magnitude term."""
    import torch
    import torch.nn.functional as functional

    torch.backends.cudnn.allow_tf32 = False
    spatial = a.ndim - 2
    cupy.cuda.Device().synchronize()
    x, w = torch.from_dlpack(a), torch.from_dlpack(b)
    # NHWC (NDHWC) storage seen as NCHW (NCDHW): the channels-last layout cuDNN takes as is.
    channels_first = (0, spatial + 1, *range(1, spatial + 1))
    x32, w32 = x.permute(*channels_first).float(), w.permute(*channels_first).float()
    conv = functional.conv2d if spatial == 2 else functional.conv3d
    with torch.no_grad():
        product = conv(x32, w32, stride=workload.stride, padding=workload.pad)
        magnitude = conv(x32.abs(), w32.abs(), stride=workload.stride, padding=workload.pad)
    channels_last = (0, *range(2, spatial + 2), 1)
    product = product.permute(*channels_last).contiguous()
    magnitude = magnitude.permute(*channels_last).contiguous()
    torch.cuda.synchronize()
    ref = cupy.array(cupy.from_dlpack(product), copy=True)
    tol = tolerance(cupy, ref, cupy.from_dlpack(magnitude), workload.gemm_view().k)
    cupy.cuda.Device().synchronize()
    del x, w, x32, w32, product, magnitude
    torch.cuda.empty_cache()
    return ref.astype(cupy.float32, copy=False), tol.astype(cupy.float32, copy=False)


def reference_method(workload: Any, conv_reference: str) -> str:
    """How the reference of a workload is computed: "cublas" (GEMM, BMM), "cublas-im2col" or
    "cudnn" (convolutions, as ``conv_reference`` asks)."""
    if workload.op not in ("conv2d", "conv3d"):
        return "cublas"
    return "cudnn" if conv_reference == "cudnn" else "cublas-im2col"


def _compute_reference(
    cupy: Any, workload: Any, a: Any, b: Any, conv_reference: str
) -> tuple[Any, Any, str, str | None]:
    """(ref, tol, method, why the asked-for method was not used)."""
    method = reference_method(workload, conv_reference)
    why = None
    if method == "cudnn":
        try:
            ref, tol = cudnn_reference(cupy, workload, a, b)
            return ref, tol, method, None
        except Exception as exc:  # no PyTorch or no cuDNN here: the cuBLAS reference stands in
            why = f"cuDNN reference unavailable ({type(exc).__name__}: {exc})"
    ref, tol = reference(cupy, workload, a, b)
    return ref, tol, reference_method(workload, "cublas"), why


def prepare_workload(
    canonical: dict[str, Any],
    seed: int,
    cache_dir: str | None = None,
    conv_reference: str = "cublas",
) -> dict[str, Any]:
    """Upload the inputs and set up the reference and tolerance for one workload (from the
    disk cache when an earlier child computed them)."""
    import cupy

    from pipetune.model.workloads import parse_workload

    if conv_reference not in CONV_REFERENCES:
        raise ValueError(f"conv_reference must be one of {CONV_REFERENCES}")
    started = time.perf_counter()
    workload = parse_workload(canonical)
    _STATE.pop("workload", None)
    cupy.get_default_memory_pool().free_all_blocks()
    a_host, b_host = make_inputs(workload, seed)
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    notes: list[str] = []

    def compute() -> tuple[Any, Any, str]:
        ref, tol, used, why = _compute_reference(cupy, workload, a, b, conv_reference)
        notes.extend([why] if why else [])
        return ref, tol, used

    ref, tol, used, from_disk = reference_cache.cached_reference(
        cupy,
        workload.workload_hash,
        seed,
        reference_method(workload, conv_reference),
        Path(cache_dir) if cache_dir else None,
        compute,
        to_host=cupy.asnumpy,
    )
    c = cupy.empty(operand_shapes(workload)[2], dtype=cupy.float16)
    cupy.cuda.Device().synchronize()
    _STATE["workload"] = (workload.workload_hash, a, b, c, ref, tol)
    return {
        "workload_hash": workload.workload_hash,
        "reference": used,
        "reference_note": notes[0] if notes else None,
        "reference_from_disk": from_disk,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _failed(status: str, error: str, *, poisoned: bool) -> dict[str, Any]:
    return {"status": status, "error": error, "poisoned": poisoned}


def _flush() -> None:
    _STATE["flush"].fill(0)


def run_trial(spec: TrialSpec) -> dict[str, Any]:
    """Verify and time one kernel. Returns {"status", "samples_ms"?, "max_abs_error"?,
    "error"?, "poisoned"?}; status is ok, launch_error, runtime_error or wrong_result."""
    import cupy

    prepared = _STATE.get("workload")
    if prepared is None or prepared[0] != spec.workload_hash:
        raise RuntimeError("run_trial before prepare_workload for this workload")
    if spec.cubin_path is None:
        raise RuntimeError(f"no cubin for {spec.kernel_name}: a real launch needs one")
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
    try:
        samples = time_launches(launch, _flush, CupyClock(cupy), spec.policy)
    except cuda_errors as exc:
        return _failed("runtime_error", f"timed runs: {exc}", poisoned=True)
    return {"status": "ok", "samples_ms": samples, "max_abs_error": max_error, "verified": True}


def run_trials(specs: list[TrialSpec]) -> list[dict[str, Any]]:
    """run_trial for each spec in order, stopping after the first poisoned answer (the
    parent replaces this process and sends the rest again)."""
    answers = []
    for spec in specs:
        answer = run_trial(spec)
        answers.append(answer)
        if answer.get("poisoned"):
            break
    return answers


def timing_floor(cubin_path: str, kernel_name: str, policy: RepeatPolicy) -> list[float]:
    """Milliseconds of an empty kernel (one block of 32 threads) timed exactly as trials
    are: the floor of what a measured latency can be on this device."""
    import cupy

    kernel = cupy.RawModule(path=cubin_path).get_function(kernel_name)

    def launch() -> None:
        kernel((1, 1, 1), (32, 1, 1), ())

    launch()
    cupy.cuda.get_current_stream().synchronize()
    return time_launches(launch, _flush, CupyClock(cupy), policy)
