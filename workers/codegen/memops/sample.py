"""The memory-intensive family's samples for compile, emulation and the GPU campaign's
correctness checks (workers/codegen/cover.py: a cover of every knob value, any family), and
the strata and tails those checks count."""

from __future__ import annotations

import numpy as np

from pipetune.model.memops.space import KNOBS, MemSchedule, geometry
from pipetune.model.memops.workloads import MemWorkload
from pipetune.workers.codegen.cover import compile_sample, covering_sample, stratified_sample

KNOB = {k.name: k for k in KNOBS}
__all__ = ["compile_sample", "covering_sample", "stratified_sample", "stratum", "tails"]


def stratum(schedule: MemSchedule) -> str:
    """The stratum a correctness check counts a schedule in: how rows map to blocks (one
    per block, packed, split with a second kernel or fused) and where a row is kept."""
    kept = KNOB["row_cache"].label(schedule.row_cache)
    if schedule.blocks_per_row > 1:
        mapping = "split-" + KNOB["split_mode"].label(schedule.split_mode)
    else:
        mapping = "packed" if schedule.rows_per_block > 1 else "one-row"
    return f"mapping={mapping},row_cache={kept}"


def tails(workload: MemWorkload, schedule: MemSchedule) -> dict[str, bool]:
    """Where a schedule leaves a partial unit of work on a workload: a last row group with
    fewer rows than a block packs ("rows"), a last split segment shorter than the others
    ("segment"), threads of a row with one vector fewer than the others ("lanes")."""
    g = geometry(schedule.knob_arrays(), workload)
    nvec = int(np.asarray(g.nvec).reshape(-1)[0])
    seg = int(np.asarray(g.seg_vecs).reshape(-1)[0])
    return {
        "rows": workload.rows % schedule.rows_per_block != 0,
        "segment": nvec % schedule.blocks_per_row != 0,
        "lanes": seg % schedule.threads_per_row != 0,
    }
