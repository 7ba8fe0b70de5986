"""The CUDA C++ text of the memory-intensive family, in pieces that generator.py assembles.

Header-free, as the GEMM family's (the NVRTC wheel ships no cuda_fp16.h): fp16 (or bf16) is
storage only, converted in PTX (bf16's widening is a shift). ``CONVERSIONS`` fills the element
type's few words and conversions (``ElementConversions``). Layout of a generated file:

1. ``PREAMBLE``: the PT_HD macro (host-and-device inline, so a host compiler builds the
   helpers too: tests/test_memops_emulated.py runs them with the device part emulated);
2. ``DEVICE``: what only a GPU has, behind small functions in ``namespace pt``: fp16
   (bf16) conversions, vector loads and stores, shared memory, warp shuffles, barriers, fences,
   atomics. The emulator supplies the same functions;
3. ``HELPERS``: constants of the schedule, the statistics of each op and how two partial
   statistics combine (symmetric, so every lane of a butterfly agrees), the element math;
4. ``KERNEL``: the entry (or entries: a two-pass split adds a second one, ``<name>_out``).

Placeholders are ``@NAME@``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetune.workers.codegen.cuda_text import ELEMENTS, ElementText


@dataclass(frozen=True)
class ElementConversions:
    """How an element type is written in a memory-intensive kernel: the tensor-core family's
    words for it (``ElementText``: the storage struct and its header guard, the packed cvt
    type) and h2f's body. Only these differ between the float16 and bfloat16 kernels: the
    loads, stores and caches move 16-bit words without reading them, and every value in
    between is float32 (nothing but the outputs is rounded to 16 bits)."""

    words: ElementText
    h2f: str  # h2f's body: 16 bits (the low half of the argument) to f32, exactly

    def fill(self, text: str) -> str:
        # cvt.rn's destination for one value is the packed type's element: f16x2 -> f16.
        one = self.words.cvt.removesuffix("x2")
        return self.words.fill(text.replace("@H2F@", self.h2f).replace("@CVT_ONE@", one))


# Per workload dtype (model/workloads.py DTYPES). The conversions need sm_80, as the family's
# kernels do: cvt.rn.bf16.f32 and cvt.rn.bf16x2.f32 are sm_80's, but cvt.f32.bf16 is sm_90's,
# so bf16 widens by a shift instead (a bf16 is a float32's top half: exact either way).
CONVERSIONS: dict[str, ElementConversions] = {
    "float16": ElementConversions(
        ELEMENTS["float16"],
        r"""  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
  return f;""",
    ),
    "bfloat16": ElementConversions(
        ELEMENTS["bfloat16"], "  return __uint_as_float((unsigned)h << 16);"
    ),
}

PREAMBLE = r"""
#if defined(__CUDACC__)
#define PT_HD __host__ __device__ __forceinline__
#define PT_DEV __device__ __forceinline__
#else
#define PT_HD inline
#define PT_DEV inline
#endif
"""

DEVICE = r"""
#if defined(__CUDACC__)
#if !defined(@ELEM_GUARD@)
struct __align__(2) @ELEM@ {
  unsigned short bits;
};
#endif
namespace pt {

__device__ __forceinline__ float h2f(unsigned short h) {
@H2F@
}
__device__ __forceinline__ unsigned short f2h(float f) {
  unsigned short h;
  asm("cvt.rn.@CVT_ONE@.f32 %0, %1;\n" : "=h"(h) : "f"(f));
  return h;
}
// Two f32 -> one @CVT@ word, round to nearest even; lo goes to the lower address.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned out;
  asm("cvt.rn.@CVT@.f32 %0, %1, %2;\n" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

// V float16 values as W = max(1, V/2) 32-bit words (V = 1: the low half of one word), so
// a register-cached vector costs W registers. One load or store instruction per vector.
template <int V>
__device__ __forceinline__ void load_vec(const unsigned short* p, unsigned (&w)[(V + 1) / 2]) {
  if constexpr (V == 1) {
    w[0] = *p;
  } else if constexpr (V == 2) {
    w[0] = *reinterpret_cast<const unsigned*>(p);
  } else if constexpr (V == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x; w[1] = v.y;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  }
}
template <int V>
__device__ __forceinline__ void store_vec(unsigned short* p, const unsigned (&w)[(V + 1) / 2]) {
  if constexpr (V == 1) {
    *p = static_cast<unsigned short>(w[0]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<unsigned*>(p) = w[0];
  } else if constexpr (V == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}
// The block's shared memory (all of it dynamic: reduction scratch, then the row cache).
__device__ __forceinline__ unsigned char* smem_base() {
  extern __shared__ __align__(16) unsigned char pt_smem[];
  return pt_smem;
}
__device__ __forceinline__ float shfl_xor(float v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
__device__ __forceinline__ int shfl_first(int v) {
  return __shfl_sync(0xffffffffu, v, 0);
}
__device__ __forceinline__ void block_sync() { __syncthreads(); }
__device__ __forceinline__ void fence() { __threadfence(); }
__device__ __forceinline__ int atomic_add(int* p, int v) { return atomicAdd(p, v); }
__device__ __forceinline__ int load_volatile(const int* p) {
  return *const_cast<const volatile int*>(p);
}
__device__ __forceinline__ void store_volatile(int* p, int v) {
  *const_cast<volatile int*>(p) = v;
}
// Partials other blocks wrote: read from L2 (.cg), never from a stale L1 line.
__device__ __forceinline__ float load_partial(const float* p) { return __ldcg(p); }
__device__ __forceinline__ void store_partial(float* p, float v) { __stcg(p, v); }
__device__ __forceinline__ void spin_pause() { __nanosleep(64); }
// An optimisation barrier: no memory access moves across it.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }
// The compiler must assume the words changed, so values it derived from them earlier (the
// statistics pass's conversions of a register-cached row) are not reused: without it a
// register cache of n words keeps 2n floats alive instead (measured: 187 registers, not 111).
template <int W>
__device__ __forceinline__ void opaque(unsigned (&w)[W]) {
  for (int i = 0; i < W; ++i) asm volatile("" : "+r"(w[i]));
}
// The dynamic shared memory the block was launched with, in bytes (PTX's %dynamic_smem_size).
__device__ __forceinline__ int dynamic_smem_bytes() {
  unsigned n;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
  return static_cast<int>(n);
}
// Ends the launch with an error (cudaErrorIllegalInstruction at the next synchronisation).
__device__ __forceinline__ void trap() { __trap(); }
__device__ __forceinline__ int thread_index() { return static_cast<int>(threadIdx.x); }
__device__ __forceinline__ int block_index() { return static_cast<int>(blockIdx.x); }
__device__ __forceinline__ int grid_size() { return static_cast<int>(gridDim.x); }

}  // namespace pt
#endif
"""

HELPERS = r"""
namespace pt {

// ---- schedule constants ----------------------------------------------------------------
// Each op's kernel uses some of them: [[maybe_unused]] keeps a warning-free build quiet.
// OP: 0 reduce-sum, 1 reduce-max, 2 softmax, 3 layernorm, 4 bias_gelu, 5 rmsnorm, 6 silu_mul
[[maybe_unused]] constexpr int OP = @OP@;
[[maybe_unused]] constexpr bool GELU_TANH = @GELU_TANH@;
// softmax with a causal mask (its own kernel: the cut vector's code costs registers)
[[maybe_unused]] constexpr bool CAUSAL = @CAUSAL@;
[[maybe_unused]] constexpr int TPR = @TPR@;            // threads per row
[[maybe_unused]] constexpr int RPB = @RPB@;            // rows per block (horizontal packing)
[[maybe_unused]] constexpr int SPLIT = @SPLIT@;        // blocks per row (task splitting)
[[maybe_unused]] constexpr int VEC = @VEC@;            // float16 per load and store
[[maybe_unused]] constexpr int WORDS = (VEC + 1) / 2;  // 32-bit words per vector
// CACHE: where the row waits for the output pass: 0 global (re-read), 1 smem, 2 registers
[[maybe_unused]] constexpr int CACHE = @CACHE@;
// split rows joined inside this kernel (else a second kernel)
[[maybe_unused]] constexpr bool FUSED = @FUSED@;
// register cache: vectors per thread (1 when unused)
[[maybe_unused]] constexpr int REG_VECS = @REG_VECS@;
// loads a thread issues before using them (streaming passes)
[[maybe_unused]] constexpr int BATCH = @BATCH@;
[[maybe_unused]] constexpr int THREADS = TPR * RPB;
[[maybe_unused]] constexpr int WARPS = (THREADS + 31) / 32;
// lanes of one row inside a warp (shuffle width)
[[maybe_unused]] constexpr int GROUP = TPR < 32 ? TPR : 32;
[[maybe_unused]] constexpr int WPR = TPR > 32 ? TPR / 32 : 1;  // warps per row
// whether the op reduces each row, and writes it in a second pass (the workload's own
// has_reduction and has_output_pass)
[[maybe_unused]] constexpr bool REDUCES = @REDUCES@;
[[maybe_unused]] constexpr bool OUTPUT_PASS = @OUTPUT_PASS@;
// x's row is X_ROW times the output's (silu_mul: gate and up side by side)
[[maybe_unused]] constexpr int X_ROW = @X_ROW@;
[[maybe_unused]] constexpr bool SPLITS = SPLIT > 1 && REDUCES;
// floats a statistic uses
[[maybe_unused]] constexpr int STATS = OP == 3 ? 3 : (OP == 2 || OP == 5 ? 2 : 1);
// floats per partial in the workspace
[[maybe_unused]] constexpr int PARTIAL_FLOATS = 3;
// Shared memory, bytes: [one 16-byte slot per warp when a row spans warps]
// [one broadcast slot when rows are split][the row cache: RPB x segment x VEC halves].
[[maybe_unused]] constexpr int SLOT = 16;
[[maybe_unused]] constexpr int BCAST_OFFSET = (TPR > 32 ? WARPS : 0) * SLOT;
[[maybe_unused]] constexpr int CACHE_OFFSET = BCAST_OFFSET + (SPLITS ? SLOT : 0);
[[maybe_unused]] constexpr float LOWEST = -3.0e38f;  // the max of nothing (finite: no inf - inf)
// A masked key's value: -inf, without a header (NVRTC has no __builtin_huge_valf; a host
// compiler, the emulator's or nvcc's host pass, has no __int_as_float).
PT_HD float neg_inf() {
#if defined(__CUDA_ARCH__)
  return __int_as_float(static_cast<int>(0xff800000u));
#else
  return -__builtin_huge_valf();
#endif
}
static_assert(TPR <= 32 || TPR % 32 == 0, "a row spans whole warps or lies in one");
static_assert(SPLIT == 1 || RPB == 1, "a split row is the block's only row");

// ---- statistics: per op, what a pass accumulates, and how two partials combine -------------
// reduce-sum: a = sum. reduce-max: a = max. softmax: a = max, b = sum of exp(x - a) (online).
// layernorm: a = count, b = mean, c = M2 (Welford per vector, Chan's pairwise combine).
// rmsnorm: a = sum of squares, b = count (a split row's segments differ in length).
struct Stats {
  float a, b, c;
};

PT_HD Stats stats_empty() {
  if constexpr (OP == 1 || OP == 2) return Stats{LOWEST, 0.f, 0.f};
  return Stats{0.f, 0.f, 0.f};
}

// A max that keeps a NaN, as torch.amax and numpy's max do: fmaxf returns the other
// operand, so a row holding a NaN reduced to its largest number. Symmetric, as fmaxf is.
PT_HD float max_keep_nan(float x, float y) { return x != x ? x : (y != y ? y : fmaxf(x, y)); }

// Symmetric in x and y (the same result whichever lane holds which), so every lane of a
// shuffle butterfly ends with the same bits.
PT_HD Stats combine(const Stats& x, const Stats& y) {
  if constexpr (OP == 0) {
    return Stats{x.a + y.a, 0.f, 0.f};
  } else if constexpr (OP == 1) {
    return Stats{max_keep_nan(x.a, y.a), 0.f, 0.f};
  } else if constexpr (OP == 2) {
    const float m = fmaxf(x.a, y.a);
    return Stats{m, x.b * expf(x.a - m) + y.b * expf(y.a - m), 0.f};
  } else if constexpr (OP == 5) {
    return Stats{x.a + y.a, x.b + y.b, 0.f};
  } else {
    const float n = x.a + y.a;
    if (n == 0.f) return Stats{0.f, 0.f, 0.f};
    const float d = y.b - x.b;
    return Stats{n, (x.a * x.b + y.a * y.b) / n, x.c + y.c + d * d * (x.a * y.a / n)};
  }
}

// unpack and pack are PT_DEV, not PT_HD: they call the fp16 conversions (h2f, f2h, pack2:
// PTX, __device__ only), and nvcc's host pass (a whole-program `nvcc -c`, not NVRTC or
// -cubin) refuses a __host__ __device__ function calling a __device__ one. Only the kernel
// calls them, so the device code is the same; a host compiler (the emulator) gets them
// inline as before.
PT_DEV void unpack(const unsigned (&w)[WORDS], float (&f)[VEC]) {
  for (int e = 0; e < VEC; ++e) {
    f[e] = h2f(static_cast<unsigned short>(w[e / 2] >> (16 * (e & 1))));
  }
}
PT_DEV void pack(const float (&f)[VEC], unsigned (&w)[WORDS]) {
  if constexpr (VEC == 1) {
    w[0] = f2h(f[0]);
  } else {
    for (int i = 0; i < WORDS; ++i) w[i] = pack2(f[2 * i], f[2 * i + 1]);
  }
}

// One vector into a running statistic.
PT_HD void accumulate(Stats& s, const float (&f)[VEC]) {
  if constexpr (OP == 0) {
    float t = 0.f;
    for (int e = 0; e < VEC; ++e) t += f[e];
    s.a += t;
  } else if constexpr (OP == 1) {
    for (int e = 0; e < VEC; ++e) s.a = max_keep_nan(s.a, f[e]);
  } else if constexpr (OP == 2) {
    float m = s.a;
    for (int e = 0; e < VEC; ++e) m = fmaxf(m, f[e]);
    float t = s.b * expf(s.a - m);
    for (int e = 0; e < VEC; ++e) t += expf(f[e] - m);
    s.a = m;
    s.b = t;
  } else if constexpr (OP == 3) {
    float sum = 0.f;
    for (int e = 0; e < VEC; ++e) sum += f[e];
    const float mean = sum / VEC;
    float m2 = 0.f;
    for (int e = 0; e < VEC; ++e) m2 += (f[e] - mean) * (f[e] - mean);
    s = combine(s, Stats{static_cast<float>(VEC), mean, m2});
  } else if constexpr (OP == 5) {
    float t = 0.f;
    for (int e = 0; e < VEC; ++e) t += f[e] * f[e];
    s.a += t;
    s.b += static_cast<float>(VEC);
  }
}

// Softmax's input (a no-op for the other ops): z = scale·x.
PT_HD void scale_input(float (&f)[VEC], float scale) {
  if constexpr (OP == 2) {
    for (int e = 0; e < VEC; ++e) f[e] *= scale;
  }
}
// The vector at column `col` that the causal mask cuts (its keys after `limit`, the row's last
// visible key, hidden): z = scale·x, a hidden key -inf, which exp makes 0 in the row's sum and
// output and the max never takes (the running max starts at the finite LOWEST: no -inf -
// -inf). Only that one vector a row compares columns: a compare per element in the passes'
// unrolled loops cost 40 registers (ptxas, sm_80: 114 where the plain softmax has 72).
PT_HD void mask_input(float (&f)[VEC], int col, int limit, float scale) {
  for (int e = 0; e < VEC; ++e) f[e] = col + e <= limit ? f[e] * scale : neg_inf();
}
PT_HD int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The final value of a reduce.
PT_HD float reduce_result(const Stats& s) { return s.a; }

PT_HD float silu(float z) { return z / (1.f + expf(-z)); }

PT_HD float gelu(float z) {
  if constexpr (GELU_TANH) {
    return @GELU_TANH_EXPR@;
  } else {
    return @GELU_ERF_EXPR@;
  }
}

// Output pass parameters from the row's statistic: softmax (max, 1/sum), layernorm
// (mean, 1/sqrt(var + eps)), rmsnorm (-, 1/sqrt(mean square + eps)).
struct Finish {
  float u, v;
};
PT_HD Finish finish(const Stats& s, float eps) {
  if constexpr (OP == 2) {
    return Finish{s.a, 1.f / s.b};
  } else if constexpr (OP == 3) {
    return Finish{s.b, 1.f / sqrtf(s.c / s.a + eps)};
  } else if constexpr (OP == 5) {
    return Finish{0.f, 1.f / sqrtf(s.a / s.b + eps)};
  }
  return Finish{0.f, 0.f};
}

// Shared-memory element offset (in halves) of vector j of a row's segment in the cache.
PT_HD int cache_index(int row_in_block, int seg, int j) { return (row_in_block * seg + j) * VEC; }

}  // namespace pt
"""

KERNEL_COMMON = r"""
namespace pt {

PT_DEV Stats shfl_stats(Stats s, int mask) {
  s.a = shfl_xor(s.a, mask, GROUP);
  if constexpr (STATS > 1) s.b = shfl_xor(s.b, mask, GROUP);
  if constexpr (STATS > 2) s.c = shfl_xor(s.c, mask, GROUP);
  return s;
}

PT_DEV void slot_store(unsigned char* sm, int offset, const Stats& s) {
  smem_store_f32(sm, offset, s.a);
  smem_store_f32(sm, offset + 4, s.b);
  smem_store_f32(sm, offset + 8, s.c);
}
PT_DEV Stats slot_load(const unsigned char* sm, int offset) {
  return Stats{smem_load_f32(sm, offset), smem_load_f32(sm, offset + 4),
               smem_load_f32(sm, offset + 8)};
}

// The statistic of the whole row (segment) in every thread of its row group: a shuffle
// butterfly inside the warp, then the warps' partials through shared memory.
PT_DEV Stats row_reduce(Stats s, unsigned char* sm, int tid) {
  for (int m = GROUP / 2; m > 0; m >>= 1) s = combine(s, shfl_stats(s, m));
  if constexpr (TPR > 32) {
    if ((tid & 31) == 0) slot_store(sm, (tid >> 5) * SLOT, s);
    block_sync();
    const int first = (tid / TPR) * WPR;
    Stats t = slot_load(sm, first * SLOT);
    for (int w = 1; w < WPR; ++w) t = combine(t, slot_load(sm, (first + w) * SLOT));
    block_sync();  // the slots are free for the next work item
    s = t;
  }
  return s;
}

PT_DEV void partial_store(float* ws, int row, int part, const Stats& s) {
  float* p = ws + (row * SPLIT + part) * PARTIAL_FLOATS;
  store_partial(p, s.a); store_partial(p + 1, s.b); store_partial(p + 2, s.c);
}
PT_DEV Stats partial_load(const float* ws, int row, int part) {
  const float* p = ws + (row * SPLIT + part) * PARTIAL_FLOATS;
  return Stats{load_partial(p), load_partial(p + 1), load_partial(p + 2)};
}

// The first warp combines the row's SPLIT partials (lane l takes l, l + 32, ... then a
// butterfly over 32 lanes, the same order in every block of the row). Warp 0 only.
PT_DEV Stats combine_partials(const float* ws, int row, int lane) {
  Stats s = stats_empty();
#pragma unroll 1
  for (int p = lane; p < SPLIT; p += 32) s = combine(s, partial_load(ws, row, p));
  for (int m = 16; m > 0; m >>= 1) {
    Stats o;
    o.a = shfl_xor32(s.a, m);
    o.b = STATS > 1 ? shfl_xor32(s.b, m) : 0.f;
    o.c = STATS > 2 ? shfl_xor32(s.c, m) : 0.f;
    s = combine(s, o);
  }
  return s;
}

// Whether a row of `cols` columns fits the kernel: whole vectors, and a row cache that holds
// its segment (`seg` vectors): REG_VECS vectors a thread in registers (fixed when the source
// was generated), or the dynamic shared memory of the launch. Only the cols of the launch
// plan and shorter rows of as many vectors a thread are sure to; a longer row would be left
// partly unread and unwritten without a word.
PT_DEV bool row_fits(int cols, int seg) {
  return cols % VEC == 0 && cols >= 0 &&
         (CACHE != 2 || (seg + TPR - 1) / TPR <= REG_VECS) &&
         (CACHE != 1 || CACHE_OFFSET + RPB * seg * VEC * 2 <= dynamic_smem_bytes());
}

}  // namespace pt
"""

KERNEL_HEAD = r"""
// __launch_bounds__(threads, 1): with no minimum of resident blocks ptxas trades spilled
// registers for occupancy on its own; with 1 it uses what the code needs (the space's
// register estimate in model/memops/space.py is fitted to it), and a spill is a bug.
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ x_ptr, const @ELEM@* __restrict__ p0_ptr,
       const @ELEM@* __restrict__ p1_ptr, @ELEM@* __restrict__ y_ptr, float* __restrict__ ws,
       int rows, int cols, float eps, float scale, int queries) {
  using namespace pt;
  const unsigned short* x = reinterpret_cast<const unsigned short*>(x_ptr);
  [[maybe_unused]] const unsigned short* p0 = reinterpret_cast<const unsigned short*>(p0_ptr);
  [[maybe_unused]] const unsigned short* p1 = reinterpret_cast<const unsigned short*>(p1_ptr);
  [[maybe_unused]] unsigned short* y = reinterpret_cast<unsigned short*>(y_ptr);
  [[maybe_unused]] unsigned char* sm = smem_base();
  const int tid = thread_index();
  const int lane = tid % TPR;          // thread of its row
  const int rib = tid / TPR;           // row in block
  const int nvec = cols / VEC;         // vectors per row
  const int seg = (nvec + SPLIT - 1) / SPLIT;  // vectors per segment
  // A launch with a row this kernel cannot hold fails (an error at the next
  // synchronisation) instead of writing part of each row: see row_fits.
  if (!row_fits(cols, seg)) trap();
  // A mask's query length for the masked kernel only (a plain one would ignore it, and the
  // masked one divide by 0), and never longer than the row (a query would see no key).
  if (OP == 2 && (CAUSAL ? queries < 1 || queries > cols : queries != 0)) trap();
  const int groups = (rows + RPB - 1) / RPB;
  const int items = groups * SPLIT;
  // Split rows: a partial per (row, segment), then the rows' arrival and departure counters.
  [[maybe_unused]] int* arrive =
      SPLITS ? reinterpret_cast<int*>(ws + rows * SPLIT * PARTIAL_FLOATS) : nullptr;
  [[maybe_unused]] int* depart = SPLITS ? arrive + rows : nullptr;
  (void)ws; (void)eps; (void)scale;
  // Every thread runs the same item loop (uniform trip count), so the barriers and
  // shuffles below are always reached by the whole block.
  for (int item = block_index(); item < items; item += grid_size()) {
    const int group = item / SPLIT, part = item % SPLIT;
    const int row = group * RPB + rib;
    const bool row_ok = row < rows;
    const int v0 = part * seg;
    const int v1 = row_ok ? (v0 + seg < nvec ? v0 + seg : nvec) : v0;  // empty past the end
    [[maybe_unused]] const int base = row_ok ? row * cols : 0;  // < 2^31 by workload validation
    const unsigned short* xr = x + (row_ok ? row * (X_ROW * cols) : 0);  // likewise
    // Softmax's last visible key: query row % queries of its attention matrix sees the keys
    // up to its own position counted from the last key (queries 0: no mask, every key).
    [[maybe_unused]] const int limit = CAUSAL ? row % queries + (cols - queries) : cols - 1;
    // The segment's vectors [v0, vfull) are wholly visible, vector vfull partly when
    // vfull < vvis, and [vvis, v1) hidden: the passes read [v0, vfull), one lane the cut vector,
    // and the hidden keys are written 0 without being read. Without a mask all is visible.
    [[maybe_unused]] const int vfull = CAUSAL ? clamp_int((limit + 1) / VEC, v0, v1) : v1;
    [[maybe_unused]] const int vvis = CAUSAL ? clamp_int((limit + VEC) / VEC, v0, v1) : v1;
"""

# bias_gelu: one streaming pass, no reduction.
BODY_ELEMENTWISE = r"""
    for (int v = v0 + lane; v < v1; v += TPR * BATCH) {
      unsigned xw[BATCH][WORDS], bw[BATCH][WORDS];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < v1) {
          load_vec<VEC>(xr + u * VEC, xw[j]);
          load_vec<VEC>(p0 + u * VEC, bw[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < v1) {
          float fx[VEC], fb[VEC];
          unpack(xw[j], fx);
          unpack(bw[j], fb);
          for (int e = 0; e < VEC; ++e) fx[e] = gelu(fx[e] + fb[e]);
          unsigned out[WORDS];
          pack(fx, out);
          store_vec<VEC>(y + base + u * VEC, out);
        }
      }
    }
  }
}
"""

# silu_mul: one streaming pass, no reduction; gate and up are the two halves of x's row.
BODY_GATED = r"""
    for (int v = v0 + lane; v < v1; v += TPR * BATCH) {
      unsigned gw[BATCH][WORDS], uw[BATCH][WORDS];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < v1) {
          load_vec<VEC>(xr + u * VEC, gw[j]);
          load_vec<VEC>(xr + cols + u * VEC, uw[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < v1) {
          float fg[VEC], fu[VEC];
          unpack(gw[j], fg);
          unpack(uw[j], fu);
          for (int e = 0; e < VEC; ++e) fg[e] = silu(fg[e]) * fu[e];
          unsigned out[WORDS];
          pack(fg, out);
          store_vec<VEC>(y + base + u * VEC, out);
        }
      }
    }
  }
}
"""

# The statistics pass: register cache (all of a thread's loads at once) or streaming.
PASS_STATS_REGISTERS = r"""
    Stats st = stats_empty();
    unsigned rc[REG_VECS][WORDS];
#pragma unroll
    for (int j = 0; j < REG_VECS; ++j) {
      const int u = v0 + lane + j * TPR;
      if (u < vfull) load_vec<VEC>(xr + u * VEC, rc[j]);
    }
#pragma unroll
    for (int j = 0; j < REG_VECS; ++j) {
      const int u = v0 + lane + j * TPR;
      if (u < vfull) {
        float f[VEC];
        unpack(rc[j], f);
        scale_input(f, scale);
        accumulate(st, f);
      }
    }
"""

PASS_STATS_STREAMING = r"""
    Stats st = stats_empty();
    for (int v = v0 + lane; v < vfull; v += TPR * BATCH) {
      unsigned xw[BATCH][WORDS];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < vfull) load_vec<VEC>(xr + u * VEC, xw[j]);
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < vfull) {
          float f[VEC];
          unpack(xw[j], f);
          scale_input(f, scale);
          accumulate(st, f);
@SMEM_STORE@
        }
      }
    }
"""

SMEM_STORE = (
    "          smem_store_vec<VEC>(sm, CACHE_OFFSET + 2 * cache_index(rib, seg, u - v0), xw[j]);"
)

# Reduce: write one value per row, or join the row's blocks.
REDUCE_TAIL = r"""
    st = row_reduce(st, sm, tid);
    if constexpr (!SPLITS) {
      if (lane == 0 && row_ok) y[row] = f2h(reduce_result(st));
    } else if constexpr (FUSED) {
      // The last of the row's blocks to arrive combines the partials and writes the row.
      if (tid < 32) {
        int old = 0;
        if (tid == 0) {
          partial_store(ws, row, part, st);
          fence();
          old = atomic_add(&arrive[row], 1);
        }
        old = shfl_first(old);
        if (old == SPLIT - 1) {
          fence();
          const Stats total = combine_partials(ws, row, tid);
          if (tid == 0) {
            y[row] = f2h(reduce_result(total));
            store_volatile(&arrive[row], 0);  // the workspace is left zeroed
          }
        }
      }
    } else {
      if (tid == 0) partial_store(ws, row, part, st);
    }
  }
}
"""

# softmax / layernorm / rmsnorm: the row's statistic, joined across split blocks when fused.
NORM_JOIN = r"""
    st = row_reduce(st, sm, tid);
    if constexpr (SPLITS && !FUSED) {
      if (tid == 0) partial_store(ws, row, part, st);
      continue;  // the second kernel writes the output
    }
    if constexpr (SPLITS && FUSED) {
      // Publish the segment's partial, wait for the row's other blocks (all resident: the
      // grid is one wave), combine every partial, broadcast through shared memory.
      if (tid < 32) {
        if (tid == 0) {
          partial_store(ws, row, part, st);
          fence();
          atomic_add(&arrive[row], 1);
          while (load_volatile(&arrive[row]) < SPLIT) spin_pause();
        }
        (void)shfl_first(0);  // the warp waits for lane 0
        fence();  // every lane reads the partials after the arrivals lane 0 saw
        const Stats total = combine_partials(ws, row, tid);
        if (tid == 0) slot_store(sm, BCAST_OFFSET, total);
      }
      block_sync();
      st = slot_load(sm, BCAST_OFFSET);
      block_sync();  // the slot is free for the next work item
    }
    const Finish fin = finish(st, eps);
"""

# The output pass, from each cache level.
# In chunks of BATCH vectors, with an optimisation barrier between chunks: without it the
# compiler hoists every gamma/beta load of the unrolled loop to the top, and a layer norm
# with a large register cache holds all of them at once (measured: 167 registers instead
# of about 70).
OUT_REGISTERS = r"""
#pragma unroll
    for (int c = 0; c < REG_VECS; c += BATCH) {
@PARAM_DECL@
#pragma unroll
      for (int j = 0; j < BATCH && c + j < REG_VECS; ++j) {
        const int u = v0 + lane + (c + j) * TPR;
        if (u < vfull) {
@PARAM_LOAD@
        }
      }
#pragma unroll
      for (int j = 0; j < BATCH && c + j < REG_VECS; ++j) {
        const int u = v0 + lane + (c + j) * TPR;
        if (u < vfull) {
          float f[VEC];
          opaque(rc[c + j]);  // convert again: the first pass's floats are not kept alive
          unpack(rc[c + j], f);
@TRANSFORM@
        }
      }
      compiler_fence();
    }
"""

OUT_STREAMING = r"""
    for (int v = v0 + lane; v < vfull; v += TPR * BATCH) {
      unsigned xw[BATCH][WORDS];
@PARAM_DECL@
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < vfull) {
@RELOAD@
@PARAM_LOAD@
        }
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int u = v + j * TPR;
        if (u < vfull) {
          float f[VEC];
          unpack(xw[j], f);
@TRANSFORM@
        }
      }
    }
"""

RELOAD_GLOBAL = "          load_vec<VEC>(xr + u * VEC, xw[j]);"
RELOAD_SMEM = (
    "          smem_load_vec<VEC>(sm, CACHE_OFFSET + 2 * cache_index(rib, seg, u - v0), xw[j]);"
)
PARAM_DECL = "      unsigned gw[BATCH][WORDS], bw[BATCH][WORDS];"
PARAM_LOAD = (
    "          load_vec<VEC>(p0 + u * VEC, gw[j]);\n          load_vec<VEC>(p1 + u * VEC, bw[j]);"
)
# rmsnorm's one parameter vector, gamma.
GAMMA_DECL = "      unsigned gw[BATCH][WORDS];"
GAMMA_LOAD = "          load_vec<VEC>(p0 + u * VEC, gw[j]);"


# f holds x of vector u; writes y. (@G@ / @B@ name the gamma / beta words.)
TRANSFORM_SOFTMAX = r"""        scale_input(f, scale);
        for (int e = 0; e < VEC; ++e) f[e] = expf(f[e] - fin.u) * fin.v;
        unsigned out[WORDS];
        pack(f, out);
        store_vec<VEC>(y + base + u * VEC, out);"""

# Softmax's vector that the causal mask cuts, read from x by the lane whose turn it would be
# (wherever the row waits: a register cache could only index it dynamically, through local
# memory), into the statistic and then the output; the hidden keys' outputs are 0. The
# masked kernels' common part adds CUT_COMMON, the read both passes make.
CUT_COMMON = r"""
namespace pt {

// Vector v of a row, z = scale·x with the keys after `limit` at -inf (mask_input).
PT_DEV void load_cut(const unsigned short* xr, int v, int limit, float scale, float (&f)[VEC]) {
  unsigned w[WORDS];
  load_vec<VEC>(xr + v * VEC, w);
  unpack(w, f);
  mask_input(f, v * VEC, limit, scale);
}

}  // namespace pt
"""

CUT_STATS = r"""
    if (vfull < vvis && lane == (vfull - v0) % TPR) {
      float f[VEC];
      load_cut(xr, vfull, limit, scale, f);
      accumulate(st, f);
    }
"""

CUT_OUTPUT = r"""
    if (vfull < vvis && lane == (vfull - v0) % TPR) {
      float f[VEC];
      load_cut(xr, vfull, limit, scale, f);
      for (int e = 0; e < VEC; ++e) f[e] = expf(f[e] - fin.u) * fin.v;
      unsigned out[WORDS];
      pack(f, out);
      store_vec<VEC>(y + base + vfull * VEC, out);
    }
    for (int u = vvis + lane; u < v1; u += TPR) {
      const unsigned zero[WORDS] = {};
      store_vec<VEC>(y + base + u * VEC, zero);
    }
"""

TRANSFORM_LAYERNORM = r"""        float g[VEC], b[VEC];
@GB_LOAD@
        for (int e = 0; e < VEC; ++e) f[e] = (f[e] - fin.u) * fin.v * g[e] + b[e];
        unsigned out[WORDS];
        pack(f, out);
        store_vec<VEC>(y + base + u * VEC, out);"""

GB_FROM_BATCH = "        unpack(gw[j], g);\n        unpack(bw[j], b);"

TRANSFORM_RMSNORM = r"""        float g[VEC];
        unpack(gw[j], g);
        for (int e = 0; e < VEC; ++e) f[e] = f[e] * fin.v * g[e];
        unsigned out[WORDS];
        pack(f, out);
        store_vec<VEC>(y + base + u * VEC, out);"""

NORM_DEPART = r"""
    if constexpr (SPLITS && FUSED) {
      // The last block to leave resets the row's counters (every block has stopped
      // waiting), leaving the workspace zeroed for the next launch.
      if (tid == 0 && atomic_add(&depart[row], 1) == SPLIT - 1) {
        store_volatile(&arrive[row], 0);
        store_volatile(&depart[row], 0);
      }
    }
  }
}
"""

# Two-pass splitting, second kernel of softmax / layernorm / rmsnorm: join the partials, then the
# output pass re-reads the segment from global memory.
SECOND_NORM_HEAD = r"""
    Stats st;
    if (tid < 32) {
      const Stats total = combine_partials(ws, row, tid);
      if (tid == 0) slot_store(sm, BCAST_OFFSET, total);
    }
    block_sync();
    st = slot_load(sm, BCAST_OFFSET);
    block_sync();  // the slot is free for the next work item
    const Finish fin = finish(st, eps);
"""

SECOND_NORM_TAIL = r"""
  }
}
"""

# Two-pass splitting, second kernel of reduce: one thread per row combines its partials.
SECOND_REDUCE = r"""
// __launch_bounds__ as the first kernel: the same block size.
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ x_ptr, const @ELEM@* __restrict__ p0_ptr,
       const @ELEM@* __restrict__ p1_ptr, @ELEM@* __restrict__ y_ptr, float* __restrict__ ws,
       int rows, int cols, float eps, float scale, int queries) {
  using namespace pt;
  (void)x_ptr; (void)p0_ptr; (void)p1_ptr; (void)cols; (void)eps; (void)scale; (void)queries;
  unsigned short* y = reinterpret_cast<unsigned short*>(y_ptr);
  for (int row = block_index() * THREADS + thread_index(); row < rows;
       row += grid_size() * THREADS) {
    Stats s = stats_empty();
#pragma unroll 4
    for (int p = 0; p < SPLIT; ++p) s = combine(s, partial_load(ws, row, p));
    y[row] = f2h(reduce_result(s));
  }
}
"""

# Shared-memory vector access (CUDA): the emulator supplies its own, with range checks.
DEVICE_SMEM = r"""
#if defined(__CUDACC__)
namespace pt {
template <int V>
__device__ __forceinline__ void smem_store_vec(unsigned char* sm, int byte_offset,
                                               const unsigned (&w)[(V + 1) / 2]) {
  store_vec<V>(reinterpret_cast<unsigned short*>(sm + byte_offset), w);
}
template <int V>
__device__ __forceinline__ void smem_load_vec(const unsigned char* sm, int byte_offset,
                                              unsigned (&w)[(V + 1) / 2]) {
  load_vec<V>(reinterpret_cast<const unsigned short*>(sm + byte_offset), w);
}
__device__ __forceinline__ void smem_store_f32(unsigned char* sm, int byte_offset, float v) {
  *reinterpret_cast<float*>(sm + byte_offset) = v;
}
__device__ __forceinline__ float smem_load_f32(const unsigned char* sm, int byte_offset) {
  return *reinterpret_cast<const float*>(sm + byte_offset);
}
__device__ __forceinline__ float shfl_xor32(float v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask, 32);
}
}  // namespace pt
#endif
"""
