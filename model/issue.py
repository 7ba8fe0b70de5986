"""Instruction issue of the tensor-core GEMM family's main loop (reading 8 of
model/analytical.py): how many warp instructions one K step of a block issues per warp.

Each of an SM's warp schedulers issues one warp instruction per clock. A K step of a warp
issues its `mma.sync`s, its `ldmatrix`es, its `cp.async` copies of the next tile and the
integer work that forms their addresses; where those together outnumber what the tensor
pipe can take in the same time, the K step lasts as long as its issue, not as its MMAs. The
generator's convolutions form every copy of the im2col operand from a divided output
index and a filter tap (workers/codegen/cuda_text.py, `conv_a_src`): 3.5 to 5 times the
work of a plain operand's copy, which makes wide K steps of pipelined convolutions issue-
bound on Hopper (RESULTS.md, "Model: a K step's instructions").

The counts of mma, ldmatrix and copy instructions follow from the schedule exactly; the
integer work per copy, per ldmatrix, per copy part and per step is a property of the code
the generator emits, counted in the SASS of a sample of its kernels (`python -m
benchmarks.bench_sass`, NVRTC and nvdisasm, no GPU) and checked there and in
tests/test_issue_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipetune.model.space import MMA_TILE, VECTOR_ELEMS, Space
from pipetune.model.workloads import AnyWorkload, Conv2d, Conv3d


@dataclass(frozen=True)
class IntegerWork:
    """Integer and control instructions a warp issues per K step beside its mma, ldmatrix and
    cp.async instructions: per copy of the A operand, per copy of B, per ldmatrix, per part of
    the next tile's copies (each part forms its rows' base addresses afresh: for a
    convolution, the split of its K index into filter tap and channel), and once."""

    per_a_copy: float
    per_b_copy: float
    per_ldmatrix: float
    per_copy_part: float
    per_step: float


# Counted in the SASS of the generated kernels for sm_90 (NVRTC 13; `python -m
# benchmarks.bench_sass`, a stratified sample of each kernel kind's space, non-negative least
# squares on the main loop's instruction counts). The A operand of a convolution is gathered
# (im2col): its copies cost the division of the output index into image coordinates and the
# bounds checks, and each part the split of its K index (both by multiplication since
# 2026-11-28: per part 109-113 before, with divisions by the filter sizes).
INTEGER_WORK: dict[str, IntegerWork] = {
    "gemm": IntegerWork(9.3, 12.2, 0.3, 42.3, 0.0),
    "conv2d": IntegerWork(38.6, 9.8, 0.0, 55.0, 0.0),
    "conv3d": IntegerWork(48.8, 9.6, 0.0, 56.2, 0.0),
}

# With two register stages and a K step of one k16 slice (BK 16), the loop copies the next
# step's fragments from the second buffer into the first every step (workers/codegen/
# cuda_text.py, `copy_frags_1_to_0`; reading 15 of model/analytical.py): 4 registers per
# fragment tile row or column, which ptxas emits as 8 instructions each (counted in the SASS
# for sm_90: 32, 64 and 47 more than one register stage's loop for 2x2, 4x4 and 4x2 warp
# tiles; tests/test_issue_model.py).
FRAGMENT_COPY_PER_TILE = 8.0


def operand_kind(workload: AnyWorkload) -> str:
    """Which generated loop a workload runs: the plain GEMM loop (GEMM and batched GEMM) or a
    convolution's implicit-GEMM loop."""
    if isinstance(workload, Conv3d):
        return "conv3d"
    if isinstance(workload, Conv2d):
        return "conv2d"
    return "gemm"


@dataclass(frozen=True)
class StepInstructions:
    """Warp instructions of one K step of one warp, by class (arrays over a space)."""

    mma: np.ndarray
    ldmatrix: np.ndarray
    a_copies: np.ndarray
    b_copies: np.ndarray
    copy_parts: np.ndarray
    integer: np.ndarray
    # The fragments' copy between register buffers (BK 16 with two register stages; 0 else).
    fragment_copies: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return (
            self.mma
            + self.ldmatrix
            + self.a_copies
            + self.b_copies
            + self.integer
            + self.fragment_copies
        )


def step_instructions(space: Space) -> StepInstructions:
    """The warp instructions of one K step of one warp, for every schedule of the space.

    mma.sync m16n8k16: each 16x16 tile of the warp tile is two n8 MMAs per k16 slice;
    ldmatrix.x4: one 16x16 fragment of A or B per tile row or column per k16 slice;
    cp.async: the block's A and B tiles in 16-byte copies spread over its threads."""
    rows = space.knobs["warp_row_tiles"].astype(np.float64)
    cols = space.knobs["warp_col_tiles"].astype(np.float64)
    slices = space.block_k.astype(np.float64) / MMA_TILE
    threads = 32.0 * space.warps.astype(np.float64)
    tile_k = space.block_k.astype(np.float64)
    a_copies = np.ceil(space.block_m * tile_k / VECTOR_ELEMS / threads)
    b_copies = np.ceil(space.block_n * tile_k / VECTOR_ELEMS / threads)
    mma = rows * 2.0 * cols * slices
    ldmatrix = (rows + cols) * slices
    # The next tile's copies are spread over all k16 slices of a step but its last
    # (workers/codegen/cuda_text.py, LOAD_PARTS), one part per slice.
    copy_parts = np.maximum(slices - 1.0, 1.0)
    work = INTEGER_WORK[operand_kind(space.workload)]
    integer = (
        work.per_a_copy * a_copies
        + work.per_b_copy * b_copies
        + work.per_ldmatrix * ldmatrix
        + work.per_copy_part * copy_parts
        + work.per_step
    )
    copied = (slices == 1.0) & (space.knobs["reg_stages"] == 2)
    fragment_copies = np.where(copied, FRAGMENT_COPY_PER_TILE * (rows + cols), 0.0)
    return StepInstructions(mma, ldmatrix, a_copies, b_copies, copy_parts, integer, fragment_copies)
