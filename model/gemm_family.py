"""The pipelined tensor-core GEMM family as a :class:`~pipetune.model.family.KernelFamily`.

An adapter over the family's existing modules (workloads, space, analytical, pipelining),
with no behaviour of its own: what it answers is what those modules answer, so the rest of
pipetune can move to the family interface without a change in any ranking, space or
prediction (tests/test_family.py checks that).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipetune.model.analytical import Prediction
from pipetune.model.analytical import evaluate as alcop_evaluate
from pipetune.model.family import FIRST_REVISION, GeneratorRevision, KernelFamily, Knob
from pipetune.model.hardware import GPUSpec
from pipetune.model.pipelining import non_pipelined
from pipetune.model.space import (
    KNOB_DECLARATION,
    KNOB_NAMES,
    Schedule,
    Space,
    invalid_reasons,
    schedule_problems,
)
from pipetune.model.workloads import OPS, AnyWorkload, Conv2d, Conv3d, parse_workload

# The ops whose kernels the convolution loader makes (their own generator line).
CONV_OPS = tuple(op for op, cls in OPS.items() if issubclass(cls, (Conv2d, Conv3d)))


class TensorGemmFamily(KernelFamily):
    name = "tensor_gemm"
    label = "tensor-core GEMM"
    title = "pipelined tensor-core GEMM, batched GEMM and implicit-GEMM convolutions (ALCOP)"
    work_unit = "flop"
    schedule_heading = "tile MxNxK warps stages"
    codegen_module = "pipetune.workers.codegen"
    reference_module = "pipetune.workers.runners.reference"
    # On the 23 ALCOP operators measured on the H100 and the H200, each shape unseen, `auto`
    # with the learned prior finds 0.983 / 0.988 of the optimum in 10 trials where the
    # analytical model alone finds 0.956 / 0.963, and 0.997 / 0.999 in 50 against 0.994 /
    # 0.994 (benchmarks/RESULTS.md, "the learned prior ranks within a shape").
    learns_by_default = True

    @property
    def ops(self) -> Mapping[str, type]:
        return OPS

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return KNOB_DECLARATION

    def work(self, workload: AnyWorkload) -> float:
        return float(workload.flops)

    def schedule_label(self, schedule: Mapping[str, int], workload: Any = None) -> str:
        """The block tile MxNxK, the warps and the pipeline depths: "128x64x32 2x2w 3/2"."""
        s = Schedule(**{k: schedule[k] for k in KNOB_NAMES})
        return (
            f"{s.block_m}x{s.block_n}x{s.block_k} {s.block_row_warps}x{s.block_col_warps}w "
            f"{s.smem_stages}/{s.reg_stages}"
        )

    def space_of(
        self, workload: AnyWorkload, gpu: GPUSpec, knobs: Mapping[str, np.ndarray]
    ) -> Space:
        return Space(workload, gpu, knobs)

    def invalid_reasons(
        self, knobs: Mapping[str, np.ndarray], workload: AnyWorkload, gpu: GPUSpec
    ) -> dict[str, np.ndarray]:
        return invalid_reasons(dict(knobs), workload, gpu)

    def op_generator_revision(self, op: str) -> GeneratorRevision:
        """GEMMs and batched GEMMs share one generator line, convolutions (an implicit GEMM
        with its own loader of the input's K dimension) another, the GEMM with the SwiGLU
        in its epilogue a third, the GEMM with bias + GELU in its epilogue a fourth.
        Convolutions, revision 2:
        the loader splits K into filter tap and channel by multiplication (6b6c2e1,
        2026-11-28), every schedule 0.80x its time with the loader that divided (measured on
        an H200, benchmarks/RESULTS.md "GPU calls on H200, 2026-11-30")."""
        if op in CONV_OPS:
            return GeneratorRevision(f"{self.name}.conv", 2)
        if op == "gemm_swiglu":  # the GEMM's loop with its own epilogue
            return GeneratorRevision(f"{self.name}.swiglu", FIRST_REVISION)
        if op == "gemm_bias_gelu":
            return GeneratorRevision(f"{self.name}.bias_gelu", FIRST_REVISION)
        return GeneratorRevision(f"{self.name}.gemm", FIRST_REVISION)

    def parse_workload(self, data: dict[str, Any]) -> AnyWorkload:
        return parse_workload(data)

    def parse_schedule(self, data: dict[str, Any]) -> Schedule:
        return Schedule.from_dict(data)

    def parse_schedule_id(self, text: str) -> Schedule | None:
        return Schedule.from_id(text)

    def enumerate(self, workload: AnyWorkload, gpu: GPUSpec) -> Space:
        return Space.enumerate(workload, gpu)

    def schedule_problems(
        self, schedule: Schedule, workload: AnyWorkload, gpu: GPUSpec
    ) -> list[str]:
        return schedule_problems(schedule, workload, gpu)

    def evaluate(self, space: Space) -> Prediction:
        return alcop_evaluate(space)

    def model_features(self, space: Space) -> tuple[tuple[str, ...], np.ndarray]:
        # Imported here: the cost model module loads XGBoost.
        from pipetune.model.cost_model import ANALYTICAL_FEATURES, analytical_features

        return ANALYTICAL_FEATURES, analytical_features(space)

    def baseline(self, space: Space) -> tuple[str, np.ndarray]:
        return "non-pipelined", non_pipelined(space)


TENSOR_GEMM = TensorGemmFamily()
