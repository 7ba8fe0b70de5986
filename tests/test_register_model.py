"""The occupancy register estimate against what ptxas really allocates (NVRTC, no GPU)."""

from __future__ import annotations

import numpy as np

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import gemm
from pipetune.workers.codegen import generate
from pipetune.workers.codegen.sample import stratified_sample
from pipetune.workers.compile import compile_many


def test_predicted_registers_beat_the_allowance_on_ptxas_counts():
    workload = gemm(2048, 2048, 2048)
    space = Space.enumerate(workload, get_gpu("h100"))
    schedules = stratified_sample(space, 48, seed=11)
    results = compile_many([generate(workload, s) for s in schedules], "sm_90")
    rows = np.array([space.index(s) for s in schedules])
    real = np.array([r.registers for r in results], dtype=float)
    fitted = space.predicted_registers[rows]
    allowance = space.est_registers[rows]
    rms_fit = np.sqrt(np.mean((real - fitted) ** 2))
    rms_allowance = np.sqrt(np.mean((real - allowance) ** 2))
    assert rms_fit < rms_allowance
    assert rms_fit < 25
