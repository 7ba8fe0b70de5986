"""The simulated twin of workers/runners/cupy_child.py: the same functions, with the same
arguments, run in the same kind of isolated child, answering without a GPU.

What is simulated, and only that: the launch. The parent side is the cupy runner's own
(generation, NVRTC compiles in the compile-ahead pool, trial specs, batches, restarts after
a fault), so a CPU rehearsal exercises everything but CuPy and the GPU. Every answer says
``simulated``; the runner that uses this side is named ``simulated`` in every record.

- A trial's samples come from the timing loop of workers.runners.timing driven by a model
  clock: the analytical model's latency (``TrialSpec.model_us``, computed by the parent)
  times a lognormal noise seeded by (seed, workload, schedule), as the simulated runner's
  stated noise model; the child sleeps ``PIPETUNE_SIMULATED_TIME_SCALE`` x the launches'
  total time.
- Nothing is verified: a trial answers ``verified: False``. For workloads small enough to
  compute on the CPU (``REFERENCE_WORK``), setting a workload up computes the numpy
  reference of the workload's family (its reference module) through the disk cache and
  checks an fp16-rounded copy of it with the same ``check`` the GPU uses, so those code
  paths run in the rehearsal too.
- Faults for tests: schedules named in ``wrong`` (a schedule id, for every workload, or
  ``<workload hash>/<schedule id>``) answer wrong_result; a FaultPlan makes
  the child crash (SIGSEGV) or hang, as workers.runners.faults rehearses them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipetune.workers.runners import elements, reference_cache
from pipetune.workers.runners.cupy_child import TrialSpec
from pipetune.workers.runners.faults import FaultPlan, run_simulated_trial
from pipetune.workers.runners.reference import CONV_REFERENCES
from pipetune.workers.runners.simulated import (
    DEFAULT_REPEAT_SIGMA,
    DEFAULT_SIGMA,
    noise_rng,
    time_scale_from_env,
)
from pipetune.workers.runners.timing import RepeatPolicy, time_launches

_STATE: dict[str, Any] = {}
# The most work (in the family's unit) whose reference the CPU computes, in seconds: a 4
# GFLOP product, or 256 MB of a memory-bound operator's traffic.
REFERENCE_WORK = {"flop": 4e9, "byte": 256e6}
FLOOR_US = 2.5  # the stand-in for an empty kernel's timed latency


class ModelClock:
    """A clock whose every timed launch takes ``latency_ms`` times lognormal noise."""

    def __init__(self, latency_ms: float, rng: np.random.Generator, sigma: float):
        self.latency_ms, self.rng, self.sigma = latency_ms, rng, sigma
        self.total_ms = 0.0

    def pair(self) -> tuple[Any, Any]:
        return None, None

    def record(self, event: Any) -> None:
        pass

    def synchronize(self, event: Any) -> None:
        pass

    def elapsed_ms(self, start: Any, end: Any) -> float:
        sample = self.latency_ms * math.exp(self.sigma * float(self.rng.standard_normal()))
        self.total_ms += sample
        return sample


def init_device(
    device: int,
    stand_in: str | None = None,
    faults: FaultPlan | None = None,
    wrong: tuple[str, ...] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """Describe the stand-in GPU (model.hardware's spec), labelled simulated."""
    from pipetune.model.hardware import get_gpu

    spec = get_gpu(stand_in or "h100")
    _STATE.clear()
    _STATE.update(faults=faults, wrong=frozenset(wrong), seed=seed, scale=time_scale_from_env())
    return {
        "device": device,
        "name": f"simulated {spec.name}",
        "arch": spec.arch,
        "sm_count": spec.sm_count,
        "l2_bytes": spec.l2_bytes,
        "smem_per_block_optin": spec.smem_per_block_bytes,
        "cupy_version": None,
        "cuda_runtime_version": None,
        "cuda_driver_version": None,
        "flush_bytes": max(2 * spec.l2_bytes, 64 << 20),
        "simulated": True,
    }


def prepare_workload(
    canonical: dict[str, Any],
    seed: int,
    cache_dir: str | None = None,
    conv_reference: str = "cublas",
) -> dict[str, Any]:
    """Remember the workload; for a small one, run the reference, cache and check paths."""
    from pipetune.model.family import family_of, parse_any_workload
    from pipetune.workers.families import reference_for

    if conv_reference not in CONV_REFERENCES:
        raise ValueError(f"conv_reference must be one of {CONV_REFERENCES}")
    started = time.perf_counter()
    workload = parse_any_workload(canonical)
    family = family_of(workload)
    checks = reference_for(family)
    _STATE["workload"] = workload.workload_hash
    rehearsed = False
    from_disk = False
    if family.work(workload) <= REFERENCE_WORK[family.work_unit]:
        inputs = checks.input_buffers(workload, seed)

        def compute() -> tuple[Any, Any, str]:
            ref, tol, _, _ = checks.compute_reference(np, workload, inputs, "cublas")
            return ref, tol, "numpy-simulated"

        ref, tol, _, from_disk = reference_cache.cached_reference(
            np,
            workload.workload_hash,
            seed,
            "numpy-simulated",
            Path(cache_dir) if cache_dir else None,
            compute,
            formula=checks.tolerance_text(workload),
        )
        # The reference as the kernel stores it (rounded to the workload's element type).
        rehearsed, _, _ = checks.check(np, elements.narrow(np, ref, workload.dtype), ref, tol)
    return {
        "workload_hash": workload.workload_hash,
        "reference": "none (simulated launch)",
        "reference_note": "the CPU reference and check ran on an fp16 copy of the reference"
        if rehearsed
        else None,
        "reference_from_disk": from_disk,
        "seconds": round(time.perf_counter() - started, 3),
        "simulated": True,
    }


def run_trial(spec: TrialSpec) -> dict[str, Any]:
    """A simulated trial: the model clock through the timing loop (see the module doc)."""
    if _STATE.get("workload") != spec.workload_hash:
        raise RuntimeError("run_trial before prepare_workload for this workload")
    plan: FaultPlan | None = _STATE.get("faults")
    if plan is not None:
        run_simulated_trial(plan.fault_of(spec.workload_hash, spec.schedule_id), [])
    wrong = _STATE["wrong"]
    if spec.schedule_id in wrong or f"{spec.workload_hash}/{spec.schedule_id}" in wrong:
        return {
            "status": "wrong_result",
            "max_abs_error": 1.0,
            "error": "simulated: a wrong result injected for this schedule",
            "simulated": True,
        }
    if spec.model_us is None or not spec.model_us > 0:
        raise RuntimeError("a simulated trial needs the model's latency")
    rng = noise_rng(_STATE["seed"], spec.workload_hash, spec.schedule_id)
    latency_ms = spec.model_us / 1e3 * math.exp(DEFAULT_SIGMA * float(rng.standard_normal()))
    clock = ModelClock(latency_ms, rng, DEFAULT_REPEAT_SIGMA)
    samples = time_launches(lambda: None, lambda: None, clock, spec.policy)
    # The verification launch, the warm-up and (verify_twice) the second run.
    launches = 1 + spec.policy.warmup + int(spec.policy.second_run)
    busy_s = (clock.total_ms + launches * latency_ms) / 1e3
    if _STATE["scale"] > 0:
        time.sleep(busy_s * _STATE["scale"])
    answer: dict[str, Any] = {"status": "ok", "verified": False, "simulated": True}
    if spec.policy.timed:
        answer["samples_ms"] = samples
    return answer


def run_trials(specs: list[TrialSpec]) -> list[dict[str, Any]]:
    """run_trial for each spec in order, as the GPU side does."""
    return [run_trial(spec) for spec in specs]


def timing_floor(cubin_path: str, kernel_name: str, policy: RepeatPolicy) -> list[float]:
    """The stand-in floor (FLOOR_US with noise), through the same timing loop."""
    rng = np.random.default_rng(_STATE.get("seed", 0))
    clock = ModelClock(FLOOR_US / 1e3, rng, DEFAULT_REPEAT_SIGMA)
    return time_launches(lambda: None, lambda: None, clock, policy)
