"""The campaign's time plan: how the phases and the sweeps fit in calls of a few minutes.

``pipetune campaign plan`` prints it; the README's "GPU work" section quotes it. Inputs:

- measured here: NVRTC compile time per kernel and kind of kernel (the GEMM variants:
  benchmarks/bench_compile.py, RESULTS.md "NVRTC compile time per kernel"; the
  memory-intensive ops by the same method), ``COMPILE_S_PER_KERNEL``;
- the model: every schedule's predicted kernel time (its family's analytical model,
  spec-sheet profile);
- stated assumptions about the GPU machine (``GpuSideCosts``), to be replaced by the rates the
  first call measures (campaign.json records each phase's seconds and each part's).

Per trial, with the campaign's measurement settings (1 warm-up, adaptive 5..10 repeats)::

    trial = overhead + (1 verification + warmup) x (T + gap) + R x (T + gap + flush)

with T the model's kernel time, R the timed repeats (5 when the spread settles, at most 10).
Compile runs ahead on ``compile_threads`` threads in sweep order, so an operator ends at
``max(previous end + its GPU time, its kernels compiled)``; a fresh machine compiles again
what its call needs (cubins cannot travel). A kernel is one (build key, schedule) of the
family's generator (workers.runners.builds): the operators of a GEMM variant share theirs,
and so do the memory-intensive operators of an op (but for the register-cached rows, whose
length is compiled in). Operators are checkpointed in parts, so a call ends inside an
operator and the next call goes on from the next part.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipetune.model.family import family_of
from pipetune.model.hardware import GPUSpec
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.kernel_runner import TRIAL_OVERHEAD_S

# How the campaign times every schedule (one definition: the sweeps use it, the plan reads it).
CAMPAIGN_SETTINGS = MeasureSettings(warmup=1, repeats=10, min_repeats=5, settle=0.03, seed=0)
PART_SIZE = 256  # the unit of a sweep checkpoint (schedules), and the plan's granularity
PART_SECONDS = 20.0  # about how long a checkpointed part takes (what a killed call loses)

# NVRTC CPU seconds per kernel in the compile pool, per kind of kernel (the runner's
# ``variant_of``: the generator's kernel_kind). GEMM variants: benchmarks/bench_compile.py
# (2026-11-23, 32 kernels per variant, process CPU time per kernel with every core compiling;
# CPU time, because the shared VM's wall times were inflated by other work; RESULTS.md has
# the table); gemm_nk (not in the suite) is taken as gemm_kn. Memory-intensive ops: the same
# method (32 of the memops suite's distinct kernels of the op, seed 2, through compile_many
# on 2 cores, cache off, for sm_90; 2026-11-24, load average 0.3); reduce (not in the suite,
# in the correctness phase) from 32 of reduce(8192, 768), (1024, 3072) and (98304, 128).
# They compile in under half a GEMM's time (one short loop per pass, no MMA pipeline):
# gemm_kn took 0.228 in the same session, against the table's 0.276 at load average 10, so
# these may read ~20% low beside the GEMMs'. In the default campaign the pool compiles the
# memops kernels (33 s of 14 threads) while the GPU still times the ALCOP suite, so the plan
# hardly depends on them.
COMPILE_S_PER_KERNEL: dict[str, float] = {
    "gemm_kn": 0.276,
    "gemm_nk": 0.276,
    # The fused GEMM + SwiGLU: the GEMM's loop and a longer epilogue, taken as gemm_kn.
    "gemm_swiglu_kn": 0.276,
    "gemm_swiglu_nk": 0.276,
    # The GEMM with bias + GELU in its epilogue: the GEMM's loop, an epilogue of erff/tanhf.
    "gemm_bias_gelu_kn": 0.276,
    "gemm_bias_gelu_nk": 0.276,
    "bmm": 0.199,
    "bmm_nk": 0.199,  # (bmm's loop with gemm_nk's B loader: taken as bmm)
    "conv2d": 0.407,
    "conv3d": 0.433,
    "softmax": 0.102,
    "softmax-causal": 0.102,  # (softmax's passes and one masked vector: taken as softmax)
    "layernorm": 0.134,
    # rmsnorm and silu_mul: measured beside layernorm and bias_gelu on 2026-12-05 and scaled
    # to those two's figures here (RESULTS.md, "NVRTC compile time per kernel")
    "rmsnorm": 0.109,
    "bias_gelu": 0.083,
    "bias_gelu-tanh": 0.075,
    "silu_mul": 0.089,
    "reduce-sum": 0.063,
    "reduce-max": 0.064,
}
UNKNOWN_COMPILE_S = 0.3  # a kind of kernel not measured yet: about a GEMM's


@dataclass(frozen=True)
class GpuSideCosts:
    """Assumed costs on the GPU machine (seconds); the first call's campaign.json replaces
    them with measured ones."""

    trial_overhead: float = TRIAL_OVERHEAD_S  # module load, NaN fill, verification, IPC
    flush: float = 40e-6  # 2 x 50 MiB memset at ~3 TB/s, plus its launch
    gap: float = 3e-6  # event pair and launch gap per launch (the probe's timing floor)
    setup: float = 45.0  # install, imports, two child processes, describe, checks, floor
    # GEMMs: 612 kernels compiled and verified, 17 references (the estimate made for 324;
    # the 72 fused GEMM + SwiGLU kernels add ~1.5 s of compile on 14 threads, the 72
    # bfloat16 kernels about as much, and the 108 GEMM + bias + GELU kernels ~2 s: 25 s)
    correctness: float = 25.0
    # memops: 560 kernels (~0.1 CPU s each: 4 s on 14 threads), 20 small references
    # (997 x 1032, 37 x 4200, the causal softmax's 2064 x 1032 and 36 x 4200), 560
    # verification launches of microseconds
    correctness_memops: float = 10.0
    profile: float = 20.0  # pipetune calibrate's microbenchmarks
    baseline_per_operator: float = 1.5  # inputs, cuDNN's algorithm search, 12 launches
    # memops: inputs drawn on the device, PyTorch's first call of the op, 12 launches of at
    # most ~1 ms (1.6 GB moved by the largest softmax at ~3 TB/s)
    baseline_per_memops_operator: float = 0.5
    reserve: float = 20.0  # summary and archive at the end of a call
    compile_threads: int = 14  # 16 cores less the GPU process and the measuring thread

    def correctness_s(self, families: Iterable[str]) -> float:
        """The correctness phase for these kernel families."""
        per_family = {"tensor_gemm": self.correctness, "memops": self.correctness_memops}
        return sum(per_family.get(name, self.correctness) for name in families)

    def baseline_s(self, workload: Any) -> float:
        """The baselines phase's time on one operator."""
        if family_of(workload).name == "memops":
            return self.baseline_per_memops_operator
        return self.baseline_per_operator


@dataclass
class OperatorPlan:
    name: str
    variant: str  # the kind of kernel (COMPILE_S_PER_KERNEL's key)
    trials: int
    model_s: float  # one launch of every schedule, by the model
    gpu_s_low: float  # every schedule settles after min_repeats
    gpu_s_high: float  # every schedule needs max repeats
    # (build key, schedule id) of each schedule's kernel, in space order: what is compiled
    kernel_ids: list[tuple[str, str]] = field(repr=False, default_factory=list)
    per_trial_s: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    family: str = "tensor_gemm"
    baseline_s: float = 0.0  # the baselines phase's time on it

    @property
    def compile_s_per_kernel(self) -> float:
        return COMPILE_S_PER_KERNEL.get(self.variant, UNKNOWN_COMPILE_S)


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
    operators: dict[str, Any],
    settings: MeasureSettings = CAMPAIGN_SETTINGS,
    costs: GpuSideCosts | None = None,
) -> list[OperatorPlan]:
    from pipetune.workers.runners.builds import generator_of

    costs = costs or GpuSideCosts()
    rows = []
    for name, workload in operators.items():
        fam = family_of(workload)
        codegen = generator_of(workload)
        space = fam.enumerate(workload, gpu)
        t = fam.evaluate(space).T_kernel
        high = trial_seconds(t, settings.repeats, settings, costs)
        rows.append(
            OperatorPlan(
                name=name,
                variant=str(codegen.kernel_kind(workload)),
                trials=len(space),
                model_s=float(t.sum()),
                gpu_s_low=float(trial_seconds(t, settings.fewest_repeats, settings, costs).sum()),
                gpu_s_high=float(high.sum()),
                kernel_ids=[(str(codegen.build_key(workload, s)), s.id) for s in space],
                per_trial_s=high,
                family=fam.name,
                baseline_s=costs.baseline_s(workload),
            )
        )
    return rows


def plan_first_phases(rows: list[OperatorPlan], costs: GpuSideCosts) -> float:
    """Call 1's phases before the sweeps, setup aside: correctness (for the operators'
    families), profile, and the baselines of every operator."""
    families = dict.fromkeys(r.family for r in rows)
    return costs.correctness_s(families) + costs.profile + sum(r.baseline_s for r in rows)


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
    first_phases = plan_first_phases(rows, costs)
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
                new = set(row.kernel_ids[start:stop]) - compiled
                compile_s = len(new) * row.compile_s_per_kernel / costs.compile_threads
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
    operators: dict[str, Any],
    *,
    calls: int = 3,
    minutes: float = 8.0,
    costs: GpuSideCosts | None = None,
) -> dict[str, Any]:
    """The plan as one JSON-ready document (``pipetune campaign plan --json``)."""
    costs = costs or GpuSideCosts()
    rows = operator_plans(gpu, operators, costs=costs)
    call_plans = plan_calls(rows, calls=calls, minutes=minutes, costs=costs)
    # Trials of each operator the calls sweep: an operator is left unless all of its trials
    # are planned (one the last call cuts short is left too; counting an operator with any
    # part planned as done made `plan` say "fits" of calls that leave most of it unswept).
    planned: dict[str, int] = {}
    for c in call_plans:
        for name, start, stop in c.sweeps:
            planned[name] = planned.get(name, 0) + stop - start
    left = [r.name for r in rows if planned.get(r.name, 0) < r.trials]
    kernels = {k: r.compile_s_per_kernel for r in rows for k in r.kernel_ids}
    by_kind: dict[str, set[tuple[str, str]]] = {}
    for r in rows:
        by_kind.setdefault(r.variant, set()).update(r.kernel_ids)
    return {
        "gpu": gpu.key,
        "settings": CAMPAIGN_SETTINGS.as_dict(),
        "costs": {k: v for k, v in vars(costs).items()},
        "compile_s_per_kernel": COMPILE_S_PER_KERNEL,
        "trials": sum(r.trials for r in rows),
        "distinct_kernels": len(kernels),
        "kernels_by_kind": {kind: len(ids) for kind, ids in by_kind.items()},
        "compile_s_all_kernels": sum(kernels.values()) / costs.compile_threads,
        "first_call_phases_s": plan_first_phases(rows, costs),
        "model_kernel_s": sum(r.model_s for r in rows),
        "gpu_s_low": sum(r.gpu_s_low for r in rows),
        "gpu_s_high": sum(r.gpu_s_high for r in rows),
        "operators": [
            {
                "operator": r.name,
                "family": r.family,
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
