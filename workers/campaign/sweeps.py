"""The sweeps phase: every schedule of every operator, checkpointed in parts, whatever the
operator's kernel family (its space and model through model.family, its kernels through
the runner).

Each operator's space is measured in a seeded random order (so time on the machine is not
confounded with the schedules' speed), split into parts of about PART_SECONDS of predicted
work (multiples of PART_SIZE schedules; an operator that takes less is one part). Part sizes
follow from the spec sheet and the model alone, so every call cuts an operator the same
way. A part is written as soon as it is measured (``sweeps/<op>.partNNN.t4.json.gz``) and
the archive rewritten before the next part starts, so a call killed at any moment loses at
most the part in progress; when every part of an operator is there, they are merged into
``sweeps/<op>.t4.json.gz`` and the parts deleted. A later call (with ``--have``) goes on
from the first missing part, after checking that the parts it finds are the ones it would
have cut.

Before a part starts, its expected time (the model's kernel times under the campaign's
settings, the compile backlog of its kernels, both scaled by how the parts of this call
compared with their estimates so far) must fit before the deadline; otherwise the phase
stops there, cleanly. All operators' kernels are queued in the compile pool at the start,
in sweep order, so NVRTC works ahead of the GPU on every core.

A family the correctness phase quarantined (workers.campaign.correctness) has its
quarantined knob values left out of every operator's order before the parts are cut (an
operator of a quarantined kind of kernel is skipped whole); each dataset's metadata names
what was left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipetune.model.family import FamilySpace, family_of
from pipetune.model.hardware import GPUSpec, get_gpu
from pipetune.workers.campaign import layout
from pipetune.workers.campaign.correctness import Feature, excluded, features_of
from pipetune.workers.campaign.deadline import Deadline
from pipetune.workers.campaign.plan import (
    CAMPAIGN_SETTINGS,
    COMPILE_S_PER_KERNEL,
    PART_SECONDS,
    PART_SIZE,
    UNKNOWN_COMPILE_S,
    GpuSideCosts,
    trial_seconds,
)
from pipetune.workers.datasets import Dataset, read_t4, write_t4
from pipetune.workers.runners.base import AnyWorkload, Schedule  # any family's
from pipetune.workers.runners.kernel_runner import KernelRunner, model_latencies_us
from pipetune.workers.runners.sweep import sweep

ORDER_SEED = 0


def measurement_order(space: FamilySpace, seed: int = ORDER_SEED) -> list[Schedule]:
    """The space in a seeded random order (the same in every call: parts line up)."""
    order = np.random.default_rng(seed).permutation(len(space))
    return [space[int(i)] for i in order]


def kept_schedules(
    workload: AnyWorkload, order: list[Schedule], left_out: list[Feature]
) -> list[Schedule]:
    """The schedules of ``order`` a quarantine keeps (none where it left out the kind of
    kernel the workload needs), in the same order."""
    if not left_out:
        return order
    return [s for s in order if not excluded(features_of(workload, s), left_out)]


def part_size(workload: AnyWorkload, gpu: GPUSpec, schedules: list[Schedule]) -> int:
    """Schedules per part: a multiple of PART_SIZE near PART_SECONDS of predicted work, from
    the spec sheet (never a calibrated profile: the cut must not change between calls)."""
    spec = get_gpu(gpu.key, calibrated=False)
    t = np.array([(m or 0.0) / 1e6 for m in model_latencies_us(workload, spec, schedules)])
    mean_s = float(trial_seconds(t, CAMPAIGN_SETTINGS.repeats).mean()) if len(t) else 1.0
    units = max(1, int(PART_SECONDS / mean_s) // PART_SIZE)
    return units * PART_SIZE


def parts_of(schedules: list[Schedule], size: int = PART_SIZE) -> list[list[Schedule]]:
    return [schedules[i : i + size] for i in range(0, len(schedules), size)]


def check_parts(out: Path, name: str, parts: list[list[Schedule]]) -> None:
    """The parts found under ``out`` hold the schedules this call would put in them."""
    for k, path in layout.parts_present(out, name).items():
        found = {tuple(r.configuration.values()) for r in read_t4(path).records}
        expected = {tuple(s.as_dict().values()) for s in parts[k]} if k < len(parts) else set()
        if found != expected:
            raise layout.LayoutError(
                f"{path.name} does not hold the schedules of {name}'s part {k} as this version "
                "cuts them: continue with the version that wrote it, or start a new campaign"
            )


@dataclass
class SweepProgress:
    done: list[str] = field(default_factory=list)  # operators with a whole dataset
    partial: dict[str, dict[str, int]] = field(default_factory=dict)  # measured / of
    left: list[str] = field(default_factory=list)  # operators not started
    parts_measured: int = 0  # parts measured in this call
    stopped: str | None = None  # why the phase stopped early
    part_seconds: list[dict[str, Any]] = field(default_factory=list)
    # operators a quarantine cut: how many of their schedules it left out, of how many
    quarantined: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # quarantined whole: nothing to sweep

    def as_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "partial": self.partial,
            "left": self.left,
            "quarantined": self.quarantined,
            "skipped": self.skipped,
            "parts_measured": self.parts_measured,
            "stopped": self.stopped,
            "part_seconds": self.part_seconds,
        }


def merge_parts(paths: list[Path], out: Path) -> Dataset:
    """One dataset of an operator's parts (records in part order); the metadata keeps the
    first part's and lists where and when each part was measured."""
    datasets = [read_t4(p) for p in paths]
    records = [r for d in datasets for r in d.records]
    first = datasets[0].metadata
    meta = {**first, "pipetune": dict(first["pipetune"])}
    meta["pipetune"]["parts"] = [
        {
            "part": i,
            "records": len(d),
            "device_name": d.metadata["pipetune"].get("device_name"),
            "timing_floor_us": d.metadata["pipetune"].get("settings", {}).get("timing_floor_us"),
            "first_timestamp": d.records[0].timestamp if d.records else None,
        }
        for i, d in enumerate(datasets)
    ]
    merged = Dataset(records, knobs=datasets[0].knobs, metadata=meta)
    write_t4(merged, out)
    return merged


class PartEstimator:
    """Expected seconds of a part, corrected by how this call's parts compared so far."""

    def __init__(self, runner: KernelRunner, costs: GpuSideCosts):
        self.runner, self.costs = runner, costs
        self.estimated = 0.0
        self.actual = 0.0

    def raw(self, workload: AnyWorkload, gpu: GPUSpec, part: list[Schedule]) -> float:
        s = CAMPAIGN_SETTINGS
        model = model_latencies_us(workload, gpu, part)
        kernel_s = sum((m or 100.0) / 1e6 for m in model)
        launches = 1 + s.warmup + s.repeats
        gpu_s = len(part) * (self.costs.trial_overhead + s.repeats * self.costs.flush)
        gpu_s += launches * (kernel_s + len(part) * self.costs.gap)
        if self.runner.simulated_launch:
            gpu_s *= self.runner_time_scale()
        variant = self.runner.variant_of(workload)
        backlog = self.runner.compile_backlog(workload, part)
        per_kernel = COMPILE_S_PER_KERNEL.get(variant, UNKNOWN_COMPILE_S)
        compile_s = backlog * per_kernel / self.runner.compile_workers
        return max(gpu_s, compile_s)

    def runner_time_scale(self) -> float:
        from pipetune.workers.runners.simulated import time_scale_from_env

        return max(time_scale_from_env(), 0.05)

    def expected(self, raw: float) -> float:
        factor = self.actual / self.estimated if self.estimated > 0 else 1.0
        return raw * max(factor, 0.5)

    def observe(self, raw: float, seconds: float) -> None:
        self.estimated += raw
        self.actual += seconds


def run_sweeps(
    runner: KernelRunner,
    gpu: GPUSpec,
    operators: dict[str, AnyWorkload],
    out: Path,
    deadline: Deadline,
    checkpoint: Callable[[SweepProgress], None],
    costs: GpuSideCosts | None = None,
    log: Callable[[str], None] = lambda line: None,
    quarantined: dict[str, list[Feature]] | None = None,
) -> SweepProgress:
    """Measure what is missing under ``out``, in order, until done or the deadline.
    ``quarantined``: per family, the knob values (kinds of kernel) its sweeps leave out."""
    costs = costs or GpuSideCosts()
    progress = SweepProgress()
    plans: dict[str, tuple[AnyWorkload, list[list[Schedule]]]] = {}
    left_out: dict[str, list[Feature]] = {}
    for name, workload in operators.items():
        fam = family_of(workload)
        whole = measurement_order(fam.enumerate(workload, gpu))
        left_out[name] = list((quarantined or {}).get(fam.name, []))
        order = kept_schedules(workload, whole, left_out[name])
        if len(order) < len(whole):
            progress.quarantined[name] = {
                "left_out": len(whole) - len(order),
                "of": len(whole),
                "values": [{"knob": k, "value": v} for k, v in left_out[name]],
            }
        if not order:
            progress.skipped.append(name)
            continue
        if layout.sweep_path(out, name).exists():
            progress.done.append(name)
            continue
        plans[name] = (workload, parts_of(order, part_size(workload, gpu, order)))
        check_parts(out, name, plans[name][1])
    # Queue every kernel still needed, in sweep order: NVRTC works ahead of the GPU.
    for name, (workload, parts) in plans.items():
        have = layout.parts_present(out, name)
        todo = [s for k, part in enumerate(parts) if k not in have for s in part]
        runner.compile_ahead(workload, todo)
    estimator = PartEstimator(runner, costs)
    stopped_at: str | None = None
    for name, (workload, parts) in plans.items():
        if stopped_at is not None:
            break
        for k, part in enumerate(parts):
            if k in layout.parts_present(out, name):
                continue
            raw = estimator.raw(workload, gpu, part)
            expected = estimator.expected(raw)
            if not deadline.allows(expected):
                stopped_at = name
                progress.stopped = (
                    # (Numbered from 1, as the log numbers the parts it measured.)
                    f"deadline: {deadline.left():.0f} s left, {name} part {k + 1}/{len(parts)} "
                    f"needs ~{expected:.0f} s"
                )
                break
            started = time.perf_counter()
            dataset = sweep(runner, workload, gpu, part)
            if name in progress.quarantined:  # the dataset says which schedules it lacks
                dataset.metadata["pipetune"]["quarantined"] = progress.quarantined[name]
            write_t4(dataset, layout.part_path(out, name, k))
            seconds = time.perf_counter() - started
            estimator.observe(raw, seconds)
            progress.parts_measured += 1
            progress.part_seconds.append(
                {
                    "operator": name,
                    "part": k,
                    "schedules": len(part),
                    "seconds": round(seconds, 3),
                    "estimated_s": round(raw, 3),
                }
            )
            log(f"sweeps: {name} part {k + 1}/{len(parts)} ({len(part)} schedules) {seconds:.1f} s")
            _record_partial(progress, out, name, parts)
            checkpoint(progress)
        present = layout.parts_present(out, name)
        if len(present) == len(parts):
            merge_parts([present[k] for k in range(len(parts))], layout.sweep_path(out, name))
            for path in present.values():
                path.unlink()
            progress.partial.pop(name, None)
            progress.done.append(name)
            log(f"sweeps: {name} done ({sum(len(p) for p in parts)} schedules)")
            checkpoint(progress)
    for name, (_, parts) in plans.items():
        if name not in progress.done:
            _record_partial(progress, out, name, parts)
    progress.left = [n for n in plans if n not in progress.done and n not in progress.partial]
    return progress


def _record_partial(
    progress: SweepProgress, out: Path, name: str, parts: list[list[Schedule]]
) -> None:
    present = layout.parts_present(out, name)
    if present:
        progress.partial[name] = {
            "measured": sum(len(parts[k]) for k in present),
            "of": sum(len(p) for p in parts),
            "parts": len(present),
            "of_parts": len(parts),
        }
