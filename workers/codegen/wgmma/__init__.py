"""A Hopper GEMM on warpgroup MMA (`wgmma.mma_async`), for measuring what the mma.sync family
cannot reach (issue 15): on an H100 a perfect mma.sync pipe gives 0.88 of cuBLAS's wgmma
kernel (benchmarks/RESULTS.md, "what limits the mma.sync GEMM next to cuBLAS").

Two users: the Hopper wgmma family (model/hopper/; its generator module is ``family.py``
here), whose schedules are this kernel with the TMA loader and the staged epilogue, one block
per tile, persistent or stream-K; and `benchmarks/wgmma_probe.py`, which compiles, checks
against cuBLAS and times every kind (``PROBE_CONFIGS``, the cp.async loader, the direct
epilogue and split-K included) on a lent GPU. It computes what the `gemm_kn`, `gemm_nk`,
`bmm` and `bmm_nk` variants compute, with their parameters ``(A, B, C, M, N, K)`` and grid
``(tiles_m * tiles_n, 1, batch)`` (``launch`` says what the TMA loader and split-K add).
B stored K x N (`gemm_kn`, `bmm`) lands N-major in 64-column slabs and wgmma transposes it;
B stored N x K (`gemm_nk`, a PyTorch Linear weight; `bmm_nk`, attention's keys) lands
K-major as A does and wgmma reads it as it is (cuda_text.B_LAYOUT_TEXT holds the text that
differs).

How it works (CUTLASS's sm90 "cp.async + GMMA" mainloop, without warp specialisation):
- one warpgroup (128 threads) per 64 rows of the block tile; each issues
  ``wgmma.m64n<BN>k16`` four times per 64-deep K tile, A and B read from shared memory
  through matrix descriptors, f32 accumulators in registers;
- every thread copies 16-byte chunks with cp.async into a ring of STAGES shared-memory
  stages laid out as the descriptors' 128-byte-swizzle canonical layouts (PTX ISA, "Shared
  Memory Matrix Layout"): A K-major (a row of 64 halves is one 128-byte line), B N-major (B is
  stored K x N: 64-column slabs of BK lines each);
- one K tile's MMAs stay in flight while the next tile's are issued (``wgmma.wait_group 1``),
  so a stage is refilled two tiles after its use: the copies run STAGES - 2 tiles ahead;
- cp.async writes through the generic proxy and wgmma reads through the async one: each
  thread fences (``fence.proxy.async``) after its copies land, before the block barrier.

With ``loader="tma"`` the copies are the Tensor Memory Accelerator's instead (CUTLASS's
"TMA + GMMA" mainloop, again without warp specialisation): one thread issues, per K tile,
one ``cp.async.bulk.tensor`` box of A and one per 64-column slab of B, which the TMA unit lands
in the same swizzled layouts (the tensor maps ask for the 128-byte swizzle) and fills with
zeros past the tensor's edges; an mbarrier per stage counts the bytes, and the warpgroups
wait on its phase instead of on their own copies. The host encodes the two tensor maps
(``tensor_map_specs`` says what, benchmarks/wgmma_probe.py calls the driver) and passes their
global-memory addresses after the scalars.

With ``splits`` > 1 (split-K, TMA loader only) grid y cuts each output tile's K tiles into
slices; each block stores its f32 partial sums to a workspace, and a second kernel in the same
module (``reduce_kernel_name``) adds the slices and rounds to 16 bits: for products with few output
tiles and a long K, whose single block per tile leaves most SMs idle.

With ``persistent`` (TMA loader, staged epilogue) the grid is one block per SM (``launch``
takes the SM count) and block b computes output tiles b, b + gridDim.x, ... of all the batch's
tiles: a loop over its tiles around one over their K steps, the loads numbered across tiles,
so the STAGES - 2 loads issued ahead during a tile's last K steps are the next tile's and land
while this tile's C goes out through a C tile of its own in shared memory (cuBLAS's kernels
on Hopper are persistent: benchmarks/RESULTS.md, "wgmma probe on H100 ...").

With ``stream_k`` as well (stream-K), the blocks share out the K steps of all the output
tiles, laid end to end tile by tile, in equal parts instead of the tiles: a tile that two or
more blocks' shares touch is summed by the last of them to finish, from the others' f32
partial sums in a workspace (``stream_k_buffers``: two partial tiles per block and an arrival
counter per tile), in block order, so the result does not depend on which finished last. For
the products with fewer tiles than SMs and a long K (BERT FC2: 48 tiles on 132 SMs), where a
block per tile leaves most SMs idle and split-K pays a second kernel and a C-sized workspace
per slice.

Element types: float16 or bfloat16 operands (``generate``'s ``dtype``, a workload's own), f32
accumulation either way. Only the type words differ (the pointers' storage type, wgmma's
``.f16``/``.bf16`` operand type, the output conversion, the tensor maps' data type), filled by
the mma.sync family's ``cuda_text.ELEMENTS``; a bf16 kernel's name ends in ``_bf16``.

Modules: config.py (the knobs, the probe's shapes, the tensor maps), cuda_text.py (the CUDA
text), generator.py (a configuration's source and launch).

The index math is plain C++ (``helpers``) so that tests/test_wgmma_emulated.py runs the kernel
on the CPU with the PTX wrappers emulated from the ISA's layout definitions.
"""

from pipetune.workers.codegen.wgmma.config import (
    ALIGN_SLACK,
    B_DESCRIPTORS,
    BK,
    EPILOGUES,
    LOADERS,
    MAX_SPLITS,
    MBARRIER_BYTES,
    PROBE_CONFIGS,
    REDUCE_THREADS,
    SMEM_LIMIT,
    VARIANTS,
    WgmmaConfig,
    config_problems,
    stream_k_buffers,
    tensor_map_specs,
)
from pipetune.workers.codegen.wgmma.generator import (
    generate,
    kernel_name,
    launch,
    reduce_kernel_name,
    source_parts,
)

__all__ = [
    "ALIGN_SLACK",
    "BK",
    "B_DESCRIPTORS",
    "EPILOGUES",
    "LOADERS",
    "MAX_SPLITS",
    "MBARRIER_BYTES",
    "PROBE_CONFIGS",
    "REDUCE_THREADS",
    "SMEM_LIMIT",
    "VARIANTS",
    "WgmmaConfig",
    "config_problems",
    "generate",
    "kernel_name",
    "launch",
    "reduce_kernel_name",
    "source_parts",
    "stream_k_buffers",
    "tensor_map_specs",
]
