"""A Hopper GEMM on warpgroup MMA (`wgmma.mma_async`), for measuring what the mma.sync family
cannot reach (issue 15): on an H100 a perfect mma.sync pipe gives 0.88 of cuBLAS's wgmma
kernel (benchmarks/RESULTS.md, "what limits the mma.sync GEMM next to cuBLAS").

This is a probe, not yet a tuned family: a few block shapes and pipeline depths that
`benchmarks/wgmma_probe.py` compiles, checks against cuBLAS and times on a lent GPU. No space,
model or tuner knows it. It computes what the `gemm_kn` and `bmm` variants compute, with
their parameters ``(A, B, C, M, N, K)`` and grid ``(tiles_m * tiles_n, 1, batch)`` (``launch``
says what the TMA loader and split-K add).

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
module (``reduce_kernel_name``) adds the slices and rounds to fp16: for products with few output
tiles and a long K, whose single block per tile leaves most SMs idle.

The index math is plain C++ (``helpers``) so that tests/test_wgmma_emulated.py runs the kernel
on the CPU with the PTX wrappers emulated from the ISA's layout definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetune.workers.codegen import cuda_text, generator
from pipetune.workers.codegen.generator import KernelSource
from pipetune.workers.codegen.variants import variant_of

BK = 64  # halves per K tile: one 128-byte swizzle line per row of A
SMEM_LIMIT = 227 * 1024  # Hopper's dynamic shared memory per block
ALIGN_SLACK = 1024  # the stages start at a 1024-byte boundary (the swizzle reads bits 7-9)
VARIANTS = ("gemm_kn", "bmm")  # B stored K x N, row-major
# How the B descriptor's two byte offsets are read for an N-major operand: "canonical" as the
# PTX ISA's canonical-layout table gives them (leading = between 64-column slabs, stride =
# between 8-row groups of K), "swapped" the other way round. The probe compiles both so that
# one GPU call settles which one the hardware follows, should the reading be wrong.
B_DESCRIPTORS = ("canonical", "swapped")
# Who copies the tiles into shared memory: every thread with cp.async, or one thread through
# the TMA unit (tensor maps, mbarriers).
LOADERS = ("cp.async", "tma")
# How the accumulators reach C: "direct", each thread's column pairs stored from registers
# (16 bytes of a row per four threads); "staged", through shared memory first, then whole
# 16-byte row chunks per thread (coalesced: what small-K products, whose time is mostly the
# store of C, need).
EPILOGUES = ("direct", "staged")
MBARRIER_BYTES = 8
MAX_SPLITS = 16
REDUCE_THREADS = 256  # per block of the split-K reduction kernel


@dataclass(frozen=True)
class WgmmaConfig:
    block_m: int  # 64 per warpgroup
    block_n: int  # a multiple of 64, at most 256 (one wgmma instruction's N)
    stages: int  # shared-memory ring depth, at least 3
    b_descriptor: str = "canonical"
    loader: str = "cp.async"
    epilogue: str = "direct"
    # Split-K: the K tiles shared among `splits` blocks per output tile (grid y), each writing
    # f32 partial sums to a workspace that a second kernel adds up and rounds (for products
    # with few output tiles and a long K, where one block per tile leaves SMs idle).
    splits: int = 1

    def __post_init__(self) -> None:
        problems = config_problems(self)
        if problems:
            raise ValueError(problems[0])

    @property
    def warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def stage_bytes(self) -> int:
        return (self.block_m + self.block_n) * BK * 2

    @property
    def smem_bytes(self) -> int:
        barriers = self.stages * MBARRIER_BYTES if self.loader == "tma" else 0
        return self.stages * self.stage_bytes + ALIGN_SLACK + barriers

    @property
    def id(self) -> str:
        loader = "_tma" if self.loader == "tma" else ""
        staged = "_st" if self.epilogue == "staged" else ""
        split = f"_k{self.splits}" if self.splits > 1 else ""
        reading = "" if self.b_descriptor == "canonical" else "_bswap"
        return f"wg{self.block_m}x{self.block_n}s{self.stages}{loader}{staged}{split}{reading}"


def config_problems(c: WgmmaConfig) -> list[str]:
    problems = []
    if c.block_m not in (64, 128, 192, 256):
        problems.append(
            f"block_m must be 64, 128, 192 or 256 (one warpgroup per 64 rows), got {c.block_m}"
        )
    if c.block_n % 64 or not 64 <= c.block_n <= 256:
        problems.append(f"block_n must be 64, 128, 192 or 256, got {c.block_n}")
    if c.stages < 3:
        problems.append(
            f"stages must be at least 3 (one tile in use, one in the MMAs' flight), got {c.stages}"
        )
    if c.b_descriptor not in B_DESCRIPTORS:
        problems.append(f"b_descriptor must be one of {B_DESCRIPTORS}, got {c.b_descriptor!r}")
    if c.loader not in LOADERS:
        problems.append(f"loader must be one of {LOADERS}, got {c.loader!r}")
    if c.epilogue not in EPILOGUES:
        problems.append(f"epilogue must be one of {EPILOGUES}, got {c.epilogue!r}")
    if not 1 <= c.splits <= MAX_SPLITS:
        problems.append(f"splits must be 1 to {MAX_SPLITS}, got {c.splits}")
    elif c.splits > 1 and (c.loader != "tma" or c.epilogue != "direct"):
        # (The partial sums are stored as the direct epilogue stores, in f32.)
        problems.append("split-K is built for the TMA loader with the direct epilogue")
    if problems:
        return problems
    if c.loader == "cp.async" and (BK * c.block_n // 8) % c.threads:
        problems.append(f"a {BK}x{c.block_n} tile of B is not whole 16-byte copies per thread")
    if c.smem_bytes > SMEM_LIMIT:
        problems.append(f"{c.smem_bytes} B of shared memory exceeds {SMEM_LIMIT}")
    return problems


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
constexpr bool B_SWAPPED = @B_SWAPPED@;
constexpr bool TMA = @TMA@;  // the TMA loader (else every thread's cp.async)
constexpr int SPLITS = @SPLITS@;  // blocks sharing one output tile's K tiles (grid y)
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
// B: line `k` of 64-column slab unit / 8 (N-major).
PT_HD unsigned b_chunk_offset(int k, int unit) {
  return static_cast<unsigned>((unit / 8) * B_SLAB_BYTES) +
         swizzle128(static_cast<unsigned>(k * 128 + (unit % 8) * 16));
}

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
// B, k16 step ks: N-major; 64-column slabs B_SLAB_BYTES apart, 8-line groups of K 1024
// bytes apart; a k16 step is 16 lines (2048 bytes) on.
PT_HD unsigned long long b_descriptor(unsigned stage_b, int ks) {
  const unsigned slabs = static_cast<unsigned>(B_SLAB_BYTES), groups = 1024u;
  return smem_descriptor(stage_b + static_cast<unsigned>(ks * 16 * 128),
                         B_SWAPPED ? groups : slabs, B_SWAPPED ? slabs : groups);
}

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
static_assert(BM * C_TILE_ROW_BYTES <= STAGES * STAGE_BYTES, "the C tile fits in the stages");
PT_HD unsigned c_tile_offset(int row, int col) {
  return static_cast<unsigned>(row * C_TILE_ROW_BYTES + col * 2);
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
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
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


def _wgmma_wrapper(block_n: int) -> str:
    """D(64 x BN, f32) += A(64 x 16, smem, K-major) * B(16 x BN, smem, N-major)."""
    acc = block_n // 2
    regs = ", ".join(f"%{i}" for i in range(acc))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
    return (
        f"__device__ __forceinline__ void wgmma_tile(float (&d)[{acc}], unsigned long long da,\n"
        "                                           unsigned long long db) {\n"
        "  asm volatile(\n"
        '      "{\\n.reg .pred p;\\n"\n'
        f'      "setp.ne.b32 p, %{acc + 2}, 0;\\n"\n'
        f'      "wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.f16.f16 "\n'
        f'      "{{{regs}}}, "\n'
        f'      "%{acc}, %{acc + 1}, p, 1, 1, 0, 1;\\n}}\\n"\n'
        f"      : {outputs}\n"
        '      : "l"(da), "l"(db), "r"(1));\n'
        "}\n"
    )


KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const __half* __restrict__ A_ptr, const __half* __restrict__ B_ptr,
       __half* __restrict__ C_ptr, int M_arg, int N_arg, int K_arg) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  const unsigned short* A = reinterpret_cast<const unsigned short*>(A_ptr);
  const unsigned short* B = reinterpret_cast<const unsigned short*>(B_ptr);
  unsigned short* C = reinterpret_cast<unsigned short*>(C_ptr);
  const int M = M_arg, N = N_arg, K = K_arg;
@BATCH@
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int tiles_n = (N + BN - 1) / BN;
  const int tile_m = static_cast<int>(blockIdx.x) / tiles_n;
  const int bm0 = tile_m * BM, bn0 = (static_cast<int>(blockIdx.x) - tile_m * tiles_n) * BN;
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
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      const int c = tid + it * THREADS, k = c / (BN / 8), unit = c % (BN / 8);
      const int gk = kt * BK + k, gn = bn0 + unit * 8;
      const bool ok = gk < K && gn < N;
      cp_async16(sb + b_chunk_offset(k, unit), ok ? B + static_cast<long long>(gk) * N + gn : B,
                 ok);
    }
  };

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
    for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
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

# f32 -> f16 stores of the accumulators: the same for either loader.
EPILOGUE = r"""
  // f32 -> f16, predicated 4-byte stores of column pairs (N is a multiple of 8).
#pragma unroll
  for (int i = 0; i < ACC; i += 2) {
    int row, col;
    acc_position(t, i, row, col);
    row += bm0 + wg * 64;
    col += bn0;
    if (row < M && col < N) {
      *reinterpret_cast<unsigned*>(C + static_cast<long long>(row) * N + col) =
          pack_half2(acc[i], acc[i + 1]);
    }
  }
}
"""

PARTIAL_EPILOGUE = r"""
  // Split-K: this slice's f32 partial sums into the workspace, [slice][batch][M][N]; the
  // reduction kernel adds the slices up and rounds them to f16.
  float* P = W + (static_cast<long long>(blockIdx.y) * gridDim.z + z) * M * N;
#pragma unroll
  for (int i = 0; i < ACC; i += 2) {
    int row, col;
    acc_position(t, i, row, col);
    row += bm0 + wg * 64;
    col += bn0;
    if (row < M && col < N) {
      *reinterpret_cast<Float2*>(P + static_cast<long long>(row) * N + col) =
          Float2{acc[i], acc[i + 1]};
    }
  }
}
"""

# Split-K's second kernel: C = f16(sum over slices of W), two elements per thread, `count` =
# batch * M * N (even: N is a multiple of 8).
REDUCE_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@REDUCE_THREADS@)
@NAME@_reduce(const float* __restrict__ W, __half* __restrict__ C_ptr, int count) {
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

STAGED_EPILOGUE = r"""
  // f32 -> f16 into a BM x BN tile in shared memory (the stages are free: every warpgroup's
  // MMAs retired before the barrier), then 16-byte row chunks to C (N is a multiple of 8).
  __syncthreads();
  unsigned char* tile = pt_smem + (base - smem_u32(pt_smem));
#pragma unroll
  for (int i = 0; i < ACC; i += 2) {
    int row, col;
    acc_position(t, i, row, col);
    *reinterpret_cast<unsigned*>(tile + c_tile_offset(wg * 64 + row, col)) =
        pack_half2(acc[i], acc[i + 1]);
  }
  __syncthreads();
  for (int c = tid; c < BM * BN / 8; c += THREADS) {
    const int row = c / (BN / 8), col = c % (BN / 8) * 8;
    if (bm0 + row < M && bn0 + col < N) {
      *reinterpret_cast<Chunk16*>(C + static_cast<long long>(bm0 + row) * N + bn0 + col) =
          *reinterpret_cast<const Chunk16*>(tile + c_tile_offset(row, col));
    }
  }
}
"""

TMA_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const __half* __restrict__ A_ptr, const __half* __restrict__ B_ptr,
       __half* __restrict__ C_ptr, int M_arg, int N_arg, int K_arg,
       const void* __restrict__ tmap_a, const void* __restrict__ tmap_b@WORKSPACE_PARAM@) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  unsigned short* C = reinterpret_cast<unsigned short*>(C_ptr);
  const int M = M_arg, N = N_arg, K = K_arg;
  // A and B are read through the tensor maps (3-D: the batch is the outermost coordinate).
  const int z = blockIdx.z;
  C += static_cast<long long>(z) * M * N;
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  const int tiles_n = (N + BN - 1) / BN;
  const int tile_m = static_cast<int>(blockIdx.x) / tiles_n;
  const int bm0 = tile_m * BM, bn0 = (static_cast<int>(blockIdx.x) - tile_m * tiles_n) * BN;
  // This block's K tiles kt0 .. kt0 + k_tiles - 1: slice blockIdx.y of SPLITS (one: all).
  const int k_tiles_all = (K + BK - 1) / BK, per_slice = (k_tiles_all + SPLITS - 1) / SPLITS;
  const int kt0 = static_cast<int>(blockIdx.y) * per_slice;
  const int k_tiles = max(0, min(per_slice, k_tiles_all - kt0));
  const unsigned base = (smem_u32(pt_smem) + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE_BYTES;  // one 8-byte mbarrier per stage
  // A 64-column slab of B wholly past N copies the last slab that starts inside N instead of
  // a box wholly out of bounds: no stored C column reads it, and every stage counts the same
  // STAGE_BYTES.
  const int last_slab = (N - 1) / 64 * 64;

  if (tid == 0) {
    tensormap_acquire(tmap_a);
    tensormap_acquire(tmap_b);
    for (int s = 0; s < STAGES; ++s) mbarrier_init(bars + s * 8, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // Thread 0 only: the block's tile kt (kt0 + kt of K) into `stage`, its bytes counted on the
  // stage's mbarrier.
  auto issue_tile = [&](int local_kt, int stage) {
    const int kt = kt0 + local_kt;
    const unsigned sa = base + stage * STAGE_BYTES, sb = sa + A_STAGE_BYTES, bar = bars + stage * 8;
    mbarrier_expect_tx(bar, static_cast<unsigned>(STAGE_BYTES));
    tma_load_3d(sa, tmap_a, kt * BK, bm0, z, bar);
#pragma unroll
    for (int s = 0; s < BN / 64; ++s) {
      tma_load_3d(sb + s * B_SLAB_BYTES, tmap_b, min(bn0 + 64 * s, last_slab), kt * BK, z, bar);
    }
  };

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
    for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < ACC; ++i) fence_operand(acc[i]);
@EPILOGUE@
"""

BATCH_OFFSETS = r"""
  const int z = blockIdx.z;
  A += static_cast<long long>(z) * M * K;
  B += static_cast<long long>(z) * K * N;
  C += static_cast<long long>(z) * M * N;
"""


def kernel_name(variant: str, config: WgmmaConfig) -> str:
    return f"pipetune_{variant}_{config.id}"


def source_parts(variant: str, config: WgmmaConfig) -> dict[str, str]:
    """The kernel's source in pieces: "helpers" (plain C++), "device" (PTX wrappers: the
    mma.sync family's cp.async and conversion ones, wgmma's, and the TMA loader's mbarrier and
    tensor-copy ones), "kernel", "end"."""
    if variant not in VARIANTS:
        raise ValueError(f"the wgmma probe computes {VARIANTS}, not {variant!r}")
    helpers = HELPERS
    for key, value in {
        "BM": config.block_m,
        "BN": config.block_n,
        "STAGES": config.stages,
        "B_SWAPPED": "true" if config.b_descriptor == "swapped" else "false",
        "TMA": "true" if config.loader == "tma" else "false",
        "SPLITS": config.splits,
    }.items():
        helpers = helpers.replace(f"@{key}@", str(value))
    tma = config.loader == "tma"
    split = config.splits > 1
    if split:
        epilogue = PARTIAL_EPILOGUE
    else:
        epilogue = STAGED_EPILOGUE if config.epilogue == "staged" else EPILOGUE
    kernel = (
        (TMA_KERNEL if tma else KERNEL)
        .replace("@EPILOGUE@", epilogue)
        .replace("@WORKSPACE_PARAM@", ",\n       float* __restrict__ W" if split else "")
        .replace("@THREADS@", str(config.threads))
        .replace("@NAME@", kernel_name(variant, config))
        .replace("@BATCH@", BATCH_OFFSETS if variant == "bmm" else "")
    )
    if split:
        kernel += REDUCE_KERNEL.replace("@NAME@", kernel_name(variant, config)).replace(
            "@REDUCE_THREADS@", str(REDUCE_THREADS)
        )
    header = (
        f"// pipetune wgmma probe kernel: variant {variant}, block {config.block_m}x"
        f"{config.block_n}x{BK}, {config.stages} stages, B descriptor {config.b_descriptor}, "
        f"{config.loader} loader\n"
        f"// {config.threads} threads, {config.smem_bytes} B dynamic shared memory\n"
    )
    return {
        "header": header,
        "helpers": cuda_text.PREAMBLE + helpers,
        # cuda_text.DEVICE opens `#if defined(__CUDACC__)` with the family's cp.async,
        # smem_u32 and pack_half2 wrappers; "end" closes it after the kernel.
        "device": cuda_text.DEVICE
        + DEVICE_HEAD
        + DEVICE_WGMMA
        + _wgmma_wrapper(config.block_n)
        + (DEVICE_TMA if tma else "")
        + DEVICE_TAIL,
        "kernel": kernel,
        "end": cuda_text.DEVICE_END,
    }


def reduce_kernel_name(variant: str, config: WgmmaConfig) -> str:
    """Split-K's second kernel, in the same module."""
    return kernel_name(variant, config) + "_reduce"


def launch(kernel: KernelSource, workload) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """(grid, scalar_args) as the mma.sync family launches (grid x: output tiles, z: batch),
    with grid y the split-K slices. The TMA loader's kernel also takes the two tensor maps
    after the scalars, and with split-K the f32 workspace of splits * batch * M * N after
    them; the reduction kernel then runs on (W, C, batch * M * N), REDUCE_THREADS per block."""
    (tiles, _, batch), scalars = generator.launch(kernel, workload)
    return (tiles, kernel.schedule.splits, batch), scalars  # type: ignore[attr-defined]


def generate(workload_or_variant, config: WgmmaConfig) -> KernelSource:
    """The kernel, described as the mma.sync family describes its own (the config stands in
    for the schedule: the launch reads its block shape), so `launch` wraps that family's."""
    w = workload_or_variant
    variant = w if isinstance(w, str) else variant_of(w)
    return KernelSource(
        variant=variant,
        schedule=config,  # type: ignore[arg-type]
        name=kernel_name(variant, config),
        code="".join(source_parts(variant, config).values()),
        threads=config.threads,
        smem_bytes=config.smem_bytes,
    )


def _shapes(table, **knobs) -> tuple[WgmmaConfig, ...]:
    return tuple(WgmmaConfig(m, n, s, **knobs) for m, n, stages in table for s in stages)


# The shapes the probe tries: one to four warpgroups, 64 to 256 columns, as deep as fits.
# (One warpgroup 256 wide holds 128 accumulators and, with cp.async, 16 copies per thread: it
# spills. The TMA loader holds no copy addresses in registers and needs no whole copies per
# thread: one warpgroup 256 wide and three warpgroups 128 wide fit too.)
_CP_ASYNC_SHAPES = (
    (128, 256, (3, 4)),
    (128, 192, (4, 5)),
    (128, 128, (3, 4, 5, 6)),
    (192, 192, (3, 4)),
    (256, 128, (3, 4)),
    (64, 128, (4, 6)),
    (128, 64, (4, 6)),  # for N = 64 (the RN50 FC layer, the S.V products)
    (64, 64, (6,)),
)
_TMA_SHAPES = (
    (128, 256, (3, 4)),
    (128, 192, (4, 5)),
    (128, 128, (4, 6)),
    (192, 192, (3, 4)),
    (256, 128, (3, 4)),
    (192, 128, (4,)),
    (64, 256, (4,)),
    (64, 128, (6,)),
    (128, 64, (6,)),
    (64, 64, (6,)),
)
# The staged epilogue on every TMA shape, and shallower narrow ones for small-K products
# (mostly the store of C).
_STAGED_SHAPES = (*_TMA_SHAPES[:7], (64, 128, (4, 6)), (128, 64, (4, 6)), (64, 64, (6,)))
# Split-K for the products with few output tiles and a long K (BERT FC2: 48 tiles of 128x128
# for 132 SMs, K = 3072; RN50 FC: 16 tiles of 64x64, K = 2048).
_SPLIT_SHAPES = (
    (128, 128, 4, (2, 3, 4)),
    (128, 256, 3, (2, 3)),
    (64, 128, 6, (2, 4)),
    (128, 64, 6, (4, 8)),
    (64, 64, 6, (4, 8)),
)
PROBE_CONFIGS: tuple[WgmmaConfig, ...] = (
    _shapes(_CP_ASYNC_SHAPES)
    + _shapes(_TMA_SHAPES, loader="tma")
    + _shapes(_STAGED_SHAPES, loader="tma", epilogue="staged")
    + tuple(
        WgmmaConfig(m, n, s, loader="tma", splits=k)
        for m, n, s, splits in _SPLIT_SHAPES
        for k in splits
    )
)


@dataclass(frozen=True)
class TensorMapSpec:
    """What cuTensorMapEncodeTiled is given for one operand of the TMA loader: fp16, 3-D,
    sizes and box innermost first, byte strides of the two outer dimensions (the 128-byte
    swizzle, no interleave, zero fill past the edges, 256-byte L2 promotion)."""

    dims: tuple[int, int, int]
    strides: tuple[int, int]
    box: tuple[int, int, int]


def tensor_map_specs(
    m: int, n: int, k: int, batch: int, config: WgmmaConfig
) -> tuple[TensorMapSpec, TensorMapSpec]:
    """The tensor maps of A (batch x M x K) and B (batch x K x N), row-major: A's box is one K
    tile of the block's rows (BM lines of 128 bytes), B's one 64-column slab of a K tile."""
    if k % 8 or n % 8:
        # The TMA unit needs every row to start on a 16-byte boundary.
        raise ValueError(f"the TMA loader needs K and N to be multiples of 8, got K={k} N={n}")
    a = TensorMapSpec((k, m, batch), (k * 2, m * k * 2), (BK, config.block_m, 1))
    b = TensorMapSpec((n, k, batch), (n * 2, k * n * 2), (64, BK, 1))
    return a, b
