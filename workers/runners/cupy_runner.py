"""The cupy runner: real kernels on a real GPU.

Parent side (this module; no CuPy import): generate each schedule's kernel
(workers.codegen), compile it to a cubin for the device's arch with NVRTC on every core
(workers.compile.compile_many), cache the cubin per (kernel variant, schedule) — a variant's
kernel does not depend on the shape, so one cubin serves every workload of that variant —
and send trials to a persistent child process (workers.runners.isolation) that loads,
verifies and times them (workers.runners.cupy_child).

Failures: a kernel that does not compile is compile_error; one whose module load or launch
fails is launch_error; a CUDA fault while it runs, or a child that dies, is runtime_error; a
result outside the fp16 tolerance is wrong_result; a trial with no answer within
``trial_timeout_s`` is timeout (the child is killed). After any CUDA error or death the
child is replaced and the workload's buffers are set up again in the new one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from pipetune.model.hardware import GPUSpec, HardwareError, get_gpu, resolve_gpu_key
from pipetune.model.space import Schedule
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import AnyWorkload
from pipetune.workers.runners import cupy_child
from pipetune.workers.runners.base import (
    MeasureSettings,
    Progress,
    Runner,
    RunnerError,
    RunnerUnavailableError,
    summarise,
)
from pipetune.workers.runners.builds import Compiled, KernelBuilds, load_toolchain
from pipetune.workers.runners.isolation import CallOutcome, IsolatedWorker, WorkerStartError
from pipetune.workers.runners.outcomes import clip, failed_call
from pipetune.workers.runners.reference import TOLERANCE_TEXT


def trial_result(outcome: CallOutcome, compiled: Compiled, runner: str = "cupy") -> MeasureResult:
    """The MeasureResult of one trial, from what the child answered (or did not)."""
    common: dict[str, Any] = {
        "registers": compiled.registers,
        "spill_bytes": compiled.spill_bytes,
        "smem_bytes": compiled.smem_bytes,
        "compile_ms": compiled.compile_ms,
        "runner": runner,
    }
    failed = failed_call(outcome, **common)
    if failed is not None:
        return failed
    answer = outcome.value
    status = answer["status"]
    if status != "ok":
        return MeasureResult(
            status=status,
            error=clip(answer.get("error") or status),
            max_abs_error=answer.get("max_abs_error"),
            **common,
        )
    samples_us = [s * 1e3 for s in answer["samples_ms"]]
    latency, spread = summarise(samples_us)
    return MeasureResult(
        status="ok",
        latency_us=latency,
        samples_us=samples_us,
        spread=spread,
        max_abs_error=answer.get("max_abs_error"),
        **common,
    )


def compile_failure(compiled: Compiled, runner: str = "cupy") -> MeasureResult:
    return MeasureResult(
        status="compile_error",
        error=clip(compiled.error or "compilation failed"),
        compile_ms=compiled.compile_ms,
        runner=runner,
    )


class CupyRunner(Runner):
    name = "cupy"

    def __init__(
        self,
        gpu: GPUSpec | str | None = None,
        *,
        device: int = 0,
        settings: MeasureSettings | None = None,
        seed: int = 0,
        trial_timeout_s: float = 60.0,
        prepare_timeout_s: float = 600.0,
        start_timeout_s: float = 180.0,
        compile_workers: int | None = None,
    ):
        super().__init__()
        if importlib.util.find_spec("cupy") is None:
            raise RunnerUnavailableError(
                "the cupy runner needs CuPy and an NVIDIA GPU; CuPy is not installed "
                "(pip install 'pipetune[gpu]')"
            )
        load_toolchain()  # fail before starting a GPU process, not after
        self._settings = settings or MeasureSettings(seed=seed)
        self.trial_timeout_s = trial_timeout_s
        self.prepare_timeout_s = prepare_timeout_s
        self._pool = IsolatedWorker(
            cupy_child.init_device, (device,), start_timeout_s=start_timeout_s, name="pipetune-cupy"
        )
        try:
            self.device: dict[str, Any] = self._pool.start()
        except WorkerStartError as exc:
            self._pool.close()
            raise RunnerUnavailableError(f"no usable CUDA GPU: {exc}") from None
        self.arch: str = self.device["arch"]
        self.gpu = self._resolve_gpu(gpu)
        self._builds = KernelBuilds(self.arch, workers=compile_workers)
        self._prepared: tuple[str, int] | None = None

    def _resolve_gpu(self, gpu: GPUSpec | str | None) -> GPUSpec | None:
        try:
            detected = resolve_gpu_key(self.device["name"])
        except HardwareError:
            detected = None  # a device the model has no spec for: take the caller's word
        if gpu is None:
            return None if detected is None else get_gpu(detected)
        spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
        if detected is not None and detected != spec.key:
            self.close()
            raise RunnerError(f"asked to measure on {spec.key}, but the device is {detected}")
        return spec

    @property
    def device_name(self) -> str | None:
        return self.device["name"]

    @property
    def settings(self) -> dict[str, Any]:
        return {
            **self._settings.as_dict(),
            "l2_flush": "write 2x L2 before each repeat",
            "timing": "CUDA events around each launch; median of the repeats",
            "verification": TOLERANCE_TEXT,
            "trial_timeout_s": self.trial_timeout_s,
            "device": dict(self.device),
        }

    # --- compilation (parent, all cores) --------------------------------------------

    def prepare(
        self,
        workload: AnyWorkload,
        schedules: Sequence[Schedule],
        progress: Progress | None = None,
    ) -> None:
        """Compile every schedule's kernel for this workload's variant (cached)."""
        self._builds.build(self._builds.codegen.variant_of(workload), schedules, progress)

    # --- measurement (child) ----------------------------------------------------------

    def _ensure_prepared(self, workload: AnyWorkload) -> None:
        try:
            self._pool.start()
        except WorkerStartError as exc:
            raise RunnerError(f"the GPU process could not be restarted: {exc}") from None
        key = (workload.workload_hash, self._pool.generation)
        if self._prepared == key:
            return
        outcome = self._pool.call(
            cupy_child.prepare_workload,
            workload.canonical(),
            self._settings.seed,
            timeout_s=self.prepare_timeout_s,
        )
        if not outcome.ok:
            raise RunnerError(f"could not set up {workload.label()} on the GPU: {outcome.error}")
        self._prepared = key

    def _measure(self, workload: AnyWorkload, schedules: list[Schedule]) -> list[MeasureResult]:
        variant = self._builds.codegen.variant_of(workload)
        self._builds.build(variant, schedules)
        results = []
        for schedule in schedules:
            compiled = self._builds.get(variant, schedule)
            if compiled.cubin_path is None:
                results.append(compile_failure(compiled, self.name))
                continue
            self._ensure_prepared(workload)
            grid, scalars = self._builds.codegen.launch(compiled.kernel, workload)
            spec = cupy_child.TrialSpec(
                workload_hash=workload.workload_hash,
                cubin_path=compiled.cubin_path,
                kernel_name=compiled.kernel.name,
                threads=int(compiled.kernel.threads),
                smem_bytes=int(compiled.kernel.smem_bytes),
                grid=tuple(int(g) for g in grid),  # type: ignore[arg-type]
                scalars=tuple(int(v) for v in scalars),
                warmup=self._settings.warmup,
                repeats=self._settings.repeats,
            )
            outcome = self._pool.call(cupy_child.run_trial, spec, timeout_s=self.trial_timeout_s)
            results.append(trial_result(outcome, compiled, self.name))
            if outcome.ok and outcome.value.get("poisoned"):
                # The CUDA context is unusable after a fault: the next trial gets a new child.
                self._pool.stop()
        return results

    def close(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.close()
        if getattr(self, "_builds", None) is not None:
            self._builds.close()
        super().close()
