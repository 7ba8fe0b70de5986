"""The campaign's time plan: how the phases and the sweeps fit in calls of a few minutes.

``pipetune campaign plan`` prints it; the README's "GPU work" section quotes it. Inputs:

- measured here: NVRTC compile time per kernel and variant (benchmarks/bench_compile.py;
  RESULTS.md, "NVRTC compile time per kernel"), ``COMPILE_S_PER_KERNEL``;
- the model: every schedule's predicted kernel time (model.analytical, spec-sheet profile);
- stated assumptions about the GPU machine (``GpuSideCosts``), to be replaced by the rates the
  first call measures (campaign.json records each phase's seconds and each part's).

Per trial, with the campaign's measurement settings (1 warm-up, adaptive 5..10 repeats)::

    trial = overhead + (1 verification + warmup) x (T + gap) + R x (T + gap + flush)

with T the model's kernel time, R the timed repeats (5 when the spread settles, at most 10).
Compile runs ahead on ``compile_threads`` threads in sweep order, so an operator ends at
``max(previous end + its GPU time, its kernels compiled)``; a fresh machine compiles again
what its call needs (cubins cannot travel). Operators are checkpointed in parts, so a call
ends inside an operator and the next call goes on from the next part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipetune.model.analytical import evaluate
from pipetune.model.hardware import GPUSpec
from pipetune.model.space import Space
from pipetune.model.workloads import AnyWorkload
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.kernel_runner import TRIAL_OVERHEAD_S

# How the campaign times every schedule (one definition: the sweeps use it, the plan reads it).
CAMPAIGN_SETTINGS = MeasureSettings(warmup=1, repeats=10, min_repeats=5, settle=0.03, seed=0)
PART_SIZE = 256  # the unit of a sweep checkpoint (schedules), and the plan's granularity
PART_SECONDS = 20.0  # about how long a checkpointed part takes (what a killed call loses)

# NVRTC CPU seconds per kernel in the compile pool, per variant: benchmarks/bench_compile.py
# (2026-11-23, 32 kernels per variant, process CPU time per kernel with every core compiling;
# CPU time, because the shared VM's wall times were inflated by other work; RESULTS.md has
# the table). gemm_nk (not in the suite) is taken as gemm_kn.
COMPILE_S_PER_KERNEL: dict[str, float] = {
    "gemm_kn": 0.276,
    "gemm_nk": 0.276,
    "bmm": 0.199,
    "conv2d": 0.407,
    "conv3d": 0.433,
}


@dataclass(frozen=True)
class GpuSideCosts:
    """Assumed costs on the GPU machine (seconds); the first call's campaign.json replaces
    them with measured ones."""

    trial_overhead: float = TRIAL_OVERHEAD_S  # module load, NaN fill, verification, IPC
    flush: float = 40e-6  # 2 x 50 MiB memset at ~3 TB/s, plus its launch
    gap: float = 3e-6  # event pair and launch gap per launch (the probe's timing floor)
    setup: float = 45.0  # install, imports, two child processes, describe, checks, floor
    correctness: float = 20.0  # 324 kernels compiled and verified, 9 references
    profile: float = 20.0  # pipetune calibrate's microbenchmarks
    baseline_per_operator: float = 1.5  # inputs, cuDNN's algorithm search, 12 launches
    reserve: float = 20.0  # summary and archive at the end of a call
    compile_threads: int = 14  # 16 cores less the GPU process and the measuring thread


@dataclass
class OperatorPlan:
    name: str
    variant: str
    trials: int
    model_s: float  # one launch of every schedule, by the model
    gpu_s_low: float  # every schedule settles after min_repeats
    gpu_s_high: float  # every schedule needs max repeats
    kernel_ids: list[str] = field(repr=False, default_factory=list)
    per_trial_s: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))


@dataclass
class CallPlan:
    call: int
    phases_s: float
    sweeps: list[tuple[str, int, int]]  # (operator, first trial, end trial) in this call
    compiled: int = 0  # kernels this call compiles
    end_s: float = 0.0


def trial_seconds(
    t_kernel: np.ndarray,
    repeats: int,
    settings: MeasureSettings = CAMPAIGN_SETTINGS,
    costs: GpuSideCosts | None = None,
) -> np.ndarray:
    """Seconds of each trial on the GPU side (the module doc's formula), given the kernel
    times ``t_kernel`` (seconds) and ``repeats`` timed launches."""
    costs = costs or GpuSideCosts()
    untimed = (1 + settings.warmup) * (t_kernel + costs.gap)
    return costs.trial_overhead + untimed + repeats * (t_kernel + costs.gap + costs.flush)


def operator_plans(
    gpu: GPUSpec,
    operators: dict[str, AnyWorkload],
    settings: MeasureSettings = CAMPAIGN_SETTINGS,
    costs: GpuSideCosts | None = None,
) -> list[OperatorPlan]:
    from pipetune.workers.codegen import variant_of

    costs = costs or GpuSideCosts()
    rows = []
    for name, workload in operators.items():
        space = Space.enumerate(workload, gpu)
        t = evaluate(space).T_kernel
        high = trial_seconds(t, settings.repeats, settings, costs)
        rows.append(
            OperatorPlan(
                name=name,
                variant=variant_of(workload),
                trials=len(space),
                model_s=float(t.sum()),
                gpu_s_low=float(trial_seconds(t, settings.fewest_repeats, settings, costs).sum()),
                gpu_s_high=float(high.sum()),
                kernel_ids=space.ids,
                per_trial_s=high,
            )
        )
    return rows


def plan_calls(
    rows: list[OperatorPlan],
    *,
    calls: int,
    minutes: float,
    costs: GpuSideCosts | None = None,
    part_size: int = PART_SIZE,
) -> list[CallPlan]:
    """Assign the sweeps' parts to calls (upper-bound repeats), phases first in call 1."""
    costs = costs or GpuSideCosts()
    budget = minutes * 60 - costs.reserve
    first_phases = costs.correctness + costs.profile + costs.baseline_per_operator * len(rows)
    plans: list[CallPlan] = []

    def new_call() -> tuple[CallPlan, set[tuple[str, str]]]:
        phases = costs.setup + (first_phases if not plans else 0.0)
        plan = CallPlan(call=len(plans) + 1, phases_s=phases, sweeps=[], end_s=phases)
        plans.append(plan)
        return plan, set()

    call, compiled = new_call()
    compile_done = call.end_s
    for row in rows:
        for start in range(0, row.trials, part_size):
            stop = min(row.trials, start + part_size)
            while True:
                new = {(row.variant, k) for k in row.kernel_ids[start:stop]} - compiled
                compile_s = len(new) * COMPILE_S_PER_KERNEL[row.variant] / costs.compile_threads
                ends_compiling = compile_done + compile_s
                end = max(call.end_s + float(row.per_trial_s[start:stop].sum()), ends_compiling)
                if end <= budget or (not call.sweeps and len(plans) >= calls):
                    break
                if len(plans) >= calls:
                    return plans  # what is left does not fit in the calls given
                call, compiled = new_call()
                compile_done = call.end_s
            compiled |= new
            call.compiled += len(new)
            compile_done = ends_compiling
            call.end_s = end
            if call.sweeps and call.sweeps[-1][0] == row.name:
                call.sweeps[-1] = (row.name, call.sweeps[-1][1], stop)
            else:
                call.sweeps.append((row.name, start, stop))
    return plans


def plan_document(
    gpu: GPUSpec,
    operators: dict[str, AnyWorkload],
    *,
    calls: int = 3,
    minutes: float = 8.0,
    costs: GpuSideCosts | None = None,
) -> dict[str, Any]:
    """The plan as one JSON-ready document (``pipetune campaign plan --json``)."""
    costs = costs or GpuSideCosts()
    rows = operator_plans(gpu, operators, costs=costs)
    call_plans = plan_calls(rows, calls=calls, minutes=minutes, costs=costs)
    planned = {(name, start) for c in call_plans for name, start, _ in c.sweeps}
    left = [
        r.name
        for r in rows
        if not any((r.name, s) in planned for s in range(0, r.trials, PART_SIZE))
    ]
    kernels = {(r.variant, k) for r in rows for k in r.kernel_ids}
    return {
        "gpu": gpu.key,
        "settings": CAMPAIGN_SETTINGS.as_dict(),
        "costs": {k: v for k, v in vars(costs).items()},
        "compile_s_per_kernel": COMPILE_S_PER_KERNEL,
        "trials": sum(r.trials for r in rows),
        "distinct_kernels": len(kernels),
        "compile_s_all_kernels": sum(COMPILE_S_PER_KERNEL[v] for v, _ in kernels)
        / costs.compile_threads,
        "model_kernel_s": sum(r.model_s for r in rows),
        "gpu_s_low": sum(r.gpu_s_low for r in rows),
        "gpu_s_high": sum(r.gpu_s_high for r in rows),
        "operators": [
            {
                "operator": r.name,
                "variant": r.variant,
                "trials": r.trials,
                "model_kernel_s": r.model_s,
                "gpu_s_low": r.gpu_s_low,
                "gpu_s_high": r.gpu_s_high,
            }
            for r in rows
        ],
        "calls": [
            {
                "call": c.call,
                "phases_s": c.phases_s,
                "compiled_kernels": c.compiled,
                "end_s": c.end_s,
                "budget_s": minutes * 60,
                "sweeps": [{"operator": n, "trials": [a, b]} for n, a, b in c.sweeps],
            }
            for c in call_plans
        ],
        "fits": not left and all(c.end_s <= minutes * 60 - costs.reserve for c in call_plans),
        "left": left,
    }
