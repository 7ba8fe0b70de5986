"""The Hopper warpgroup-MMA GEMM family as a :class:`~pipetune.model.family.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipetune.model.family import FIRST_REVISION, GeneratorRevision, KernelFamily, Knob
from pipetune.model.hardware import GPUSpec
from pipetune.model.hopper.analytical import HopperPrediction, evaluate, per_tile_blocks
from pipetune.model.hopper.space import (
    KNOBS,
    TILE_LOOP_LABELS,
    HopperSchedule,
    HopperSpace,
    invalid_reasons,
    schedule_problems,
)
from pipetune.model.hopper.workloads import HOPPER_OPS, HopperWorkload, parse_hopper_workload

MODEL_FEATURES: tuple[str, ...] = (
    "log_T_kernel",
    "log_T_step",
    "log_T_mma",
    "log_T_load",
    "log_T_lat",
    "log_T_fixed",
    "steps_per_sm",
)


class HopperFamily(KernelFamily):
    name = "hopper_gemm"
    label = "Hopper wgmma GEMM"
    title = "Hopper warpgroup-MMA GEMM and batched GEMM (wgmma, TMA loads, persistent, stream-K)"
    work_unit = "flop"
    schedule_heading = "tile, ring, tile loop"
    codegen_module = "pipetune.workers.codegen.wgmma.family"
    reference_module = "pipetune.workers.runners.reference"

    @property
    def ops(self) -> Mapping[str, type]:
        return HOPPER_OPS

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return KNOBS

    def work(self, workload: HopperWorkload) -> float:
        return float(workload.flops)

    def op_generator_revision(self, op: str) -> GeneratorRevision:
        """The GEMM and BMM kernels are one line; each GEMM with its own epilogue (bias +
        GELU, SwiGLU) another, whose epilogue moves its times apart, as in the tensor-core
        family."""
        if op == "hopper_gemm_bias_gelu":
            return GeneratorRevision(f"{self.name}.bias_gelu", FIRST_REVISION)
        if op == "hopper_gemm_swiglu":
            return GeneratorRevision(f"{self.name}.swiglu", FIRST_REVISION)
        return GeneratorRevision(self.name, FIRST_REVISION)

    def schedule_label(self, schedule: Mapping[str, int], workload: Any = None) -> str:
        """The tile, the ring depth and the tile loop: "128x256 s3 persistent"."""
        loop = TILE_LOOP_LABELS[schedule["tile_loop"]]
        return f"{schedule['tile_m']}x{schedule['tile_n']} s{schedule['stages']} {loop}"

    def space_of(
        self, workload: HopperWorkload, gpu: GPUSpec, knobs: Mapping[str, np.ndarray]
    ) -> HopperSpace:
        return HopperSpace(workload, gpu, knobs)

    def invalid_reasons(
        self, knobs: Mapping[str, np.ndarray], workload: HopperWorkload, gpu: GPUSpec
    ) -> dict[str, np.ndarray]:
        return invalid_reasons(dict(knobs), workload, gpu)

    def parse_workload(self, data: dict[str, Any]) -> HopperWorkload:
        return parse_hopper_workload(data)

    def parse_schedule(self, data: dict[str, Any]) -> HopperSchedule:
        return HopperSchedule.from_dict(data)

    def parse_schedule_id(self, text: str) -> HopperSchedule | None:
        return HopperSchedule.from_id(text)

    def enumerate(self, workload: HopperWorkload, gpu: GPUSpec) -> HopperSpace:
        return HopperSpace.enumerate(workload, gpu)

    def schedule_problems(
        self, schedule: HopperSchedule, workload: HopperWorkload, gpu: GPUSpec
    ) -> list[str]:
        return schedule_problems(schedule, workload, gpu)

    def evaluate(self, space: HopperSpace) -> HopperPrediction:
        return evaluate(space)

    def model_features(self, space: HopperSpace) -> tuple[tuple[str, ...], np.ndarray]:
        p = evaluate(space)
        matrix = np.column_stack(
            [
                np.log(p.T_kernel),
                np.log(p.T_step),
                np.log(p.T_mma),
                np.log(p.T_load),
                np.log(p.T_lat),
                np.log(p.T_fixed),
                p.steps_per_sm.astype(np.float64),
            ]
        )
        return MODEL_FEATURES, matrix

    def baseline(self, space: HopperSpace) -> tuple[str, np.ndarray]:
        return "one block per tile", per_tile_blocks(space)


HOPPER_GEMM = HopperFamily()
