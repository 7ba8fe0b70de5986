"""The memory-intensive family (AStitch) as a :class:`~pipetune.model.family.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipetune.model.family import KernelFamily, Knob
from pipetune.model.hardware import GPUSpec
from pipetune.model.memops.analytical import MemPrediction, evaluate, one_row_per_block
from pipetune.model.memops.space import (
    KNOBS,
    MemSchedule,
    MemSpace,
    invalid_reasons,
    schedule_problems,
)
from pipetune.model.memops.workloads import MEM_OPS, MemWorkload, parse_mem_workload

_KNOB = {k.name: k for k in KNOBS}

# The model's terms the schedule's own features lack (the wave tail is one of those already:
# a second column of the same name would break the cost model's feature table).
MODEL_FEATURES: tuple[str, ...] = (
    "log_T_kernel",
    "log_T_item",
    "log_T_mem",
    "log_T_xfer",
    "log_T_issue",
    "N_waves",
    "l2_hit",
    "latency_bound",
)


class MemoryFamily(KernelFamily):
    name = "memops"
    label = "memory-intensive"
    title = "memory-intensive row operators with adaptive thread mapping (AStitch)"
    work_unit = "byte"
    schedule_heading = "thread mapping"
    codegen_module = "pipetune.workers.codegen.memops"
    reference_module = "pipetune.workers.runners.memops_reference"
    # On the 36 memory-intensive operators measured on each of the H100 and the H200, each
    # shape unseen, `auto` with the learned prior finds 0.995 / 0.990 of the optimum in 10
    # trials where the analytical model alone finds 0.977 / 0.971 (benchmarks/RESULTS.md,
    # "the learned prior ranks within a shape"; before its cost model learned each shape
    # relative to its median it was no better than the model, and this was False).
    learns_by_default = True

    @property
    def ops(self) -> Mapping[str, type]:
        return MEM_OPS

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def work(self, workload: MemWorkload) -> float:
        return float(workload.compulsory_bytes)

    def schedule_label(self, schedule: Mapping[str, int], workload: Any = None) -> str:
        """The thread mapping in one cell: threads per row x rows per block, "/blocks per
        row" and how split rows join (not for an element-wise chain: its split blocks never
        join), vector width, where the row is kept, "w<n>" for a wave bound:
        "128x1 /4 fused v8 smem w1"."""
        k = schedule
        text = f"{k['threads_per_row']}x{k['rows_per_block']}"
        if k["blocks_per_row"] > 1:
            text += f" /{k['blocks_per_row']}"
            if workload is None or workload.has_reduction:
                text += " " + _KNOB["split_mode"].label(k["split_mode"])
        text += f" v{k['vector_width']} {_KNOB['row_cache'].label(k['row_cache'])}"
        if k["max_waves"]:
            text += f" w{k['max_waves']}"
        return text

    def space_of(
        self, workload: MemWorkload, gpu: GPUSpec, knobs: Mapping[str, np.ndarray]
    ) -> MemSpace:
        return MemSpace(workload, gpu, knobs)

    def invalid_reasons(
        self, knobs: Mapping[str, np.ndarray], workload: MemWorkload, gpu: GPUSpec
    ) -> dict[str, np.ndarray]:
        return invalid_reasons(dict(knobs), workload, gpu)

    def parse_workload(self, data: dict[str, Any]) -> MemWorkload:
        return parse_mem_workload(data)

    def parse_schedule(self, data: dict[str, Any]) -> MemSchedule:
        return MemSchedule.from_dict(data)

    def parse_schedule_id(self, text: str) -> MemSchedule | None:
        return MemSchedule.from_id(text)

    def enumerate(self, workload: MemWorkload, gpu: GPUSpec) -> MemSpace:
        return MemSpace.enumerate(workload, gpu)

    def schedule_problems(
        self, schedule: MemSchedule, workload: MemWorkload, gpu: GPUSpec
    ) -> list[str]:
        return schedule_problems(schedule, workload, gpu)

    def evaluate(self, space: MemSpace) -> MemPrediction:
        return evaluate(space)

    def model_features(self, space: MemSpace) -> tuple[tuple[str, ...], np.ndarray]:
        p = evaluate(space)
        matrix = np.column_stack(
            [
                np.log(p.T_kernel),
                np.log(p.T_item),
                np.log(p.T_mem),
                np.log(np.maximum(p.T_xfer, 1e-12)),
                np.log(np.maximum(p.T_issue, 1e-12)),
                p.N_waves,
                p.l2_hit,
                (p.bottleneck == "latency").astype(np.float64),
            ]
        )
        return MODEL_FEATURES, matrix

    def baseline(self, space: MemSpace) -> tuple[str, np.ndarray]:
        return "one row per block", one_row_per_block(space)


MEMORY_OPS = MemoryFamily()
