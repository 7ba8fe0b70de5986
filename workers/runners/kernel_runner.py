"""The parent side of the runners that measure pipetune's own kernels in a child process.

Parent (this module; no CuPy import): generate each schedule's kernel with its workload's
family's generator (workers.families.codegen_for), compile it for the device's arch with
NVRTC in the compile-ahead pool (workers.runners.builds), describe the run as the
generator's launch plan (workers.launch_plan: buffers by name and ordered launches), and
send trials in batches to a persistent child process (workers.runners.isolation) that runs
one *side*: workers.runners.cupy_child on a GPU (:class:`CupyRunner`), or its simulated twin
workers.runners.sim_child (:class:`SimulatedLaunchRunner`, a CPU rehearsal of everything but
the launch).

Failures: a kernel that does not compile is compile_error; one whose module load or launch
fails is launch_error; a CUDA fault while it runs, or a child that dies, is runtime_error; a
result outside the fp16 tolerance is wrong_result; a trial with no answer within its
timeout is timeout (the child is killed). After any CUDA error or death the child is
replaced and the workload's buffers are set up again in the new one (its reference comes
back from the disk cache). A batch whose child dies or hangs is run again one trial at a
time, so only the faulty trial is recorded as failed.

Batches: consecutive trials go to the child together, up to ``batch_size`` trials or about
``batch_seconds`` of predicted work, so a sweep of thousands of short trials pays one
round trip per batch rather than per trial.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from pipetune.model.family import family_of, generator_revision_of
from pipetune.model.hardware import GPUSpec, HardwareError, get_gpu, resolve_gpu_key
from pipetune.model.trials import MeasureResult
from pipetune.workers.runners.base import (
    MeasureSettings,
    Progress,
    Runner,
    RunnerError,
    RunnerUnavailableError,
    summarise,
)
from pipetune.workers.runners.builds import Compiled, KernelBuilds, generator_of, load_toolchain
from pipetune.workers.runners.cupy_child import TrialSpec
from pipetune.workers.runners.isolation import CallOutcome, IsolatedWorker, WorkerStartError
from pipetune.workers.runners.outcomes import clip, failed_call
from pipetune.workers.runners.reference import TOLERANCE_TEXT
from pipetune.workers.runners.reference_cache import default_folder
from pipetune.workers.runners.timing import RepeatPolicy

EMPTY_KERNEL_NAME = "pipetune_empty_kernel"
EMPTY_KERNEL = f'extern "C" __global__ void {EMPTY_KERNEL_NAME}() {{}}\n'
TRIAL_OVERHEAD_S = 0.003  # module load, NaN fill, verification, round trip: a planning guess
UNKNOWN_TRIAL_S = 0.001  # a trial's kernel time when the model cannot predict it


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
    if not answer.get("samples_ms"):  # verified, not timed
        return MeasureResult(status="ok", max_abs_error=answer.get("max_abs_error"), **common)
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


def model_view(
    workload: Any, gpu: GPUSpec | None, schedules: Sequence[Any]
) -> tuple[list[float | None], list[int | None]]:
    """The workload family's analytical model on each schedule: (latency in µs, resident
    blocks per SM), None outside the GPU's valid space, or for every schedule on a device
    the model has no spec for."""
    none: list[Any] = [None] * len(schedules)
    if gpu is None or not schedules:
        return list(none), list(none)
    fam = family_of(workload)
    knobs = fam.knob_arrays(schedules)
    bad = np.zeros(len(schedules), dtype=bool)
    for mask in fam.invalid_reasons(knobs, workload, gpu).values():
        bad |= np.asarray(mask, dtype=bool)
    ok = np.flatnonzero(~bad)
    latency: list[float | None] = list(none)
    occupancy: list[int | None] = list(none)
    if ok.size:
        space = fam.space_of(workload, gpu, {k: v[ok] for k, v in knobs.items()})
        t_kernel = fam.evaluate(space).T_kernel
        blocks = space.blocks_per_sm
        for i, t, b in zip(ok.tolist(), t_kernel.tolist(), blocks.tolist(), strict=True):
            latency[i], occupancy[i] = t * 1e6, int(b)
    return latency, occupancy


def model_latencies_us(
    workload: Any, gpu: GPUSpec | None, schedules: Sequence[Any]
) -> list[float | None]:
    """The analytical model's latency of each schedule (None outside the GPU's valid space,
    or for every schedule on a device the model has no spec for)."""
    return model_view(workload, gpu, schedules)[0]


def trial_spec(
    compiled: Compiled,
    workload: Any,
    schedule: Any,
    policy: RepeatPolicy,
    model_us: float | None = None,
    *,
    sm_count: int = 1,
    blocks_per_sm: int | None = None,
) -> TrialSpec:
    """One trial for the child: the run as the workload family's generator plans it
    (``launch_plan``). For GEMMs that is workers.codegen.launch_config's one launch, the
    description `pipetune.kernel` and `pipetune export` give users too (a test compares
    them), so what is timed here is what users launch. A plan whose grid depends on the
    occupancy is made here with the model's (``blocks_per_sm``, ``sm_count``: the device's
    SMs) and made again by the child with the driver's; ValueError when it cannot be made
    (a schedule whose blocks do not fit)."""
    codegen = generator_of(workload)
    plan = codegen.launch_plan(compiled.kernel, workload, sm_count, blocks_per_sm or 1)
    replan = bool(codegen.grid_depends_on_occupancy(compiled.kernel))
    return TrialSpec(
        workload_hash=workload.workload_hash,
        schedule_id=schedule.id,
        cubin_path=compiled.cubin_path,
        plan=plan,
        policy=policy,
        model_us=model_us,
        kernel=compiled.kernel if replan else None,
        codegen=codegen.__name__ if replan else None,
    )


class KernelRunner(Runner):
    """Measures pipetune's kernels through a child process running ``side`` (module doc)."""

    name = "kernel"
    simulated_launch = False

    def __init__(
        self,
        side: ModuleType,
        init_args: tuple[Any, ...],
        gpu: GPUSpec | str | None = None,
        *,
        settings: MeasureSettings | None = None,
        seed: int = 0,
        trial_timeout_s: float = 60.0,
        prepare_timeout_s: float = 600.0,
        start_timeout_s: float = 180.0,
        compile_workers: int | None = None,
        compile_sample: int | None = None,
        batch_size: int = 32,
        batch_seconds: float = 2.0,
        reference_cache: str | None = None,
        conv_reference: str = "cublas",
    ):
        super().__init__()
        load_toolchain()  # fail before starting a GPU process, not after
        if batch_size < 1 or not batch_seconds > 0:
            raise ValueError("batch_size must be >= 1 and batch_seconds > 0")
        self._side = side
        self._settings = settings or MeasureSettings(seed=seed)
        self.trial_timeout_s = trial_timeout_s
        self.prepare_timeout_s = prepare_timeout_s
        self.batch_size = batch_size
        self.batch_seconds = batch_seconds
        self.reference_cache = (
            str(default_folder()) if reference_cache is None else reference_cache or None
        )
        self.conv_reference = conv_reference
        self._pool = IsolatedWorker(
            side.init_device,
            init_args,
            start_timeout_s=start_timeout_s,
            name=f"pipetune-{self.name}",
        )
        try:
            self.device: dict[str, Any] = self._pool.start()
        except WorkerStartError as exc:
            self._pool.close()
            raise RunnerUnavailableError(f"no usable CUDA GPU: {exc}") from None
        self.arch: str = self.device["arch"]
        self.gpu = self._resolve_gpu(gpu)
        self._builds = KernelBuilds(self.arch, workers=compile_workers, sample=compile_sample)
        self._prepared: tuple[str, int] | None = None
        self.timing_floor_us: float | None = None
        self.last_prepare: dict[str, Any] | None = None
        self.batches = 0  # child round trips for trials (batches, and single reruns)

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
            "l2_flush": f"write {self.device.get('flush_bytes')} B (>= 2x L2) before each repeat",
            "timing": "CUDA events around each launch; median of the repeats",
            "timing_floor_us": self.timing_floor_us,
            "verification": TOLERANCE_TEXT
            if self.last_prepare is None
            else self.last_prepare.get("tolerance", TOLERANCE_TEXT),
            "reference": None if self.last_prepare is None else self.last_prepare["reference"],
            "trial_timeout_s": self.trial_timeout_s,
            "batch_size": self.batch_size,
            "device": dict(self.device),
        }

    # --- compilation (parent, all cores) --------------------------------------------

    def prepare(
        self,
        workload: Any,
        schedules: Sequence[Any],
        progress: Progress | None = None,
    ) -> None:
        """Compile every schedule's kernel for this workload (cached); waits."""
        self._builds.build(workload, schedules, progress)

    def compile_ahead(self, workload: Any, schedules: Sequence[Any]) -> None:
        """Queue the schedules' kernels in the compile pool and return at once."""
        self._builds.submit(workload, schedules)

    def variant_of(self, workload: Any) -> str:
        """The kind of kernel a workload needs (its generator's ``kernel_kind``: the GEMM
        variant, the memory-intensive op), as the compile-time table names it."""
        return str(generator_of(workload).kernel_kind(workload))

    def compile_backlog(self, workload: Any, schedules: Sequence[Any]) -> int:
        """Kernels of these schedules still waiting for the compile pool."""
        return self._builds.backlog(workload, schedules)

    @property
    def compile_workers(self) -> int:
        return self._builds.workers

    # --- measurement (child) ----------------------------------------------------------

    def measure_floor(self) -> float:
        """The timing floor (µs): an empty kernel, compiled like the others and timed as
        trials are. Measured once per runner; every dataset's settings carry it."""
        if self.timing_floor_us is None:
            result = self._builds.compiler.compile_source(
                EMPTY_KERNEL, self.arch, entry=EMPTY_KERNEL_NAME
            )
            path = self._builds.write_cubin(EMPTY_KERNEL_NAME, result.cubin)
            policy = RepeatPolicy.of(self._settings)
            outcome = self._pool.call(
                self._side.timing_floor, path, EMPTY_KERNEL_NAME, policy, timeout_s=60
            )
            if not outcome.ok:
                raise RunnerError(f"the timing floor could not be measured: {outcome.error}")
            self.timing_floor_us = statistics.median(outcome.value) * 1e3
        return self.timing_floor_us

    def _ensure_prepared(self, workload: Any) -> None:
        try:
            self._pool.start()
        except WorkerStartError as exc:
            raise RunnerError(f"the GPU process could not be restarted: {exc}") from None
        key = (workload.workload_hash, self._pool.generation)
        if self._prepared == key:
            return
        # A prepare that fails in a live child has already dropped the workload the child
        # held: until one succeeds, no workload counts as set up there (else the next
        # trials of the previous workload were sent to a child without it, each a failure).
        self._prepared = None
        outcome = self._pool.call(
            self._side.prepare_workload,
            workload.canonical(),
            self._settings.seed,
            self.reference_cache,
            self.conv_reference,
            timeout_s=self.prepare_timeout_s,
        )
        if not outcome.ok:
            raise RunnerError(f"could not set up {workload.label()} on the GPU: {outcome.error}")
        self._prepared = key
        self.last_prepare = outcome.value

    def _expected_s(self, spec: TrialSpec) -> float:
        launches = 1 + int(spec.policy.second_run) + spec.policy.warmup + spec.policy.max_repeats
        kernel_s = (spec.model_us or UNKNOWN_TRIAL_S * 1e6) / 1e6
        return TRIAL_OVERHEAD_S + launches * kernel_s

    def _measure(self, workload: Any, schedules: list[Any]) -> list[MeasureResult]:
        return self.run_trials(workload, schedules, RepeatPolicy.of(self._settings))

    def verify(self, workload: Any, schedules: Sequence[Any]) -> list[MeasureResult]:
        """Launch and check each schedule's kernel, then launch it again on the same inputs
        (its workspaces as the first run left them, as the timed runs find them) and check
        that too; no timing (status ok = correct both times)."""
        if self.closed:
            raise RunnerError(f"the {self.name} runner is closed")
        return self.run_trials(workload, list(schedules), RepeatPolicy.verify_twice())

    def run_trials(
        self, workload: Any, schedules: list[Any], policy: RepeatPolicy
    ) -> list[MeasureResult]:
        self._builds.submit(workload, schedules)
        if policy.timed:
            self.measure_floor()
        model_us, occupancy = model_view(workload, self.gpu, schedules)
        sm_count = int(self.device.get("sm_count") or 1)
        results: list[MeasureResult | None] = [None] * len(schedules)
        batch: list[tuple[int, TrialSpec, Compiled]] = []
        batch_s = 0.0
        for i, schedule in enumerate(schedules):
            compiled = self._builds.get(workload, schedule)
            if compiled.error is not None or compiled.kernel is None:
                results[i] = compile_failure(compiled, self.name)
                continue
            try:
                spec = trial_spec(
                    compiled,
                    workload,
                    schedule,
                    policy,
                    model_us[i],
                    sm_count=sm_count,
                    blocks_per_sm=occupancy[i],
                )
            except ValueError as exc:  # the generator cannot plan this run on this device
                results[i] = MeasureResult(
                    status="launch_error", error=clip(f"launch plan: {exc}"), runner=self.name
                )
                continue
            batch.append((i, spec, compiled))
            batch_s += self._expected_s(spec)
            if len(batch) >= self.batch_size or batch_s >= self.batch_seconds:
                self._run_batch(workload, batch, results)
                batch, batch_s = [], 0.0
        if batch:
            self._run_batch(workload, batch, results)
        assert all(r is not None for r in results)
        # Which revision of the generator made these kernels (failures included: the
        # revision made what failed), so that what learns from them can tell.
        revision = generator_revision_of(workload).revision
        return [r.model_copy(update={"generator_revision": revision}) for r in results]  # type: ignore[union-attr]

    def _run_batch(
        self,
        workload: Any,
        batch: list[tuple[int, TrialSpec, Compiled]],
        results: list[MeasureResult | None],
    ) -> None:
        queue = list(batch)
        while queue:
            self._ensure_prepared(workload)
            timeout = self.trial_timeout_s + 3 * sum(self._expected_s(s) for _, s, _ in queue)
            self.batches += 1
            outcome = self._pool.call(
                self._side.run_trials, [spec for _, spec, _ in queue], timeout_s=timeout
            )
            if outcome.ok:
                answers = outcome.value
                if not answers:
                    raise RunnerError(f"the {self.name} child answered no trial of a batch")
                for (i, _, compiled), answer in zip(queue, answers, strict=False):
                    results[i] = trial_result(CallOutcome("ok", value=answer), compiled, self.name)
                if answers[-1].get("poisoned"):
                    # The CUDA context is unusable after a fault: the rest goes to a new child.
                    self._pool.stop()
                queue = queue[len(answers) :]
            elif len(queue) == 1:
                (i, _, compiled) = queue[0]
                results[i] = trial_result(outcome, compiled, self.name)
                queue = []
            else:
                # The child died, hung or raised somewhere in the batch and its answers are
                # lost: run the trials one at a time, so only the faulty one fails.
                for item in queue:
                    self._run_batch(workload, [item], results)
                queue = []

    def close(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.close()
        if getattr(self, "_builds", None) is not None:
            self._builds.close()
        super().close()
