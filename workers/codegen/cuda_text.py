"""The CUDA C++ text of the kernel family, in pieces that generator.py assembles.

The source is header-free: the NVRTC wheel on PyPI ships no cuda_fp16.h (and CI machines
have no toolkit), and the kernel needs fp16 (or bf16) only as storage plus one f32x2 ->
f16x2 (bf16x2) conversion, done in PTX. Skipping cuda_fp16.h also halves NVRTC's front-end
time. ``ELEMENTS`` fills the element type's few words (``ElementText``).

Layout of a generated file:
1. ``HELPERS``: constants and index math in ``namespace pt``, plain C++ (PT_HD), so a host
   compiler builds them too: tests/test_codegen_emulated.py runs the helpers and the kernel
   body on the CPU with the PTX wrappers emulated; layout.py mirrors the index math.
2. ``DEVICE``: PTX wrappers (cp.async, ldmatrix, mma.sync, cvt), CUDA only.
3. the kernel: setup per variant, tile loaders, ``MAINLOOP_SETUP`` (fragment buffers and
   lambdas), the K loop from pipeline.py, ``EPILOGUE``.

Placeholders are ``@NAME@`` (C++ braces make str.format awkward).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipetune.model.workloads import DTYPE_SHORT


@dataclass(frozen=True)
class ElementText:
    """How an element type is written in the kernel text: its storage struct (and the guard
    of the CUDA header that would define it), the mma.sync operand type and the f32x2
    conversion. Only these differ between the float16 and bfloat16 kernels: the loaders move
    16-bit values without reading them, and the accumulators are f32 either way."""

    c_type: str  # the storage struct, and the kernel's pointer type
    header_guard: str
    short: str  # in comments
    mma: str  # mma.sync's A and B type
    cvt: str  # cvt.rn's packed destination type

    def fill(self, text: str) -> str:
        for key, value in (
            ("ELEM", self.c_type),
            ("ELEM_GUARD", self.header_guard),
            ("SHORT", self.short),
            ("MMA", self.mma),
            ("CVT", self.cvt),
        ):
            text = text.replace(f"@{key}@", value)
        return text


def fill_placeholders(text: str, values: Mapping[str, object]) -> str:
    """``text`` with each ``@KEY@`` replaced by ``str(values[KEY])``, for every family's text."""
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    return text


def name_suffix(dtype: str) -> str:
    """What a kernel's name adds for its element type, in every family: nothing for float16
    (the names every cubin and export had before bfloat16), "_bf16" otherwise."""
    return "" if dtype == "float16" else f"_{DTYPE_SHORT[dtype]}"


def typed_key(key: str, dtype: str) -> str:
    """A kind of kernel or build key with its element type where that is not float16
    ("gemm_kn.bfloat16"), in every family: float16's keys are those made before bfloat16."""
    return key if dtype == "float16" else f"{key}.{dtype}"


# Per workload dtype (model/workloads.py DTYPES). bf16 needs sm_80, as the family does.
ELEMENTS: dict[str, ElementText] = {
    "float16": ElementText("__half", "__CUDA_FP16_H__", "fp16", "f16", "f16x2"),
    "bfloat16": ElementText("__nv_bfloat16", "__CUDA_BF16_H__", "bf16", "bf16", "bf16x2"),
}

# GELU's two forms on an f32 z (model/workloads.py GeluForm), as placeholders' values: one
# text for every kernel that applies GELU (the memops family's bias_gelu, and this family's
# GEMM with bias + GELU in its epilogue), so the fused and the unfused pair compute alike.
GELU_FORMULAS: dict[str, str] = {
    "GELU_ERF_EXPR": "0.5f * z * (1.f + erff(z * 0.7071067811865476f))",
    "GELU_TANH_EXPR": "0.5f * z * (1.f + tanhf(0.7978845608028654f * (z + 0.044715f * z * z * z)))",
}

PREAMBLE = r"""
#if defined(__CUDACC__)
#define PT_HD __host__ __device__ __forceinline__
#else
#define PT_HD inline
#endif
"""

HELPERS = r"""
namespace pt {

// ---- schedule constants ----------------------------------------------------------------
constexpr int BM = @BM@, BN = @BN@, BK = @BK@;   // block tile
constexpr int WM = @WM@, WN = @WN@;              // warp tile
constexpr int WARPS_M = @WARPS_M@, WARPS_N = @WARPS_N@;
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int MT = WM / 16, NT = WN / 16;        // 16x16 tiles per warp along M, N
constexpr int KSTEPS = BK / 16;                  // mma k16 steps per shared-memory tile
constexpr int STAGES = @STAGES@;                 // shared-memory pipeline depth
constexpr int REG_STAGES = @REG_STAGES@;         // register-fragment buffers
constexpr bool B_KN = @B_KN@;                    // B stored K x N (else N x K)
constexpr int CONV_DIMS = @CONV_DIMS@;           // 0: GEMM, 2 or 3: implicit-GEMM conv

// Shared-memory tiles in 16-byte chunks (8 halves) per row: A is BM x BK (k contiguous);
// B is BK x BN (n contiguous) when B_KN, else BN x BK (k contiguous).
constexpr int A_ROWS = BM, A_CPR = BK / 8;
constexpr int B_ROWS = B_KN ? BK : BN, B_CPR = B_KN ? BN / 8 : BK / 8;
constexpr int A_STAGE_BYTES = BM * BK * 2, B_STAGE_BYTES = BN * BK * 2;
constexpr int ROW_STEP_A = THREADS / A_CPR, ROW_STEP_B = THREADS / B_CPR;
constexpr int A_ITERS = (A_ROWS + ROW_STEP_A - 1) / ROW_STEP_A;
constexpr int B_ITERS = (B_ROWS + ROW_STEP_B - 1) / ROW_STEP_B;
constexpr bool A_GUARD = A_ITERS * ROW_STEP_A != A_ROWS;  // false in the valid space
constexpr bool B_GUARD = B_ITERS * ROW_STEP_B != B_ROWS;
static_assert(THREADS % A_CPR == 0 && THREADS % B_CPR == 0, "a thread keeps one column");
constexpr int A_PERIOD = @A_PERIOD@, B_PERIOD = @B_PERIOD@;  // see loader_chunk
// The next tile's copies are spread over the first LOAD_PARTS k-steps of the current one
// (interleaved with the MMAs, and fewer address registers live at once); the last k-step
// commits, waits and crosses to the next tile.
constexpr int LOAD_PARTS = KSTEPS > 1 ? KSTEPS - 1 : 1;

// ---- index math (mirrored in workers/codegen/layout.py) --------------------------------

// XOR swizzle of 16-byte chunks (bank-conflict-free ldmatrix and cp.async). Shared memory
// is 32 banks x 4 B: a 128-byte line holds 8 chunks. The chunk's 3-bit slot in its line is
// XORed with the line index mod 8:
//   CPR >= 8 (rows are whole lines):     phys = row*CPR + (col ^ (row & 7))
//   CPR <  8 (8/CPR rows share a line):  L = row*CPR + col; phys = L ^ ((L >> 3) & 7)
// A bijection inside every 128-byte line, and the 8 rows an ldmatrix matrix reads (8
// consecutive rows from a multiple of 8, same logical col) fall in 8 distinct slots.
template <int CPR>
PT_HD int swizzle(int row, int col) {
  if (CPR >= 8) return row * CPR + (col ^ (row & 7));
  const int linear = row * CPR + col;
  return linear ^ ((linear >> 3) & 7);
}

// Loader: chunks numbered row-major; thread tid copies chunks tid, tid + THREADS, ...
// (adjacent threads read adjacent 16 B of global memory). THREADS is a multiple of CPR,
// so a thread keeps one column: row = tid / CPR + it * (THREADS / CPR), col = tid % CPR.
template <int CPR>
PT_HD void loader_pos(int tid, int it, int& row, int& col) {
  row = tid / CPR + it * (THREADS / CPR);
  col = tid % CPR;
}

// Shared-memory chunk that loader iteration `it` writes, written so that only PERIOD distinct
// swizzle values exist per thread: the row advances by ROW_STEP per iteration, and after
// PERIOD iterations the swizzle pattern repeats shifted by a constant (the generator
// computes the smallest such PERIOD and the tests check the identity for every thread).
// Why: the unrolled loader would otherwise keep one register per iteration.
template <int CPR, int ROW_STEP, int PERIOD>
PT_HD int loader_chunk(int tid, int it) {
  int row, col;
  loader_pos<CPR>(tid, it % PERIOD, row, col);
  return swizzle<CPR>(row, col) + (it / PERIOD) * (PERIOD * ROW_STEP * CPR);
}

// Loader iterations [part*iters/LOAD_PARTS, (part+1)*iters/LOAD_PARTS) form part `part`.
PT_HD bool in_part(int it, int iters, int part) {
  return it >= part * iters / LOAD_PARTS && it < (part + 1) * iters / LOAD_PARTS;
}

PT_HD void warp_origin(int warp, int& wm0, int& wn0) {
  wm0 = (warp / WARPS_N) * WM;
  wn0 = (warp % WARPS_N) * WN;
}

// ldmatrix.x4 row addresses (lane -> row, chunk col). Matrix q = lane / 8 is read from the
// rows given by lanes 8q..8q+7 and lands in register q of every lane.
// A (16x16 of BM x BK): matrices rows0-7/k0-7, rows8-15/k0-7, rows0-7/k8-15, rows8-15/k8-15
// = the a0..a3 registers of mma.m16n8k16.
PT_HD void ldmatrix_a(int lane, int wm0, int i, int ks, int& row, int& col) {
  row = wm0 + i * 16 + (lane & 15);
  col = ks * 2 + (lane >> 4);
}
// B from a K x N tile, with .trans: matrices k0-7/n0-7, k8-15/n0-7, k0-7/n8-15, k8-15/n8-15
// = b0,b1 of the n8 MMA on columns 0-7, then b0,b1 of the one on columns 8-15.
PT_HD void ldmatrix_b_kn(int lane, int wn0, int j, int ks, int& row, int& col) {
  row = ks * 16 + (lane & 15);
  col = (wn0 + j * 16) / 8 + (lane >> 4);
}
// B from an N x K tile, no .trans: matrices n0-7/k0-7, n0-7/k8-15, n8-15/k0-7, n8-15/k8-15
// (same register order as above).
PT_HD void ldmatrix_b_nk(int lane, int wn0, int j, int ks, int& row, int& col) {
  row = wn0 + j * 16 + (lane & 7) + ((lane >> 4) << 3);
  col = ks * 2 + ((lane >> 3) & 1);
}

// Accumulator register reg (0..3) of an m16n8 tile: rows lane/4 (+8 for regs 2, 3),
// columns 2*(lane%4) + (reg & 1).
PT_HD void acc_position(int lane, int reg, int& row, int& col) {
  row = (lane >> 2) + 8 * (reg >> 1);
  col = 2 * (lane & 3) + (reg & 1);
}

PT_HD unsigned mulhi(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
#endif
}

// Division of n < 2^31 by a runtime divisor d >= 1 with one mul.hi and a shift (the conv
// loader divides every GEMM row index by P*Q-style sizes and every column index by the
// filter sizes, each K tile):
// p = 31 + ceil(log2 d), multiplier = ceil(2^p / d), n / d = mulhi(n, multiplier) >> (p - 32).
// The launch passes multiplier and shift (workers/codegen/layout.py fast_divmod_params):
// kernel parameters sit in the constant bank, so no register holds them across the main loop
// (when the kernel computed them itself, the median kernel held 7-10 registers more).
struct FastDivmod {
  int divisor;
  unsigned multiplier;  // 0 for d == 1
  unsigned shift;
  PT_HD void set(int d, int multiplier_bits, int shift_bits) {
    divisor = d;
    multiplier = static_cast<unsigned>(multiplier_bits);  // int32 parameter, 32 bits
    shift = static_cast<unsigned>(shift_bits);
  }
  PT_HD int div(int n) const {
    return multiplier ? static_cast<int>(mulhi(static_cast<unsigned>(n), multiplier) >> shift)
                      : n;
  }
  PT_HD void divmod(int n, int& quot, int& rem) const {
    quot = div(n);
    rem = n - quot * divisor;
  }
};

// Implicit-GEMM convolution (NHWC / NDHWC input, KRSC / KTRSC filter, stride, zero pad).
// GEMM row m = ((n*O + o)*P + p)*Q + q (O = 1 in 2-D), column k = ((t*R + r)*S + s)*C + c.
struct ConvShape {
  int batch, in_d, in_h, in_w, chan, out_k, f_t, f_r, f_s, out_o, out_p, out_q, stride, pad;
  int M, N, K;  // the GEMM view: M = batch*O*P*Q, N = out_k, K = T*R*S*C
  // A row's output coordinates (by Q, P, O) and a column's filter tap and channel (by C, S,
  // R), each by multiplication (FastDivmod): the column split runs once per part of every
  // K tile's copies, and division by a runtime divisor costs about twenty instructions.
  FastDivmod div_q, div_p, div_o, div_c, div_s, div_r;
};

PT_HD void conv_init(ConvShape& cs) {
  cs.M = cs.batch * cs.out_o * cs.out_p * cs.out_q;
  cs.N = cs.out_k;
  cs.K = cs.f_t * cs.f_r * cs.f_s * cs.chan;
}

// The filter position of GEMM column k (one per thread per K tile: a thread keeps one
// 8-channel chunk column; C % 8 == 0 keeps the chunk inside one filter position).
struct ConvK {
  bool ok;
  int t, r, s, c;
};

PT_HD ConvK conv_k_split(const ConvShape& cs, int k) {
  ConvK kk;
  kk.ok = k < cs.K;
  int rest;
  cs.div_c.divmod(k, rest, kk.c);
  cs.div_s.divmod(rest, rest, kk.s);
  cs.div_r.divmod(rest, kk.t, kk.r);
  return kk;
}

// Element offset of A(m, k) in the input and whether it is inside the (unpadded) input;
// padding and the tile overhang read as zero (cp.async zero-fill).
PT_HD bool conv_a_src(const ConvShape& cs, int m, const ConvK& kk, int& offset) {
  int rest, q, p, o;
  cs.div_q.divmod(m, rest, q);
  cs.div_p.divmod(rest, rest, p);
  if (CONV_DIMS == 3) {
    cs.div_o.divmod(rest, rest, o);
  } else {
    o = 0;
  }
  const int n = rest;  // >= batch only when m >= M (rejected below)
  const int d = o * cs.stride - cs.pad + kk.t;
  const int h = p * cs.stride - cs.pad + kk.r;
  const int w = q * cs.stride - cs.pad + kk.s;
  const bool inside = (CONV_DIMS == 3 ? static_cast<unsigned>(d) < static_cast<unsigned>(cs.in_d)
                                      : true) &&
                      static_cast<unsigned>(h) < static_cast<unsigned>(cs.in_h) &&
                      static_cast<unsigned>(w) < static_cast<unsigned>(cs.in_w);
  if (!(kk.ok && m < cs.M && inside)) {
    offset = 0;  // no address is formed outside the tensor (int overflow is UB)
    return false;
  }
  const int nd = CONV_DIMS == 3 ? n * cs.in_d + d : n;
  offset = ((nd * cs.in_h + h) * cs.in_w + w) * cs.chan + kk.c;
  return true;
}

}  // namespace pt
"""

DEVICE = r"""
#if defined(__CUDACC__)
#if !defined(@ELEM_GUARD@)
// @SHORT@ storage type (no header: see the generator's notes); the kernel never does @ELEM@
// arithmetic, it moves 16-byte chunks and converts the f32 results in PTX.
struct __align__(2) @ELEM@ {
  unsigned short bits;
};
#endif

namespace pt {

// An optimisation barrier: the compiler must assume v changed, so values derived from it
// inside the K-tile loop are not hoisted out of it. Without it, loop-invariant per-row
// addresses and conv coordinates of every loader iteration stay live in registers across
// the whole main loop (dozens of registers for wide tiles, and spills).
__device__ __forceinline__ void opaque(int& v) {
  asm volatile("" : "+r"(v));
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_size 0 writes 16 zero bytes (predicated zero-fill).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, @MMA@ inputs, f32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.@MMA@.@MMA@.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 -> one @CVT@ word, round to nearest even; lo goes to the lower address.
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  unsigned out;
  asm("cvt.rn.@CVT@.f32 %0, %1, %2;\n" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

}  // namespace pt
"""

KERNEL_HEAD = r"""
// __launch_bounds__(threads, 1): with no minimum of resident blocks ptxas trades a few
// spilled registers for occupancy on its own; with 1 it may use what the block size allows
// (65536 / threads, at most 255), and a spill means the schedule truly does not fit.
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(const @ELEM@* __restrict__ A_ptr, const @ELEM@* __restrict__ B_ptr,
       @ELEM@* __restrict__ C_ptr, @SCALARS@) {
  using namespace pt;
  extern __shared__ __align__(128) unsigned char pt_smem[];
  const unsigned short* A = reinterpret_cast<const unsigned short*>(A_ptr);
  const unsigned short* B = reinterpret_cast<const unsigned short*>(B_ptr);
  unsigned short* C = reinterpret_cast<unsigned short*>(C_ptr);
"""

# Variant prologues: define M, N, K (the GEMM view) and offset the batch.
SETUP_GEMM = r"""
  const int M = M_arg, N = N_arg, K = K_arg;
"""

# The bias variants' bias, read as 16-bit storage as A, B and C are.
SETUP_BIAS = r"""
  const unsigned short* bias = reinterpret_cast<const unsigned short*>(bias_ptr);
"""

SETUP_BMM = r"""
  const int M = M_arg, N = N_arg, K = K_arg;
  const int z = blockIdx.z;  // batch entry; M*K etc. < 2^31 by workload validation
  A += z * (M * K);
  B += z * (K * N);
  C += z * (M * N);
"""

SETUP_CONV = r"""
  ConvShape cs;
  cs.batch = batch; cs.in_d = in_d; cs.in_h = in_h; cs.in_w = in_w; cs.chan = chan;
  cs.out_k = out_k; cs.f_t = f_t; cs.f_r = f_r; cs.f_s = f_s;
  cs.out_o = out_o; cs.out_p = out_p; cs.out_q = out_q; cs.stride = stride; cs.pad = pad;
  cs.div_q.set(out_q, q_mul, q_shift);
  cs.div_p.set(out_p, p_mul, p_shift);
  cs.div_o.set(out_o, o_mul, o_shift);
  cs.div_c.set(chan, c_mul, c_shift);
  cs.div_s.set(f_s, s_mul, s_shift);
  cs.div_r.set(f_r, r_mul, r_shift);
  conv_init(cs);
  const int M = cs.M, N = cs.N, K = cs.K;
"""

TILE_SETUP = r"""
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles_n = (N + BN - 1) / BN;
  const int tile_m = static_cast<int>(blockIdx.x) / tiles_n;
  const int bm0 = tile_m * BM;
  const int bn0 = (static_cast<int>(blockIdx.x) - tile_m * tiles_n) * BN;
  const int k_tiles = (K + BK - 1) / BK;
  int wm0, wn0;
  warp_origin(warp, wm0, wn0);
  const unsigned smem_a = smem_u32(pt_smem);
  const unsigned smem_b = smem_a + STAGES * A_STAGE_BYTES;
"""

# Tile loaders: one lambda per variant family, (K tile index, stage) -> cp.async issue.
LOAD_A_GEMM = r"""
  auto load_a = [&](int kt, unsigned sa, int part) {
    int t = tid;
    opaque(t);  // per-row addresses are recomputed each K tile, not held (see opaque)
    const int r0 = t / A_CPR;
    const int gk = kt * BK + (t % A_CPR) * 8;
    const bool k_ok = gk < K;
    const unsigned short* src = A + static_cast<long long>(bm0 + r0) * K + gk;
    const int rows_left = M - bm0 - r0;
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
      if (!in_part(it, A_ITERS, part)) continue;
      if (A_GUARD && r0 + it * ROW_STEP_A >= A_ROWS) break;
      const bool ok = k_ok && it * ROW_STEP_A < rows_left;
      cp_async16(sa + loader_chunk<A_CPR, ROW_STEP_A, A_PERIOD>(t, it) * 16,
                 ok ? src + it * (ROW_STEP_A * K) : A, ok);
    }
  };
"""

LOAD_A_CONV = r"""
  auto load_a = [&](int kt, unsigned sa, int part) {
    int t = tid;
    opaque(t);  // the row -> (n, o, p, q) split is recomputed each K tile, not held
    const int r0 = t / A_CPR;
    const ConvK kk = conv_k_split(cs, kt * BK + (t % A_CPR) * 8);
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
      if (!in_part(it, A_ITERS, part)) continue;
      const int row = r0 + it * ROW_STEP_A;
      if (A_GUARD && row >= A_ROWS) break;
      int offset;
      const bool ok = conv_a_src(cs, bm0 + row, kk, offset);
      cp_async16(sa + loader_chunk<A_CPR, ROW_STEP_A, A_PERIOD>(t, it) * 16, A + offset, ok);
    }
  };
"""

LOAD_B_KN = r"""
  auto load_b = [&](int kt, unsigned sb, int part) {
    int t = tid;
    opaque(t);
    const int r0 = t / B_CPR;
    const int gk0 = kt * BK + r0, gn = bn0 + (t % B_CPR) * 8;
    const bool n_ok = gn < N;
    const unsigned short* src = B + static_cast<long long>(gk0) * N + gn;
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      if (!in_part(it, B_ITERS, part)) continue;
      if (B_GUARD && r0 + it * ROW_STEP_B >= B_ROWS) break;
      const bool ok = n_ok && gk0 + it * ROW_STEP_B < K;
      cp_async16(sb + loader_chunk<B_CPR, ROW_STEP_B, B_PERIOD>(t, it) * 16,
                 ok ? src + it * (ROW_STEP_B * N) : B, ok);
    }
  };
"""

LOAD_B_NK = r"""
  auto load_b = [&](int kt, unsigned sb, int part) {
    int t = tid;
    opaque(t);
    const int r0 = t / B_CPR;
    const int gk = kt * BK + (t % B_CPR) * 8;
    const bool k_ok = gk < K;
    const unsigned short* src = B + static_cast<long long>(bn0 + r0) * K + gk;
    const int rows_left = N - bn0 - r0;
#pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
      if (!in_part(it, B_ITERS, part)) continue;
      if (B_GUARD && r0 + it * ROW_STEP_B >= B_ROWS) break;
      const bool ok = k_ok && it * ROW_STEP_B < rows_left;
      cp_async16(sb + loader_chunk<B_CPR, ROW_STEP_B, B_PERIOD>(t, it) * 16,
                 ok ? src + it * (ROW_STEP_B * K) : B, ok);
    }
  };
"""

MAINLOOP_SETUP = r"""
  // Part `part` of tile kt of A and B into shared-memory stage `stage`.
  auto load_tile = [&](int kt, int stage, int part) {
    load_a(kt, smem_a + stage * A_STAGE_BYTES, part);
    load_b(kt, smem_b + stage * B_STAGE_BYTES, part);
  };
  auto load_whole_tile = [&](int kt, int stage) {
#pragma unroll
    for (int part = 0; part < LOAD_PARTS; ++part) load_tile(kt, stage, part);
  };

  float acc[MT][2 * NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2 * NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

  // Register fragments: REG_STAGES buffers of one k16 step (pipeline.py passes literal
  // buffer numbers, so every index is a constant and the arrays stay in registers).
  unsigned fa[REG_STAGES][MT][4];
  unsigned fb[REG_STAGES][NT][4];
  auto load_frags = [&](int buf, int stage, int ks) {
    const unsigned sa = smem_a + stage * A_STAGE_BYTES;
    const unsigned sb = smem_b + stage * B_STAGE_BYTES;
    // Recompute the swizzled lane addresses at each call (a few integer ops per ldmatrix)
    // instead of letting the compiler keep one register per (tile, k-step) address.
    int l = lane;
    opaque(l);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      int row, col;
      ldmatrix_a(l, wm0, i, ks, row, col);
      ldmatrix_x4(fa[buf][i], sa + swizzle<A_CPR>(row, col) * 16);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      int row, col;
      if (B_KN) {
        ldmatrix_b_kn(l, wn0, j, ks, row, col);
        ldmatrix_x4_trans(fb[buf][j], sb + swizzle<B_CPR>(row, col) * 16);
      } else {
        ldmatrix_b_nk(l, wn0, j, ks, row, col);
        ldmatrix_x4(fb[buf][j], sb + swizzle<B_CPR>(row, col) * 16);
      }
    }
  };
  [[maybe_unused]] auto copy_frags_1_to_0 = [&]() {  // used with two register stages
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) fa[0][i][r] = fa[REG_STAGES - 1][i][r];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) fb[0][j][r] = fb[REG_STAGES - 1][j][r];
  };
  auto mma_step = [&](int buf) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        mma_16816(acc[i][2 * j], fa[buf][i], fb[buf][j][0], fb[buf][j][1]);
        mma_16816(acc[i][2 * j + 1], fa[buf][i], fb[buf][j][2], fb[buf][j][3]);
      }
  };

"""

# Where a block's tile lies in C, the start of every epilogue (why from opaque copies:
# EPILOGUE's comment). It opens the epilogue's block; each epilogue's stores close it.
EPILOGUE_ORIGIN = r"""
  {
    int e_tid = threadIdx.x, e_block = blockIdx.x;
    opaque(e_tid);
    opaque(e_block);
    const int lane = e_tid & 31;
    const int e_tiles_n = (N + BN - 1) / BN;
    const int e_tile_m = e_block / e_tiles_n;
    const int bm0 = e_tile_m * BM, bn0 = (e_block - e_tile_m * e_tiles_n) * BN;
"""

_WARP_ORIGIN = r"""    int wm0, wn0;
    warp_origin(e_tid >> 5, wm0, wn0);
"""

EPILOGUE = (
    r"""
  // f32 accumulators -> f16, predicated 4-byte stores of column pairs (N is a multiple of
  // 8, so a pair is either inside C or wholly outside). The store coordinates are derived
  // afresh from opaque copies of the thread and block index: otherwise the compiler keeps
  // values computed before the K loop alive through it, and the largest tiles spill them."""
    + EPILOGUE_ORIGIN
    + _WARP_ORIGIN
    + r"""#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 2 * NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int row, col;
          acc_position(lane, 2 * h, row, col);
          row += bm0 + wm0 + i * 16;
          col += bn0 + wn0 + j * 8;
          if (row < M && col < N) {
            *reinterpret_cast<unsigned*>(C + row * N + col) =
                pack_half2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          }
        }
  }
}
"""
)

# The fused GEMM + SwiGLU's epilogue (variants gemm_swiglu_kn / _nk): the weights interleave
# the gate's and the up projection's columns in groups of 8 (model/workloads.py
# SWIGLU_INTERLEAVE), so a warp's n8 tiles 2t and 2t+1 hold 8 gate columns and the same 8 up
# columns, in the same registers of the same thread: each thread gates its own f32
# accumulators, silu(gate)·up (rounded to f16 once, where the unfused pair rounds gate, up
# and the product), and stores column pairs of C, whose rows are N/2 wide. A group of 16
# GEMM columns is inside N or wholly outside (N = 2n, n a multiple of 8).
EPILOGUE_SWIGLU = (
    EPILOGUE_ORIGIN
    + "    const int NC = N / 2;  // C's columns\n"
    + _WARP_ORIGIN
    + r"""#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int row, col;
          acc_position(lane, 2 * h, row, col);
          row += bm0 + wm0 + i * 16;
          if (row < M && bn0 + wn0 + t * 16 < N) {
            const float* g = &acc[i][2 * t][2 * h];
            const float* u = &acc[i][2 * t + 1][2 * h];
            const float y0 = g[0] / (1.f + expf(-g[0])) * u[0];
            const float y1 = g[1] / (1.f + expf(-g[1])) * u[1];
            const int c = (bn0 + wn0) / 2 + t * 8 + col;
            *reinterpret_cast<unsigned*>(C + row * NC + c) = pack_half2(y0, y1);
          }
        }
  }
}
"""
)

# The bias + GELU epilogue's plain C++ part (variants gemm_bias_gelu_kn / _nk), after HELPERS:
# GELU of the biased f32 accumulator in the form the gelu_tanh argument picks.
HELPERS_BIAS_GELU = r"""
namespace pt {
PT_HD float gelu(float z, bool tanh_form) {
  return tanh_form ? @GELU_TANH_EXPR@ : @GELU_ERF_EXPR@;
}
}  // namespace pt
"""

# Its device part, after DEVICE: one 16-bit @SHORT@ value (a bias element) to f32, exactly
# (@H2F@: the memops family's conversion, workers/codegen/memops/cuda_text.py CONVERSIONS).
DEVICE_BIAS = r"""
namespace pt {
__device__ __forceinline__ float widen_elem(unsigned short h) {
@H2F@
}
}  // namespace pt
"""

# The epilogue of C = gelu(A @ B + bias) (variants gemm_bias_gelu_kn / _nk): EPILOGUE's
# stores, each column pair's accumulators first offset by its two bias values (one 4-byte
# load: N is a multiple of 8 and the column even) and passed through GELU in f32, so C is
# rounded once, where the unfused GEMM and bias_gelu round the product and then the result.
EPILOGUE_BIAS_GELU = (
    EPILOGUE_ORIGIN
    + _WARP_ORIGIN
    + r"""    const bool tanh_form = gelu_tanh != 0;
#pragma unroll
    for (int j = 0; j < 2 * NT; ++j) {
      int row0, col;
      acc_position(lane, 0, row0, col);
      col += bn0 + wn0 + j * 8;
      if (col < N) {
        const unsigned pair = *reinterpret_cast<const unsigned*>(bias + col);
        const float b0 = widen_elem(static_cast<unsigned short>(pair & 0xFFFFu));
        const float b1 = widen_elem(static_cast<unsigned short>(pair >> 16));
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h + bm0 + wm0 + i * 16;
            if (row < M) {
              const float y0 = gelu(acc[i][j][2 * h] + b0, tanh_form);
              const float y1 = gelu(acc[i][j][2 * h + 1] + b1, tanh_form);
              *reinterpret_cast<unsigned*>(C + row * N + col) = pack_half2(y0, y1);
            }
          }
      }
    }
  }
}
"""
)

DEVICE_END = "#endif  // __CUDACC__\n"
