"""The cupy runner's GPU side: functions that run inside the isolated child process.

Importable without CuPy (the parent pickles references to these functions); each function
imports CuPy itself. The child holds its state in ``_STATE``: the L2 flush buffer, and the
input buffers, reference and tolerance of the one workload it is measuring.
workers/runners/sim_child.py is this module's simulated twin: the same functions with the
same arguments, answering from the analytical model (tests/test_campaign_gpu_side.py checks
that the two stay in step).

A trial runs a :class:`~pipetune.workers.launch_plan.LaunchPlan`, whatever the kernel
family: load the cubin, raise each entry's dynamic shared-memory limit, take the input
buffers by name (the family's reference module made them), fill the outputs with NaN, zero
the workspaces once (the kernels leave them zeroed), encode the plan's TMA tensor maps from
their operands' device addresses and upload them (workers.runners.tensor_maps), launch the
plan's kernels in order with their int32 and float32 scalars (and the pointers some take
after them), check the output buffer against the fp32 reference (the family's reference
module: workers.runners.reference for the tensor-core GEMMs,
workers.runners.memops_reference for the memory-intensive operators), then time the whole
run as workers.runners.timing says (warm-up, then repeats each after a write of a buffer
twice the L2's size, so every repeat starts from cold L2 as the kernel would in a network,
with a CUDA event pair around the run), then check the last timed run's output again and
that the inputs are unchanged (their checksums as uploaded). A verify-only trial whose
policy says ``check_again`` (the correctness phase's) launches once more instead of the
timed runs, its outputs NaN again and its workspaces as the first run left them, and that
output is checked the same way. A kernel right only on its
first run, or one that stores into an input, is a wrong result, and the latter ends the
trial with ``poisoned=True`` so that the next trials get a new child and pristine inputs.
A plan whose grid is sized from the resident blocks of one wave (fused cross-block
reductions wait for the other blocks of their row: the grid must be at most one wave) is
planned again here with the driver's occupancy of the loaded kernel, never the model's.
Any CUDA error ends the trial with ``poisoned=True``: a kernel fault leaves the CUDA context
unusable, so the parent replaces this process before the next trial. Trials come in
batches (:func:`run_trials`), which stop at the first poisoned trial.

References are kept on local disk across child restarts (workers.runners.reference_cache).
Convolutions can take their reference from cuDNN (PyTorch, channels-last, fp32 math, TF32
off) instead of the im2col product through cuBLAS: an implementation of convolution that
shares nothing with pipetune's, used by the campaign's correctness phase.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipetune.workers.launch_plan import KernelLaunch, LaunchPlan
from pipetune.workers.runners import elements, reference_cache, tensor_maps
from pipetune.workers.runners.reference import CONV_REFERENCES
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

_STATE: dict[str, Any] = {}
MIN_FLUSH_BYTES = 64 << 20
# What a kernel right on its first run and wrong on the second is told (a failure of its
# own: a workspace the kernel leaves dirty, which every timed trial would have met).
SECOND_RUN_WRONG = "on a second run on the same inputs (a workspace left dirty?)"
__all__ = ["CONV_REFERENCES", "CupyClock", "TrialSpec"]  # CONV_REFERENCES: reference.py's


@dataclass(frozen=True)
class TrialSpec:
    """Everything the child needs to run one compiled kernel (picklable, no CuPy types).

    ``plan`` is the run as the parent planned it (with the model's occupancy); where the
    grid depends on the occupancy, ``kernel`` (the generator's kernel, its code dropped) and
    ``codegen`` (the generator's module) let the child plan it again with the driver's.
    """

    workload_hash: str
    schedule_id: str
    cubin_path: str | None  # None: generated but not compiled (simulated launches only)
    plan: LaunchPlan
    policy: RepeatPolicy
    model_us: float | None = None  # the analytical model's latency (the simulated twin's)
    kernel: Any = None
    codegen: str | None = None  # set when the grid must come from the driver's occupancy

    # The first launch, as a one-launch spec described it (GEMMs have one launch).
    @property
    def kernel_name(self) -> str:
        return self.plan.launches[0].kernel

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.plan.launches[0].grid

    @property
    def threads(self) -> int:
        return self.plan.launches[0].block[0]

    @property
    def smem_bytes(self) -> int:
        return self.plan.launches[0].smem_bytes

    @property
    def scalars(self) -> tuple[int | float, ...]:
        launch = self.plan.launches[0]
        return tuple(launch.scalars[n] for n in launch.scalar_arguments)


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


def prepare_workload(
    canonical: dict[str, Any],
    seed: int,
    cache_dir: str | None = None,
    conv_reference: str = "cublas",
) -> dict[str, Any]:
    """Upload the inputs and set up the reference and tolerance for one workload (from the
    disk cache when an earlier child computed them), with the workload's family's
    reference module."""
    import cupy

    from pipetune.model.family import family_of, parse_any_workload
    from pipetune.workers.families import reference_for

    if conv_reference not in CONV_REFERENCES:
        raise ValueError(f"conv_reference must be one of {CONV_REFERENCES}")
    started = time.perf_counter()
    workload = parse_any_workload(canonical)
    checks = reference_for(family_of(workload))
    _STATE.pop("workload", None)
    cupy.get_default_memory_pool().free_all_blocks()
    inputs = {
        name: cupy.asarray(host) for name, host in checks.input_buffers(workload, seed).items()
    }
    notes: list[str] = []

    def compute() -> tuple[Any, Any, str]:
        ref, tol, used, why = checks.compute_reference(cupy, workload, inputs, conv_reference)
        notes.extend([why] if why else [])
        return ref, tol, used

    ref, tol, used, from_disk = reference_cache.cached_reference(
        cupy,
        workload.workload_hash,
        seed,
        checks.reference_method(workload, conv_reference),
        Path(cache_dir) if cache_dir else None,
        compute,
        to_host=cupy.asnumpy,
        formula=checks.tolerance_text(workload),
    )
    cupy.cuda.Device().synchronize()
    fingerprints = {name: _fingerprint(cupy, array) for name, array in inputs.items()}
    _STATE["workload"] = Prepared(
        workload.workload_hash, workload, inputs, ref, tol, checks, fingerprints
    )
    return {
        "workload_hash": workload.workload_hash,
        "reference": used,
        "reference_note": notes[0] if notes else None,
        "reference_from_disk": from_disk,
        "tolerance": checks.tolerance_text(workload),
        "seconds": round(time.perf_counter() - started, 3),
    }


@dataclass
class Prepared:
    """One workload set up on the device: inputs by buffer name, the reference, the
    tolerance, and the output and workspace buffers the trials allocated (reused)."""

    workload_hash: str
    workload: Any
    inputs: dict[str, Any]
    ref: Any
    tol: Any
    checks: Any  # the family's reference module
    fingerprints: dict[str, int]  # each input's _fingerprint as uploaded
    scratch: dict[tuple[str, tuple[int, ...], str], Any] | None = None

    def buffer(self, cupy: Any, name: str, shape: tuple[int, ...], dtype: str) -> Any:
        """A non-input buffer of the plan (kept for the next trial of the same shape)."""
        self.scratch = self.scratch if self.scratch is not None else {}
        key = (name, tuple(shape), dtype)
        if key not in self.scratch:
            self.scratch[key] = cupy.empty(shape, dtype=elements.storage(cupy, dtype))
        return self.scratch[key]


def _fingerprint(cupy: Any, array: Any) -> int:
    """A checksum of an input buffer's bits (one reduction on the device): a kernel that
    stores into an input (a stray or out-of-bounds store) changes it."""
    return int(array.view(cupy.uint16).sum(dtype=cupy.uint64))


def _nan_fill(cupy: Any, array: Any) -> None:
    """NaN everywhere (an output element the kernel never writes then fails the check);
    0xFFFF is a NaN of float16 and of bfloat16 (held as uint16) alike."""
    if array.dtype in (cupy.float16, cupy.uint16):
        array.view(cupy.uint16).fill(0xFFFF)
    else:
        array.fill(float("nan"))


def _device_plan(cupy: Any, spec: TrialSpec, workload: Any, functions: dict[str, Any]) -> Any:
    """The plan to launch: the parent's, or (when the grid depends on it) planned again
    with the driver's occupancy of the loaded first kernel, on this device's SMs."""
    if spec.codegen is None:
        return spec.plan
    first = spec.plan.launches[0]
    # A RawKernel has no handle of its own: its loaded Function (``.kernel``) holds it.
    occupancy = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
        functions[first.kernel].kernel.ptr, first.block[0], first.smem_bytes
    )
    device = cupy.cuda.Device()
    sm_count = int(cupy.cuda.runtime.getDeviceProperties(device.id)["multiProcessorCount"])
    codegen = importlib.import_module(spec.codegen)
    return codegen.launch_plan(spec.kernel, workload, sm_count, max(1, int(occupancy)))


def _launcher(fn: Any, launch: KernelLaunch) -> Callable[..., None]:
    """How the launch is made: a cooperative one (its blocks wait for each other, a fused
    split row's) through cuLaunchCooperativeKernel, as pipetune.kernel launches it, so that
    the driver makes every block resident at once, where a plain launch beside other work on
    the GPU could leave some unscheduled and the rest spinning until the trial's timeout.
    (CuPy cuts a one-dimensional cooperative grid larger than fits down to what fits, with a
    warning, where the driver would refuse it: the grid here is planned from the same
    occupancy query, and blocks cut off would leave outputs unwritten, a wrong result.) CuPy
    sets cooperation per module (a RawModule's enable_cooperative_groups, every function of
    it); its loaded Function takes it per call."""
    if launch.cooperative:
        return functools.partial(fn.kernel, enable_cooperative_groups=True)
    return fn


def _device_address(array: Any) -> int:
    """A CuPy array's device address (a function of its own: the tests' CuPy stand-in has
    numpy arrays, whose address is elsewhere)."""
    return int(array.data.ptr)


def _failed(status: str, error: str, *, poisoned: bool) -> dict[str, Any]:
    return {"status": status, "error": error, "poisoned": poisoned}


def _flush() -> None:
    _STATE["flush"].fill(0)


def run_trial(spec: TrialSpec) -> dict[str, Any]:
    """Verify and time one kernel's run. Returns {"status", "samples_ms"?, "max_abs_error"?,
    "error"?, "poisoned"?}; status is ok, launch_error, runtime_error or wrong_result."""
    import cupy

    prepared: Prepared | None = _STATE.get("workload")
    if prepared is None or prepared.workload_hash != spec.workload_hash:
        raise RuntimeError("run_trial before prepare_workload for this workload")
    if spec.cubin_path is None:
        raise RuntimeError(f"no cubin for {spec.kernel_name}: a real launch needs one")
    cuda_errors = _cuda_errors()
    try:
        module = cupy.RawModule(path=spec.cubin_path)
        names = dict.fromkeys(launch.kernel for launch in spec.plan.launches)
        functions = {name: module.get_function(name) for name in names}
        for launch in spec.plan.launches:
            fn = functions[launch.kernel]
            fn.max_dynamic_shared_size_bytes = max(
                fn.max_dynamic_shared_size_bytes, launch.smem_bytes
            )
        plan = _device_plan(cupy, spec, prepared.workload, functions)
    except cuda_errors as exc:
        return _failed("launch_error", f"loading the kernel: {exc}", poisoned=True)
    except ValueError as exc:  # the plan does not fit this device (e.g. a row's blocks)
        return _failed("launch_error", f"launch plan: {exc}", poisoned=False)
    buffers: dict[str, Any] = {}
    for b in plan.buffers:
        if b.role == "input":
            buffers[b.name] = prepared.inputs[b.name]
        else:
            buffers[b.name] = prepared.buffer(cupy, b.name, b.shape, b.dtype)
    for tm in plan.tensor_maps:
        try:
            encoded = tensor_maps.encode_tensor_map(tm, _device_address(buffers[tm.operand]))
        except RuntimeError as exc:  # the driver refused on the host: the context is intact
            return _failed("launch_error", f"tensor map {tm.name}: {exc}", poisoned=False)
        buffers[tm.name] = cupy.asarray(np.frombuffer(encoded, dtype=np.uint8))
    calls = []
    for launch in plan.launches:
        args = tuple(
            buffers[name]
            if kind == "buffer"
            else (np.float32 if kind == "float32" else np.int32)(launch.scalars[name])
            for name, kind in launch.parameters()
        )
        calls.append(
            (
                _launcher(functions[launch.kernel], launch),
                launch.grid,
                launch.block,
                args,
                launch.smem_bytes,
            )
        )

    def run() -> None:
        for launch_fn, grid, block, args, smem in calls:
            launch_fn(grid, block, args, shared_mem=smem)

    def fill_outputs() -> None:
        for b in plan.buffers:
            if b.role == "output":
                _nan_fill(cupy, buffers[b.name])

    fill_outputs()
    for b in plan.buffers:
        if b.role == "workspace":
            buffers[b.name].fill(0)
    try:
        run()
    except cuda_errors as exc:
        return _failed("launch_error", f"launch: {exc}", poisoned=True)
    try:
        cupy.cuda.get_current_stream().synchronize()
    except cuda_errors as exc:
        return _failed("runtime_error", f"kernel execution: {exc}", poisoned=True)

    out = buffers[plan.output]
    passed, max_error, why = prepared.checks.check(cupy, out, prepared.ref, prepared.tol)
    if not passed:
        return {"status": "wrong_result", "max_abs_error": max_error, "error": why}
    try:
        samples = time_launches(run, _flush, CupyClock(cupy), spec.policy)
    except cuda_errors as exc:
        return _failed("runtime_error", f"timed runs: {exc}", poisoned=True)
    if spec.policy.second_run:  # the same inputs, the workspaces as the first run left them
        fill_outputs()  # (an element the second run does not write fails, as on the first)
        try:
            run()
            cupy.cuda.get_current_stream().synchronize()
        except cuda_errors as exc:
            return _failed("runtime_error", f"the second run: {exc}", poisoned=True)
    # The first run is not the only one that counts: a kernel that leaves its workspace
    # dirty (an arrival counter not reset) is right once and then times something else,
    # and one that stores into an input would fail every later trial of the workload in
    # its place. So the last timed run's output (or the second run's) is checked too, and
    # the inputs are intact.
    changed = [
        name
        for name, array in prepared.inputs.items()
        if _fingerprint(cupy, array) != prepared.fingerprints[name]
    ]
    if changed:
        # The inputs the next trials need are gone: a new child uploads them again.
        error = f"the kernel wrote into its input(s) {', '.join(changed)}"
        return {**_failed("wrong_result", error, poisoned=True), "max_abs_error": max_error}
    if samples or spec.policy.second_run:
        passed, last_error, why = prepared.checks.check(cupy, out, prepared.ref, prepared.tol)
        if not passed:
            after = "after the timed runs" if samples else SECOND_RUN_WRONG
            error = f"right on the first run, wrong {after}: {why}"
            return {"status": "wrong_result", "max_abs_error": last_error, "error": error}
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
