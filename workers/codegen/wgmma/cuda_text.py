"""The wgmma probe kernel's CUDA C++ text: the plain C++ index math (``HELPERS``, shared with
the CPU emulator), the PTX wrappers (wgmma, and the TMA loader's mbarriers and tensor copies),
the two main loops (cp.async, TMA), the epilogues and split-K's reduction kernel. Placeholders
(``@NAME@``) are filled by generator.py; the element type's few words (``@ELEM@``, the
pointers' storage type, and ``@MMA@``, wgmma's operand type, also in the comments that say what
the results are rounded to) by the mma.sync family's ``cuda_text.ELEMENTS``, as there: nothing
else differs between the float16 and bfloat16 kernels (the loaders, TMA boxes and swizzles move
2-byte elements without reading them, the accumulators are f32)."""

from __future__ import annotations

from pipetune.workers.codegen.cuda_text import fill_placeholders

HELPERS = r"""
namespace pt {

constexpr int BM = @BM@, BN = @BN@, BK = 64, STAGES = @STAGES@;
constexpr int WARPGROUPS = BM / 64, THREADS = 128 * WARPGROUPS;
constexpr int A_STAGE_BYTES = BM * BK * 2;       // BM lines of 128 bytes
constexpr int B_SLAB_BYTES = BK * 128;           // 64 columns of B: BK lines of 128 bytes
constexpr int B_STAGE_BYTES = (BN / 64) * B_SLAB_BYTES;
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;  // a multiple of 1024
constexpr int A_ITERS = BM * 8 / THREADS;        // 16-byte chunks per thread per tile
constexpr int B_ITERS = BK * (BN / 8) / THREADS;
constexpr int ACC = BN / 2;                      // f32 accumulators per thread
[[maybe_unused]] constexpr bool B_SWAPPED = @B_SWAPPED@;
// the TMA loader (else every thread's cp.async)
[[maybe_unused]] constexpr bool TMA = @TMA@;
// blocks sharing one output tile's K tiles (grid y)
[[maybe_unused]] constexpr int SPLITS = @SPLITS@;
// one block per SM walks the output tiles
[[maybe_unused]] constexpr bool PERSISTENT = @PERSISTENT@;
// stream-K: each block an equal share of all the tiles' K steps
[[maybe_unused]] constexpr bool STREAM_K = @STREAM_K@;
static_assert(TMA || (A_ITERS * THREADS == BM * 8 && B_ITERS * THREADS == BK * (BN / 8)),
              "whole chunks per thread");

// The 128-byte swizzle (CUTLASS's Swizzle<3,4,3>): the 16-byte unit (address bits 4-6) is
// XORed with the line within its 1024-byte block (bits 7-9). Stages start at multiples of
// 1024, so an offset within a stage swizzles as its full address does.
PT_HD unsigned swizzle128(unsigned offset) { return offset ^ (((offset >> 7) & 7u) << 4); }

// Where a loader chunk lands within its stage. A: row `row` (K-major, 64 halves = 8 units).
PT_HD unsigned a_chunk_offset(int row, int unit) {
  return swizzle128(static_cast<unsigned>(row * 128 + unit * 16));
}
@B_CHUNK_OFFSET@
// A wgmma shared-memory matrix descriptor: start address, leading and stride byte offsets
// (all in 16-byte units), layout type 1 = 128-byte swizzle in bits 62-63, base offset 0.
PT_HD unsigned long long smem_descriptor(unsigned addr, unsigned leading, unsigned stride) {
  return static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>((leading & 0x3FFFFu) >> 4) << 16) |
         (static_cast<unsigned long long>((stride & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
// A of warpgroup wg, k16 step ks: K-major, 8-line groups 1024 bytes apart; the leading
// offset is unused by swizzled K-major layouts (1 by convention); a k16 step is 32 bytes on.
PT_HD unsigned long long a_descriptor(unsigned stage_a, int wg, int ks) {
  return smem_descriptor(stage_a + static_cast<unsigned>(wg * 64 * 128 + ks * 32), 16u, 1024u);
}
@B_DESCRIPTOR@
// Accumulator i of thread t (0..127 within its warpgroup) of an m64nNk16 f32 result: warp
// t/32 holds rows 16(t/32)..+15; in each 8-column block j = i/4, as mma.m16n8's C fragment.
PT_HD void acc_position(int t, int i, int& row, int& col) {
  const int warp = t / 32, lane = t % 32, j = i / 4, half = (i / 2) % 2, e = i % 2;
  row = 16 * warp + lane / 4 + 8 * half;
  col = 8 * j + 2 * (lane % 4) + e;
}

// The staged epilogue's C tile: rows of BN halves 16 bytes apart more than their length, so
// that the 8 rows one warp's column pairs fall in start 4 banks apart (no conflicts).
constexpr int C_TILE_ROW_BYTES = BN * 2 + 16;
static_assert(PERSISTENT || BM * C_TILE_ROW_BYTES <= STAGES * STAGE_BYTES,
              "the C tile fits in the stages");
// The persistent kernel's C tile has shared memory of its own (the stages are taking the next
// tile's loads while it is written out): after the stages and their mbarriers, 16-byte aligned.
constexpr int C_TILE_AT = STAGES * STAGE_BYTES + (STAGES * 8 + 15) / 16 * 16;
PT_HD unsigned c_tile_offset(int row, int col) {
  return static_cast<unsigned>(row * C_TILE_ROW_BYTES + col * 2);
}
// Stream-K's flag after the C tile: whether this block is the one to sum a shared tile.
[[maybe_unused]] constexpr int FLAG_AT = C_TILE_AT + BM * C_TILE_ROW_BYTES;

// Stream-K: of `total` K steps (all tiles' laid end to end) over `blocks` blocks, block g
// takes steps share(g) .. share(g + 1) - 1 (the shares differ by one step at most), and step
// i falls in block owner(i)'s share.
PT_HD long long share(long long g, long long total, long long blocks) {
  return g * total / blocks;
}
PT_HD int owner(long long i, long long total, long long blocks) {
  return static_cast<int>(((i + 1) * blocks - 1) / total);
}
// The workspace holds two partial tiles per block, each as its threads' accumulators (float
// i of thread tid at i * THREADS + tid: a warp's stores and loads are 128 contiguous bytes):
// slot 0 for the tile its share starts in, slot 1 for the one it ends in (a share that starts
// and ends in one tile uses slot 0; the tiles between are whole and need none).
PT_HD long long partial_slot(int block, long long block_begin, long long tile_begin) {
  return (2ll * block + (block_begin >= tile_begin ? 0 : 1)) * (THREADS * ACC);
}
struct alignas(16) Chunk16 {
  unsigned words[4];
};
struct alignas(8) Float2 {
  float x, y;
};

}  // namespace pt
"""

DEVICE_HEAD = "namespace pt {\n"

DEVICE_WGMMA = r"""
// wgmma exists on sm_90a only (the arch-specific target, not sm_90): a compiler pass for it
// defines __CUDA_ARCH_FEAT_SM90_ALL (NVRTC -arch=sm_90a; nvcc compute_90a). `nvcc
// -arch=sm_90a` also runs a compute_90 pass, for the portable PTX it puts beside the sm_90a
// cubin, and ptxas rejects wgmma there: in such a pass (and for a plain sm_90 build) the
// wrappers trap instead, as CUTLASS's do, so the build succeeds and that code stops at its
// first MMA rather than computing garbage. An H100 runs the sm_90a cubin; build it with
// -gencode arch=compute_90a,code=sm_90a (the file's first lines say so).
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}
// This thread's generic-proxy shared-memory writes (its landed cp.async copies), made
// visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving an accumulator while an MMA that writes it is in flight.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
"""

# The TMA loader's wrappers: mbarriers (CUTLASS's ClusterTransactionBarrier, for one CTA) and
# the 3-D tiled bulk tensor copy.
DEVICE_TMA = r"""
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The initialised barriers, made visible to the async proxy (the TMA unit completes them).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive once and expect `bytes` more bytes of copies before the phase completes.
__device__ __forceinline__ void mbarrier_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Whether the phase of parity `parity` has completed.
__device__ __forceinline__ bool mbarrier_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// A phase that never completes (a copy that never lands, a miscounted byte total) would hang
// the kernel: give up after about a second instead and compute garbage, which the host's
// check reports. (Not __trap(): ptxas then serialises the MMAs around the loop.)
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  if (mbarrier_try_wait(bar, parity)) return;
  const long long start = clock64();
  while (!mbarrier_try_wait(bar, parity)) {
    if (clock64() - start > (1ll << 31)) break;
  }
}
// The host wrote the tensor map into global memory before the launch: order that write
// before the TMA unit reads the map (the tensormap proxy).
__device__ __forceinline__ void tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(map) : "memory");
}
// The box of `map` at (c0 innermost, c1, c2) into shared memory at `dst`; its bytes complete
// on mbarrier `bar`. Elements past the tensor's edges land as zeros.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const void* map, int c0, int c1, int c2,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
"""

DEVICE_TAIL = "}  // namespace pt\n"


def wgmma_wrapper(block_n: int, b_layout: str = "kn") -> str:
    """D(64 x BN, f32) += A(64 x 16, smem, K-major) * B(16 x BN, smem): B N-major for B stored
    K x N ("kn", transposed by the instruction: imm-trans-b 1), K-major for N x K ("nk", 0)."""
    acc = block_n // 2
    trans_b = {"kn": 1, "nk": 0}[b_layout]
    regs = ", ".join(f"%{i}" for i in range(acc))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
    return (
        f"__device__ __forceinline__ void wgmma_tile(float (&d)[{acc}], unsigned long long da,\n"
        "                                           unsigned long long db) {\n"
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a only: see wgmma_fence\n"
        "  asm volatile(\n"
        '      "{\\n.reg .pred p;\\n"\n'
        f'      "setp.ne.b32 p, %{acc + 2}, 0;\\n"\n'
        f'      "wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.@MMA@.@MMA@ "\n'
        f'      "{{{regs}}}, "\n'
        f'      "%{acc}, %{acc + 1}, p, 1, 1, 0, {trans_b};\\n}}\\n"\n'
        f"      : {outputs}\n"
        '      : "l"(da), "l"(db), "r"(1));\n'
        "#else\n"
        "  (void)d; (void)da; (void)db;\n"
        "  __trap();\n"
        "#endif\n"
        "}\n"
    )


# One K tile's MMAs from the stage of tile kt, committed as one group; after it the group
# before has retired (one tile's MMAs stay in flight). The same in either main loop.
MMA_STEP = r"""
    const unsigned sa = base + (kt % STAGES) * STAGE_BYTES, sb = sa + A_STAGE_BYTES;
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      wgmma_tile(acc, a_descriptor(sa, wg, ks), b_descriptor(sb, ks));
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
    wgmma_wait<1>();  // this warpgroup's MMAs of tile kt-1 have retired
#pragma unroll
    for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);"""

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ A_ptr, const @ELEM@* __restrict__ B_ptr,
       @ELEM@* __restrict__ C_ptr,@BIAS@ int M_arg, int N_arg, int K_arg@GELU@) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  const unsigned short* A = reinterpret_cast<const unsigned short*>(A_ptr);
  const unsigned short* B = reinterpret_cast<const unsigned short*>(B_ptr);
  unsigned short* C = reinterpret_cast<unsigned short*>(C_ptr);
  const int M = M_arg, N = N_arg, K = K_arg;@SETUP@
@BATCH@
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int tiles_n = (N + BN - 1) / BN;
  const int tile_row = static_cast<int>(blockIdx.x) / tiles_n;
  const int bm0 = tile_row * BM, bn0 = (static_cast<int>(blockIdx.x) - tile_row * tiles_n) * BN;
  const int k_tiles = (K + BK - 1) / BK;
  const unsigned base = (smem_u32(pt_smem) + 1023u) & ~1023u;

  auto load_tile = [&](int kt, int stage) {
    const unsigned sa = base + stage * STAGE_BYTES, sb = sa + A_STAGE_BYTES;
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
      const int c = tid + it * THREADS, row = c / 8, unit = c % 8;
      const int gm = bm0 + row, gk = kt * BK + unit * 8;
      const bool ok = gm < M && gk < K;
      cp_async16(sa + a_chunk_offset(row, unit), ok ? A + static_cast<long long>(gm) * K + gk : A,
                 ok);
    }
@B_COPIES@  };

  float acc[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) acc[i] = 0.f;

  // Tiles 0..STAGES-3 in flight before the loop; tile kt+STAGES-2 issued in iteration kt.
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < k_tiles) load_tile(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 3>();  // tile kt has landed (this thread's copies)
    fence_proxy_async();
    __syncthreads();  // everyone's copies of tile kt, and every MMA of tile kt-2 retired
@MMA_STEP@
    // The stage of tile kt-2: every warpgroup retired its MMAs before the barrier above.
    const int next = kt + STAGES - 2;
    if (next < k_tiles) load_tile(next, next % STAGES);
    cp_async_commit();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
  cp_async_wait<0>();
@EPILOGUE@
"""

# Each thread's column pairs from registers, where they fall inside C; @STORE@ stores the
# pair (acc[i], acc[i + 1]) of (row, col).
PAIR_STORES = r"""
#pragma unroll
  for (int i = 0; i < ACC; i += 2) {
    int row, col;
    acc_position(t, i, row, col);
    row += bm0 + wg * 64;
    col += bn0;
    if (row < M && col < N) {
@STORE@    }
  }
}
"""

# f32 -> 16-bit stores of the accumulators: the same for either loader.
EPILOGUE = (
    "\n  // f32 -> @MMA@, predicated 4-byte stores of column pairs (N is a multiple of 8).\n"
    + PAIR_STORES.lstrip("\n").replace(
        "@STORE@",
        "      *reinterpret_cast<unsigned*>(C + static_cast<long long>(row) * N + col) =\n"
        "          pack_half2(acc[i], acc[i + 1]);\n",
    )
)

PARTIAL_EPILOGUE = r"""
  // Split-K: this slice's f32 partial sums into the workspace, [slice][batch][M][N]; the
  // reduction kernel adds the slices up and rounds them to @MMA@.
  float* P = W + (static_cast<long long>(blockIdx.y) * gridDim.z + z) * M * N;
""" + PAIR_STORES.lstrip("\n").replace(
    "@STORE@",
    "      *reinterpret_cast<Float2*>(P + static_cast<long long>(row) * N + col) =\n"
    "          Float2{acc[i], acc[i + 1]};\n",
)

# Split-K's second kernel: C = 16-bit(sum over slices of W), two elements per thread, `count` =
# batch * M * N (even: N is a multiple of 8).
REDUCE_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@REDUCE_THREADS@)
@NAME@_reduce(const float* __restrict__ W, @ELEM@* __restrict__ C_ptr, int count) {
  using namespace pt;
  unsigned* C = reinterpret_cast<unsigned*>(C_ptr);
  const long long i = static_cast<long long>(blockIdx.x) * @REDUCE_THREADS@ + threadIdx.x;
  if (2 * i >= count) return;
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int s = 0; s < SPLITS; ++s) {
    const Float2 p = reinterpret_cast<const Float2*>(W + static_cast<long long>(s) * count)[i];
    lo += p.x;
    hi += p.y;
  }
  C[i] = pack_half2(lo, hi);
}
"""

# Pieces the TMA kernels share (filled in below, after the kernels' text).
# Thread 0 makes the tensor maps visible to the TMA unit and sets up one mbarrier per stage.
TMA_SETUP = r"""  if (tid == 0) {
    tensormap_acquire(tmap_a);
    tensormap_acquire(tmap_b);
    for (int s = 0; s < STAGES; ++s) mbarrier_init(bars + s * 8, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
"""
# Thread 0 only: K tile `kt` of the output tile at (z, bm0, bn0) into `stage`, its bytes
# counted on the stage's mbarrier.
TMA_ISSUE = r"""
    const unsigned sa = base + stage * STAGE_BYTES, sb = sa + A_STAGE_BYTES, bar = bars + stage * 8;
    mbarrier_expect_tx(bar, static_cast<unsigned>(STAGE_BYTES));
    tma_load_3d(sa, tmap_a, kt * BK, bm0, z, bar);
@B_BOXES@""".lstrip("\n")
# The staged epilogue's two steps: the accumulators rounded to 16 bits into the C tile in shared
# memory (`tile`), then 16-byte row chunks of it to C (N is a multiple of 8).
C_TILE_OUT = r"""#pragma unroll
  for (int i = 0; i < ACC; i += 2) {
    int row, col;
    acc_position(t, i, row, col);
    *reinterpret_cast<unsigned*>(tile + c_tile_offset(wg * 64 + row, col)) =
        pack_half2(@C_PAIR@);
  }
  __syncthreads();
  for (int c = tid; c < BM * BN / 8; c += THREADS) {
    const int row = c / (BN / 8), col = c % (BN / 8) * 8;
    if (bm0 + row < M && bn0 + col < N) {
      *reinterpret_cast<Chunk16*>(C + static_cast<long long>(bm0 + row) * N + bn0 + col) =
          *reinterpret_cast<const Chunk16*>(tile + c_tile_offset(row, col));
    }
  }
"""
# The persistent kernels' pieces: the batch index and first row and column of output tile
# `index` (the batch's tiles included); one K step of a block's loads, `kt` numbering them
# across its tiles; the MMAs of a tile all retired; the tile's C out through the C tile.
TILE_AT = r"""  auto tile_at = [&](int index, int& z, int& bm0, int& bn0) {
    z = index / tiles_mn;
    const int in_batch = index - z * tiles_mn, tile_row = in_batch / tiles_n;
    bm0 = tile_row * BM;
    bn0 = (in_batch - tile_row * tiles_n) * BN;
  };
"""
LOAD_STEP = r"""
      // Every warpgroup retired its MMAs of load kt-2; the last tile's C is out of the C
      // tile (each thread's stores came before this barrier), so it may be written again;
      // and stream-K's flag was read by every thread.
      __syncthreads();
      const int next = kt + STAGES - 2;
      if (tid == 0 && next < loads) issue_load(next, next % STAGES);
      mbarrier_wait(bars + (kt % STAGES) * 8, static_cast<unsigned>(kt / STAGES) & 1u);
@MMA_STEP@
""".lstrip("\n")
RETIRE = r"""    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
"""


def _nested(text: str) -> str:
    """``text`` indented one level more (preprocessor lines stay in column 0)."""
    return "".join(
        "  " + line if line.strip() and not line.startswith("#") else line
        for line in text.splitlines(keepends=True)
    )


# The persistent kernels' output tile `index`: its position, then the C tile out (@TILE_OUT@ is
# this and the epilogue's C tile text, nested: fill_epilogue).
TILE_OUT_HEAD = r"""    int z, bm0, bn0;
    tile_at(index, z, bm0, bn0);
    unsigned short* C =
        reinterpret_cast<unsigned short*>(C_ptr) + static_cast<long long>(z) * M * N;
"""


STAGED_EPILOGUE = r"""
  // f32 -> @MMA@ into a BM x BN tile in shared memory (the stages are free: every warpgroup's
  // MMAs retired before the barrier), then 16-byte row chunks to C (N is a multiple of 8).
  __syncthreads();
  unsigned char* tile = pt_smem + (base - smem_u32(pt_smem));
@C_TILE_OUT@}
"""

TMA_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ A_ptr, const @ELEM@* __restrict__ B_ptr,
       @ELEM@* __restrict__ C_ptr,@BIAS@ int M_arg, int N_arg, int K_arg@GELU@,
       const void* __restrict__ tmap_a, const void* __restrict__ tmap_b@WORKSPACE_PARAM@) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  unsigned short* C = reinterpret_cast<unsigned short*>(C_ptr);
  const int M = M_arg, N = N_arg, K = K_arg;@SETUP@
  // A and B are read through the tensor maps (3-D: the batch is the outermost coordinate).
  const int z = blockIdx.z;
  C += static_cast<long long>(z) * M * N;
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int tiles_n = (N + BN - 1) / BN;
  const int tile_row = static_cast<int>(blockIdx.x) / tiles_n;
  const int bm0 = tile_row * BM, bn0 = (static_cast<int>(blockIdx.x) - tile_row * tiles_n) * BN;
  // This block's K tiles kt0 .. kt0 + k_tiles - 1: slice blockIdx.y of SPLITS (one: all).
  const int k_tiles_all = (K + BK - 1) / BK, per_slice = (k_tiles_all + SPLITS - 1) / SPLITS;
  const int kt0 = static_cast<int>(blockIdx.y) * per_slice;
  const int k_tiles = max(0, min(per_slice, k_tiles_all - kt0));
  const unsigned base = (smem_u32(pt_smem) + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE_BYTES;  // one 8-byte mbarrier per stage
@LAST_SLAB@
@TMA_SETUP@
  // Thread 0 only: the block's tile kt (kt0 + kt of K) into `stage`, its bytes counted on the
  // stage's mbarrier.
  auto issue_tile = [&](int local_kt, int stage) {
    const int kt = kt0 + local_kt;
@TMA_ISSUE@  };

  float acc[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) acc[i] = 0.f;

  // Tiles 0..STAGES-3 in flight before the loop; tile kt+STAGES-2 issued in iteration kt.
  if (tid == 0) {
    for (int s = 0; s < STAGES - 2 && s < k_tiles; ++s) issue_tile(s, s);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    __syncthreads();  // every warpgroup retired its MMAs of tile kt-2 (its last wait_group)
    // The stage of tile kt-2 is free: refill it as early as it can be.
    const int next = kt + STAGES - 2;
    if (tid == 0 && next < k_tiles) issue_tile(next, next % STAGES);
    mbarrier_wait(bars + (kt % STAGES) * 8, static_cast<unsigned>(kt / STAGES) & 1u);
@MMA_STEP@
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
@EPILOGUE@
"""

# The persistent TMA kernel: a grid of one block per SM (or fewer, one per tile), block b
# computing output tiles b, b + gridDim.x, ... of all `tiles_arg` (the batch's included). Its
# loads are numbered across its tiles (`kt`: k_tiles per tile, the stage ring and the mbarrier
# phases running on), so the STAGES - 2 loads issued ahead at a tile's last K step are the next
# tile's, landing while this tile's C goes out through its own shared-memory tile.
PERSISTENT_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ A_ptr, const @ELEM@* __restrict__ B_ptr,
       @ELEM@* __restrict__ C_ptr,@BIAS@ int M_arg, int N_arg, int K_arg@GELU@, int tiles_arg,
       const void* __restrict__ tmap_a, const void* __restrict__ tmap_b) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  const int M = M_arg, N = N_arg, K = K_arg, tiles = tiles_arg;@SETUP@
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int tiles_n = (N + BN - 1) / BN, tiles_mn = ((M + BM - 1) / BM) * tiles_n;
  const int k_tiles = (K + BK - 1) / BK;
  const int first = static_cast<int>(blockIdx.x), step = static_cast<int>(gridDim.x);
  const int my_tiles = first < tiles ? (tiles - first + step - 1) / step : 0;
  const int loads = my_tiles * k_tiles;
  const unsigned base = (smem_u32(pt_smem) + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE_BYTES;  // one 8-byte mbarrier per stage
  unsigned char* tile = pt_smem + (base - smem_u32(pt_smem)) + C_TILE_AT;
@LAST_SLAB_AGAIN@
@TILE_AT@
@TMA_SETUP@
  // Thread 0 only: the block's load j (K tile j % k_tiles of its tile j / k_tiles) into
  // `stage`, its bytes counted on the stage's mbarrier.
  auto issue_load = [&](int j, int stage) {
    int z, bm0, bn0;
    tile_at(first + j / k_tiles * step, z, bm0, bn0);
    const int kt = j % k_tiles;
@TMA_ISSUE@  };

  float acc[ACC];
  if (tid == 0) {
    for (int s = 0; s < STAGES - 2 && s < loads; ++s) issue_load(s, s);
  }
  // A loop over the block's tiles around one over their K steps, the MMAs of each tile all
  // retired before its epilogue: then ptxas sees the accumulators free where they are cleared.
  // `kt` counts the block's loads across its tiles.
  int kt = 0;
  for (int local = 0; local < my_tiles; ++local) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.f;  // each tile from zero
    for (int k_step = 0; k_step < k_tiles; ++k_step, ++kt) {
@LOAD_STEP@    }
@RETIRE@    const int index = first + local * step;
@TILE_OUT@  }
}
"""

# Stream-K on the persistent kernel: block g takes K steps share(g) .. share(g + 1) - 1 of all
# tiles' steps laid end to end, so its loads are numbered by step (`kt`, the stage ring and the
# mbarrier phases running on across tiles, as in the persistent kernel). A tile whose steps
# lie wholly in one share goes out as there; one that several blocks share: each stores its
# partial sums to the workspace and counts itself in on the tile's arrival counter, and the
# last to arrive sums every share's partials in block order (the same sum whichever block
# came last) and writes C. No block waits for another: the shares need not run at once.
STREAM_K_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ A_ptr, const @ELEM@* __restrict__ B_ptr,
       @ELEM@* __restrict__ C_ptr,@BIAS@ int M_arg, int N_arg, int K_arg@GELU@, int tiles_arg,
       const void* __restrict__ tmap_a, const void* __restrict__ tmap_b,
       float* __restrict__ W, unsigned* __restrict__ arrivals) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  const int M = M_arg, N = N_arg, K = K_arg, tiles = tiles_arg;@SETUP@
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int tiles_n = (N + BN - 1) / BN, tiles_mn = ((M + BM - 1) / BM) * tiles_n;
  const int k_tiles = (K + BK - 1) / BK;
  const int block = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
  const long long total = static_cast<long long>(tiles) * k_tiles;
  const long long begin = share(block, total, blocks), end = share(block + 1, total, blocks);
  const int loads = static_cast<int>(end - begin);
  const unsigned base = (smem_u32(pt_smem) + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE_BYTES;  // one 8-byte mbarrier per stage
  unsigned char* tile = pt_smem + (base - smem_u32(pt_smem)) + C_TILE_AT;
  volatile int* sums_tile = reinterpret_cast<volatile int*>(tile + (FLAG_AT - C_TILE_AT));
@LAST_SLAB_AGAIN@
@TILE_AT@
@TMA_SETUP@
  // Thread 0 only: the block's load j (K step begin + j) into `stage`, its bytes counted on
  // the stage's mbarrier.
  auto issue_load = [&](int j, int stage) {
    const long long step = begin + j;
    int z, bm0, bn0;
    tile_at(static_cast<int>(step / k_tiles), z, bm0, bn0);
    const int kt = static_cast<int>(step % k_tiles);
@TMA_ISSUE@  };

  float acc[ACC];
  if (tid == 0) {
    for (int s = 0; s < STAGES - 2 && s < loads; ++s) issue_load(s, s);
  }
  // A loop over the tiles the share touches around one over their K steps in it (as in the
  // persistent kernel: the MMAs of each tile all retired before its epilogue).
  int kt = 0;
  for (long long step = begin; step < end;) {
    const int index = static_cast<int>(step / k_tiles);
    const long long tile_begin = static_cast<long long>(index) * k_tiles;
    const long long tile_end = tile_begin + k_tiles, stop = min(end, tile_end);
    const bool whole = step == tile_begin && stop == tile_end;
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.f;  // each tile from zero
    for (; step < stop; ++step, ++kt) {
@LOAD_STEP@    }
@RETIRE@    if (!whole) {
      // This share's partial sums of the tile into its slot; then the block counts itself in.
      float* mine = W + partial_slot(block, begin, tile_begin) + tid;
#pragma unroll
      for (int i = 0; i < ACC; ++i) mine[i * THREADS] = acc[i];
      __threadfence();  // the stores are visible GPU-wide before the count says so
      __syncthreads();
      const int first = owner(tile_begin, total, blocks), last = owner(tile_end - 1, total, blocks);
      if (tid == 0) {
        const unsigned before = atomicAdd(arrivals + index, 1u);
        *sums_tile = before == static_cast<unsigned>(last - first);
      }
      __syncthreads();
      if (!*sums_tile) continue;  // another share of the tile is still running
      __threadfence();  // the others' partials are read after their counts were seen
#pragma unroll
      for (int i = 0; i < ACC; ++i) acc[i] = 0.f;
      for (int h = first; h <= last; ++h) {  // in block order: the same sum every time
        const float* partial = W + partial_slot(h, share(h, total, blocks), tile_begin) + tid;
#pragma unroll
        for (int i = 0; i < ACC; ++i) acc[i] += __ldcg(partial + i * THREADS);
      }
      if (tid == 0) arrivals[index] = 0u;  // every share has arrived: ready for the next launch
    }
@TILE_OUT@  }
}
"""

BATCH_OFFSETS = r"""
  const int z = blockIdx.z;
  A += static_cast<long long>(z) * M * K;
  B += static_cast<long long>(z) * K * N;
  C += static_cast<long long>(z) * M * N;
"""


def _fill(text: str) -> str:
    return (
        text.replace("@TILE_AT@", TILE_AT)
        .replace("@LOAD_STEP@", LOAD_STEP)
        .replace("@RETIRE@", RETIRE)
        .replace("@TMA_SETUP@", TMA_SETUP)
        .replace("@TMA_ISSUE@", TMA_ISSUE)
    )


TMA_KERNEL = _fill(TMA_KERNEL)
PERSISTENT_KERNEL = _fill(PERSISTENT_KERNEL)
STREAM_K_KERNEL = _fill(STREAM_K_KERNEL)


# ---- B's layout -------------------------------------------------------------------------------
# The text that depends on how B is stored, by the workloads' `b_layout` (placeholders of HELPERS
# and the kernels; each text's first newline is not part of it). "kn" (B stored K x N, the
# gemm_kn and bmm variants): shared memory holds B N-major, in 64-column slabs of BK lines, each
# slab one TMA box, and wgmma transposes it (imm-trans-b 1). "nk" (B stored N x K, as a PyTorch
# Linear weight or attention's keys: gemm_nk, bmm_nk): B is K-major as A is, BN lines of 64
# halves, one TMA box per K tile, and wgmma reads it as it is (imm-trans-b 0), the layout
# CUTLASS's Hopper GEMMs prefer.
B_LAYOUT_TEXT: dict[str, dict[str, str]] = {
    "kn": {
        "B_CHUNK_OFFSET": r"""
// B: line `k` of 64-column slab unit / 8 (N-major).
PT_HD unsigned b_chunk_offset(int k, int unit) {
  return static_cast<unsigned>((unit / 8) * B_SLAB_BYTES) +
         swizzle128(static_cast<unsigned>(k * 128 + (unit % 8) * 16));
}
""",
        "B_DESCRIPTOR": r"""
// B, k16 step ks: N-major; 64-column slabs B_SLAB_BYTES apart, 8-line groups of K 1024
// bytes apart; a k16 step is 16 lines (2048 bytes) on.
PT_HD unsigned long long b_descriptor(unsigned stage_b, int ks) {
  const unsigned slabs = static_cast<unsigned>(B_SLAB_BYTES), groups = 1024u;
  return smem_descriptor(stage_b + static_cast<unsigned>(ks * 16 * 128),
                         B_SWAPPED ? groups : slabs, B_SWAPPED ? slabs : groups);
}
""",
        "B_COPIES": r"""
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      const int c = tid + it * THREADS, k = c / (BN / 8), unit = c % (BN / 8);
      const int gk = kt * BK + k, gn = bn0 + unit * 8;
      const bool ok = gk < K && gn < N;
      cp_async16(sb + b_chunk_offset(k, unit), ok ? B + static_cast<long long>(gk) * N + gn : B,
                 ok);
    }
""",
        "B_BOXES": r"""
#pragma unroll
    for (int s = 0; s < BN / 64; ++s) {
      tma_load_3d(sb + s * B_SLAB_BYTES, tmap_b, min(bn0 + 64 * s, last_slab), kt * BK, z, bar);
    }
""",
        "LAST_SLAB": r"""
  // A 64-column slab of B wholly past N copies the last slab that starts inside N instead of
  // a box wholly out of bounds: no stored C column reads it, and every stage counts the same
  // STAGE_BYTES.
  const int last_slab = (N - 1) / 64 * 64;
""",
        "LAST_SLAB_AGAIN": (
            "  const int last_slab = (N - 1) / 64 * 64;  // (as in the TMA kernel: a slab past N)\n"
        ),
    },
    "nk": {
        "B_CHUNK_OFFSET": r"""
// B: row `n` of the tile (K-major, as A: 64 halves = 8 units).
PT_HD unsigned b_chunk_offset(int n, int unit) {
  return swizzle128(static_cast<unsigned>(n * 128 + unit * 16));
}
""",
        "B_DESCRIPTOR": r"""
// B, k16 step ks: K-major, as A; 8-line groups of N 1024 bytes apart, the leading offset
// unused (1); a k16 step is 32 bytes on.
PT_HD unsigned long long b_descriptor(unsigned stage_b, int ks) {
  return smem_descriptor(stage_b + static_cast<unsigned>(ks * 32), 16u, 1024u);
}
""",
        "B_COPIES": r"""
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      const int c = tid + it * THREADS, n = c / 8, unit = c % 8;
      const int gn = bn0 + n, gk = kt * BK + unit * 8;
      const bool ok = gn < N && gk < K;
      cp_async16(sb + b_chunk_offset(n, unit), ok ? B + static_cast<long long>(gn) * K + gk : B,
                 ok);
    }
""",
        # One box of the tile's BN rows (rows past N land as zeros; the box starts inside N).
        "B_BOXES": "    tma_load_3d(sb, tmap_b, kt * BK, bn0, z, bar);\n",
        "LAST_SLAB": "",
        "LAST_SLAB_AGAIN": "",
    },
}


def fill_b_layout(text: str, b_layout: str) -> str:
    """``text`` with B's layout-dependent placeholders filled for ``b_layout`` ("kn", "nk")."""
    texts = {key: value.removeprefix("\n") for key, value in B_LAYOUT_TEXT[b_layout].items()}
    return fill_placeholders(text, texts)


# ---- the epilogue ----------------------------------------------------------------------------
# What the staged epilogue computes of each accumulator pair before it rounds it to 16 bits
# (placeholders of the kernels and C_TILE_OUT), by whether the variant applies a bias and GELU
# (variants.BIAS_GELU_VARIANTS). "plain": the pair as it is. "bias_gelu": C = gelu(A @ B +
# bias), as the mma.sync family's gemm_bias_gelu: the bias (N elements, a pointer after C)
# added to the f32 accumulators and GELU applied in the form the gelu_tanh argument picks (one
# cubin for both), so C is rounded once. The bias of a column past N reads as 0 (its column is
# never stored, and the bias has no element there).
EPILOGUE_TEXT: dict[str, dict[str, str]] = {
    "plain": {"BIAS": "", "GELU": "", "SETUP": "", "C_PAIR": "acc[i], acc[i + 1]"},
    # (C_TILE_OUT_SWIGLU has no pair of its own to fill.)
    "swiglu": {"BIAS": "", "GELU": "", "SETUP": "", "C_PAIR": ""},
    "bias_gelu": {
        "BIAS": " const @ELEM@* __restrict__ bias_ptr,",
        "GELU": ", int gelu_tanh",
        "SETUP": (
            "\n  const unsigned short* bias = reinterpret_cast<const unsigned short*>(bias_ptr);"
            "\n  const bool tanh_form = gelu_tanh != 0;"
            "\n  // Bias element `col`, widened to f32 (0 past N)."
            "\n  auto bias_at = [&](int col) { return col < N ? widen_elem(bias[col]) : 0.f; };"
        ),
        "C_PAIR": (
            "gelu(acc[i] + bias_at(bn0 + col), tanh_form),\n"
            "                   gelu(acc[i + 1] + bias_at(bn0 + col + 1), tanh_form)"
        ),
    },
}


# The fused GEMM + SwiGLU's C tile (variants gemm_swiglu_kn / _nk): the weights interleave the
# gate's and the up projection's columns in groups of 8 (model/workloads.py SWIGLU_INTERLEAVE),
# so of an m64nNk16 result's 8-column blocks, block 2g holds 8 gate columns and block 2g + 1 the
# same 8 up columns, in registers four apart of the same thread: each thread gates its own f32
# accumulators, silu(gate)·up, rounded to 16 bits once, into a C tile of BN / 2 columns; C's
# rows are N / 2 wide (N = 2n, the GEMM's: a 16-column group lies inside N or wholly past it).
C_TILE_OUT_SWIGLU = r"""#pragma unroll
  for (int i = 0; i < ACC; i += 8) {
#pragma unroll
    for (int h = 0; h < 4; h += 2) {
      int row, col;
      acc_position(t, i + h, row, col);  // the gate pair's; the up pair's is 8 columns on
      const float g0 = acc[i + h], g1 = acc[i + h + 1], u0 = acc[i + h + 4], u1 = acc[i + h + 5];
      const float y0 = g0 / (1.f + expf(-g0)) * u0, y1 = g1 / (1.f + expf(-g1)) * u1;
      *reinterpret_cast<unsigned*>(tile + c_tile_offset(wg * 64 + row, col / 16 * 8 + col % 8)) =
          pack_half2(y0, y1);
    }
  }
  __syncthreads();
  const int NC = N / 2;  // C's columns: the tile's BN / 2 from column bn0 / 2
  for (int c = tid; c < BM * BN / 16; c += THREADS) {
    const int row = c / (BN / 16), col = c % (BN / 16) * 8;
    if (bm0 + row < M && bn0 / 2 + col < NC) {
      *reinterpret_cast<Chunk16*>(C + static_cast<long long>(bm0 + row) * NC + bn0 / 2 + col) =
          *reinterpret_cast<const Chunk16*>(tile + c_tile_offset(row, col));
    }
  }
"""
# The staged epilogue's C tile text, by epilogue.
C_TILE_OUT_TEXT = {"plain": C_TILE_OUT, "bias_gelu": C_TILE_OUT, "swiglu": C_TILE_OUT_SWIGLU}


def fill_epilogue(text: str, epilogue: str) -> str:
    """``text`` with the epilogue's placeholders filled for ``epilogue`` ("plain",
    "bias_gelu", "swiglu"): its C tile text (@C_TILE_OUT@, and nested in a persistent kernel's
    @TILE_OUT@), then the texts of EPILOGUE_TEXT."""
    c_tile = C_TILE_OUT_TEXT[epilogue]
    text = text.replace("@TILE_OUT@", TILE_OUT_HEAD + _nested(c_tile))
    text = text.replace("@C_TILE_OUT@", c_tile)
    return fill_placeholders(text, EPILOGUE_TEXT[epilogue])
