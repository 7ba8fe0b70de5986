"""The simulated runner: the analytical model plus stated noise. For demos and CI plumbing
only: its numbers are the model's, never measurements, and every result says
``runner="simulated"``.

Noise model (stated): a schedule's latency is ``T_kernel · exp(sigma · z0)`` and its R timed
samples are that latency times ``exp(repeat_sigma · z_i)``, with z0, z_i standard normal
drawn from a generator seeded by (seed, workload hash, schedule id), so every answer is
deterministic. ``T_kernel`` is the workload family's analytical model's prediction for the
workload on the GPU (ALCOP's for the tensor-core GEMMs, the wave/bandwidth model for the
memory-intensive operators). Schedules outside the GPU's valid space (the family's rules)
answer ``launch_error``.

Faults (optional, for rehearsing a GPU's failures on a CPU): with a
:class:`~workers.runners.faults.FaultPlan`, every valid trial's answer passes through an
isolated child process, as a cupy trial does, and the schedules the plan picks crash that
child (SIGSEGV) or hang it past ``trial_timeout_s``: recorded as ``runtime_error`` and
``timeout`` exactly as the cupy runner records them. The next trial gets a fresh child.

Wall time: a simulated trial takes as long as a real one would, roughly: ``compile_s`` per
schedule (NVRTC compiling one kernel) plus (warmup + repeats) launches of the predicted
latency, all multiplied by ``PIPETUNE_SIMULATED_TIME_SCALE`` (default 1; 0 = instant).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from typing import Any

import numpy as np

from pipetune.model.family import family_of
from pipetune.model.hardware import GPUSpec, get_gpu
from pipetune.model.trials import MeasureResult
from pipetune.workers.runners.base import (
    MeasureSettings,
    Runner,
    RunnerSettingError,
    summarise,
)
from pipetune.workers.runners.faults import FaultPlan, run_simulated_trial
from pipetune.workers.runners.isolation import IsolatedWorker
from pipetune.workers.runners.outcomes import failed_call

TIME_SCALE_ENV = "PIPETUNE_SIMULATED_TIME_SCALE"
DEFAULT_SIGMA = 0.03
DEFAULT_REPEAT_SIGMA = 0.01
DEFAULT_COMPILE_S = 1.0
# A simulated second may last this many real ones at most: a trial of a few simulated
# seconds then sleeps hours, which is surely what was asked; 1e12 slept past the platform's
# clock (an OverflowError in every trial, each then a failed one).
MAX_TIME_SCALE = 1000.0


def time_scale_problem(value: float) -> str | None:
    """Why `value` cannot be a time scale (None when it can)."""
    if not math.isfinite(value) or value < 0:
        return "must be a non-negative number (1 = real time, 0 = instant)"
    if value > MAX_TIME_SCALE:
        return f"must be at most {MAX_TIME_SCALE:g} (1 = real time, 0 = instant)"
    return None


def time_scale_from_env() -> float:
    raw = os.environ.get(TIME_SCALE_ENV)
    if raw is None or raw.strip() == "":
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if problem := time_scale_problem(value):
        raise RunnerSettingError(f"{TIME_SCALE_ENV} {problem}, got {raw!r}")
    return value


def noise_rng(seed: int, workload_hash: str, schedule_id: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{workload_hash}:{schedule_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


class SimulatedRunner(Runner):
    name = "simulated"

    def __init__(
        self,
        gpu: GPUSpec | str = "h100",
        *,
        seed: int = 0,
        sigma: float = DEFAULT_SIGMA,
        repeat_sigma: float = DEFAULT_REPEAT_SIGMA,
        settings: MeasureSettings | None = None,
        compile_s: float = DEFAULT_COMPILE_S,
        time_scale: float | None = None,
        faults: FaultPlan | None = None,
        trial_timeout_s: float = 60.0,
    ):
        super().__init__()
        if sigma < 0 or repeat_sigma < 0 or compile_s < 0:
            raise ValueError("sigma, repeat_sigma and compile_s must be non-negative")
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        self.seed = seed
        self.sigma = sigma
        self.repeat_sigma = repeat_sigma
        self._settings = settings or MeasureSettings(seed=seed)
        self.compile_s = compile_s
        self.time_scale = time_scale_from_env() if time_scale is None else float(time_scale)
        if problem := time_scale_problem(self.time_scale):
            raise RunnerSettingError(f"time_scale {problem}, got {time_scale!r}")
        if trial_timeout_s <= 0:
            raise ValueError("trial_timeout_s must be positive")
        self.faults = faults
        self.trial_timeout_s = trial_timeout_s
        self._child: IsolatedWorker | None = None
        # One child, one call at a time: a worker's measuring threads take turns.
        self._child_lock = threading.Lock()
        if faults is not None:
            self._child = IsolatedWorker(name="pipetune-simulated")

    @property
    def settings(self) -> dict[str, Any]:
        return {
            **self._settings.as_dict(),
            "noise": "lognormal",
            "sigma": self.sigma,
            "repeat_sigma": self.repeat_sigma,
            "model": "the workload family's analytical model (ALCOP Table 1 for GEMMs)",
            "noise_seed": self.seed,
            **({} if self.faults is None else {"faults": self.faults.describe()}),
        }

    def _measure(self, workload: Any, schedules: list[Any]) -> list[MeasureResult]:
        fam = family_of(workload)
        knobs = fam.knob_arrays(schedules)
        reasons = {
            rule: np.asarray(mask, dtype=bool)
            for rule, mask in fam.invalid_reasons(knobs, workload, self.gpu).items()
        }
        bad = np.zeros(len(schedules), dtype=bool)
        for mask in reasons.values():
            bad |= mask
        ok = np.flatnonzero(~bad)
        t_kernel = np.full(len(schedules), np.nan)
        # Shared memory per block of every schedule asked about (valid or not): reported.
        smem = fam.space_of(workload, self.gpu, knobs).smem_bytes.tolist()
        if ok.size:
            space = fam.space_of(workload, self.gpu, {k: v[ok] for k, v in knobs.items()})
            t_kernel[ok] = fam.evaluate(space).T_kernel

        repeats = self._settings.repeats
        results: list[MeasureResult] = []
        busy_s = 0.0
        for i, schedule in enumerate(schedules):
            busy_s += self.compile_s
            if bad[i]:
                why = "; ".join(rule for rule, mask in reasons.items() if mask[i])
                results.append(
                    MeasureResult(
                        status="launch_error",
                        error=f"simulated: outside the valid space on {self.gpu.key}: {why}",
                        smem_bytes=int(smem[i]),
                        runner=self.name,
                    )
                )
                continue
            rng = noise_rng(self.seed, workload.workload_hash, schedule.id)
            latency_s = float(t_kernel[i]) * math.exp(self.sigma * rng.standard_normal())
            samples_s = latency_s * np.exp(self.repeat_sigma * rng.standard_normal(repeats))
            samples_us = [float(s * 1e6) for s in samples_s]
            median, spread = summarise(samples_us)
            busy_s += (self._settings.warmup + repeats) * latency_s
            failed = self._rehearse(workload, schedule, samples_us, int(smem[i]))
            results.append(
                failed
                or MeasureResult(
                    status="ok",
                    latency_us=median,
                    samples_us=samples_us,
                    spread=spread,
                    smem_bytes=int(smem[i]),
                    runner=self.name,
                )
            )
        if self.time_scale > 0:
            time.sleep(busy_s * self.time_scale)
        return results

    def _rehearse(
        self, workload: Any, schedule: Any, samples_us: list[float], smem_bytes: int
    ) -> MeasureResult | None:
        """With a fault plan: the trial's answer through the child (None when it came back)."""
        if self.faults is None or self._child is None:
            return None
        fault = self.faults.fault_of(workload.workload_hash, schedule.id)
        with self._child_lock:
            outcome = self._child.call(
                run_simulated_trial, fault, samples_us, timeout_s=self.trial_timeout_s
            )
        return failed_call(outcome, smem_bytes=smem_bytes, runner=self.name)

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
        super().close()
