"""A CPU emulator of generated CUDA kernels: g++ builds a kernel's real helpers and body with
its PTX wrappers swapped for emulations of their ISA semantics (tests/test_codegen_emulated.py
for the mma.sync family, tests/test_wgmma_emulated.py for the wgmma probe).

The common part (``COMMON_SHIM`` and ``KERNEL_LAUNCH`` in the kernel's translation unit,
``RUNTIME``'s main in its own, compiled once per process and linked in):
- one OS thread per CUDA thread; ``__syncthreads`` is a block barrier;
- cp.async is deferred: a copy lands only when its thread's ``cp.async.wait_group`` retires
  its group (the latest moment hardware may deliver it); shared memory starts as NaN;
- a race detector numbers the barrier intervals ("epochs"): a cp.async may not target a
  16-byte chunk that any thread read in the same epoch, nor one that an asynchronous MMA in
  flight reads (write-after-read); readers may read only chunks whose copy landed in an
  earlier epoch (read-after-write needs a barrier);
- every cp.async source lies inside A or B (and is 16-byte aligned), every shared address
  inside the dynamic allocation, and canaries around C catch out-of-bounds stores.

Element types: fp16 unless a harness says otherwise. ``element_defines`` reads a kernel's own
text for its mma's operand type and its cvt's destination type (``PT_MMA_BF16``,
``PT_CVT_BF16``; a wgmma kernel's wgmma operand type too, ``PT_WGMMA_BF16``), and
``build_and_run`` stores the operands and reads C in the workload's dtype (bf16 as uint16
bits, as ``pipetune.workers.runners.elements`` holds them).
"""

from __future__ import annotations

import atexit
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from scipy.special import erf as scipy_erf

from pipetune.model.workloads import SWIGLU_INTERLEAVE, AnyWorkload
from pipetune.workers.runners.elements import UNIT_ROUNDOFF, narrow, storage, widen

# fp16 <-> f32 as the hardware converts (round to nearest even), for every emulator's shim.
HALF_CONVERSIONS = r"""
static float h2f(unsigned short bits) { _Float16 h; std::memcpy(&h, &bits, 2); return (float)h; }
static unsigned short f2h(float f) {
  _Float16 h = (_Float16)f;  // round to nearest even, as cvt.rn
  unsigned short b;
  std::memcpy(&b, &h, 2);
  return b;
}
"""

# bf16 <-> f32 as the hardware converts: g++ 12 has no bf16 arithmetic, so on the bits. A bf16
# is a float32's top half; cvt.rn rounds the low half away to nearest even (a carry into the
# exponent rounds up a binade, or to infinity, as it should) and makes NaN the canonical one.
BF16_CONVERSIONS = r"""
static float b2f(unsigned short bits) {
  const unsigned u = (unsigned)bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static unsigned short f2b(float f) {
  if (std::isnan(f)) return 0x7FFF;
  unsigned u;
  std::memcpy(&u, &f, 4);
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
"""

# The barrier every shim's threads meet at (a block's __syncthreads, a warp's collective),
# for COMMON_SHIM and tests/test_memops_emulated.py's shim. A futex word per barrier: waiters
# sleep on its generation and the last arrival wakes them all at once (a condition
# variable's waiters would each take its mutex again on waking, hundreds of threads one after
# another at every barrier, most of an emulation's time). ``epoch``, where set, counts the
# barrier's releases, for a race detector's epochs.
BARRIER = r"""
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>

struct Barrier {
  std::atomic<int> waiting{0};
  std::atomic<unsigned> gen{0};
  int count;
  int* epoch = nullptr;
  explicit Barrier(int n, int* e = nullptr) : count(n), epoch(e) {}
  void wait() {
    const unsigned g = gen.load();
    if (waiting.fetch_add(1) + 1 == count) {
      waiting.store(0);
      if (epoch) __atomic_add_fetch(epoch, 1, __ATOMIC_SEQ_CST);
      gen.store(g + 1);
      syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    } else {
      while (gen.load() == g)
        syscall(SYS_futex, &gen, FUTEX_WAIT_PRIVATE, g, nullptr, nullptr, 0);
    }
  }
};
"""

COMMON_STATE = (
    r"""
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// The state and checks that the kernel's translation unit and MAIN's (the runtime, built once
// per process: build_harness's ``runtime``) share: inline, one entity in the program. Nothing
// here depends on a harness's defines (the two units would otherwise disagree on it).
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 gridDim;

alignas(128) inline unsigned char pt_smem[1 << 18];
inline unsigned g_smem_bytes = 0;
inline const unsigned char *g_a = nullptr, *g_b = nullptr;
inline size_t g_a_bytes = 0, g_b_bytes = 0;

[[noreturn]] inline void fail(const char* what, long a, long b) {
  std::fprintf(stderr, "EMULATOR: %s (%ld, %ld) block (%u,%u) thread %u\n", what, a, b,
               blockIdx.x, blockIdx.z, threadIdx.x);
  std::fflush(stderr);
  // _Exit, not exit: the other threads are still running, and exit() would destroy the
  // globals they use under them (a segfault instead of the verdict, now and then).
  std::_Exit(3);
}

"""
    + BARRIER
    + r"""
// Race detector state, per 16-byte shared-memory chunk.
inline std::mutex g_track;
inline int g_epoch = 0;
inline std::vector<int> g_last_read, g_landed;
// Asynchronous reads in flight per chunk (wgmma issued, not yet retired by its wait_group).
inline std::vector<int> g_pending;

inline Barrier* g_block = nullptr;
inline std::vector<Barrier*> g_warps;
struct WarpShared { unsigned addr[32]; unsigned a[32][4]; unsigned b[32][2]; };
inline std::vector<WarpShared> g_ws;
namespace pt {
struct Copy { unsigned dst; unsigned char data[16]; };  // 16 bytes bound for shared memory
}

// What MAIN hands the kernel's translation unit (KERNEL_LAUNCH): the operands, the arguments.
struct LaunchContext {
  char** argv;
  unsigned char *ap, *bp, *cp;  // A, B and C, 16-byte aligned
  size_t a_bytes, b_bytes;
  long c_elems;
  const int* s;  // the scalars
};
// The kernel's launch, as its translation unit describes it (KERNEL_LAUNCH).
struct KernelShape { int nscalars, threads, grid_y, blocks_reversed; unsigned short nan_bits; };
extern const KernelShape pt_kernel;
void pt_prepare(const LaunchContext& ctx);  // inputs beside A and B, then set-up
void pt_run_thread(const LaunchContext& ctx);  // one thread of one block (threadIdx, blockIdx set)
void pt_finish(const LaunchContext& ctx);  // after every block (a second kernel)
"""
)

COMMON_SHIM = (
    COMMON_STATE
    + r"""
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };

// The element types the kernel's text declares (element_defines; fp16 where a harness sets
// none): PT_MMA_BF16, the mma's A and B (how an MMA shim decodes operand bits); PT_CVT_BF16,
// pack_half2's cvt destination (how results are encoded). Each is read from its own
// instruction, so a kernel whose parts disagree computes garbage here as it would on hardware.
#ifndef PT_MMA_BF16
#define PT_MMA_BF16 0
#endif
#ifndef PT_CVT_BF16
#define PT_CVT_BF16 0
#endif

inline void __syncthreads() { g_block->wait(); }

"""
    + HALF_CONVERSIONS
    + BF16_CONVERSIONS
    + r"""
namespace pt {
inline unsigned smem_u32(const void* p) {
  return (unsigned)((const unsigned char*)p - pt_smem);
}
inline void opaque(int&) {}

thread_local std::vector<std::vector<Copy>> t_groups;
thread_local std::vector<Copy> t_open;

inline void cp_async16(unsigned dst, const void* src, bool ok) {
  if (dst % 16 || dst + 16 > g_smem_bytes)
    fail("cp.async shared address out of range", dst, g_smem_bytes);
  Copy c; c.dst = dst;
  if (ok) {
    const unsigned char* s = (const unsigned char*)src;
    bool in_a = s >= g_a && s + 16 <= g_a + g_a_bytes, in_b = s >= g_b && s + 16 <= g_b + g_b_bytes;
    if (!in_a && !in_b) fail("cp.async reads outside A and B", (long)(s - g_a), (long)(s - g_b));
    if ((uintptr_t)s % 16) fail("cp.async source not 16-byte aligned", (long)(uintptr_t)s % 16, 0);
    std::memcpy(c.data, s, 16);
  } else {
    std::memset(c.data, 0, 16);
  }
  std::lock_guard<std::mutex> lk(g_track);
  if (g_last_read[dst / 16] == g_epoch)
    fail("write-after-read race on shared chunk", dst / 16, g_epoch);
  if (g_pending[dst / 16] > 0)
    fail("write-after-read race: an MMA in flight reads the shared chunk", dst / 16, g_epoch);
  t_open.push_back(c);
}
inline void cp_async_commit() { t_groups.push_back(t_open); t_open.clear(); }
template <int N> inline void cp_async_wait() {
  std::lock_guard<std::mutex> lk(g_track);
  while ((int)t_groups.size() > N) {
    for (const Copy& c : t_groups.front()) {
      std::memcpy(pt_smem + c.dst, c.data, 16);
      g_landed[c.dst / 16] = g_epoch;
    }
    t_groups.erase(t_groups.begin());
  }
}

inline unsigned pack_half2(float lo, float hi) {
#if PT_CVT_BF16
  return (unsigned)f2b(lo) | ((unsigned)f2b(hi) << 16);
#else
  return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
#endif
}
}  // namespace pt
"""
)

READ_FILE = r"""
static std::vector<unsigned char> read_file(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) fail("cannot open input", 0, 0);
  std::vector<unsigned char> data;
  unsigned char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  return data;
}
"""

# The kernel's side of MAIN (after the shims and the kernel, in its translation unit): the
# harness's defines expanded into the functions MAIN calls (LaunchContext), so MAIN itself
# depends on none of them and is compiled once per process (``RUNTIME``).
KERNEL_LAUNCH = (
    READ_FILE
    + r"""
// Kernel arguments after the scalars (the TMA loader's tensor maps), and set-up that needs
// the operands (filling those maps): empty unless a shim defines them.
#ifndef EXTRA_ARGS
#define EXTRA_ARGS
#endif
// Pointers after C (a bias variant's bias; BIAS_SHIM): empty unless a shim defines them.
#ifndef EXTRA_POINTERS
#define EXTRA_POINTERS
#endif
#ifndef BEFORE_LAUNCH
#define BEFORE_LAUNCH
#endif
// Inputs beside A and B, read before BEFORE_LAUNCH (a bias variant's bias; BIAS_SHIM).
#ifndef LOAD_EXTRA_INPUTS
#define LOAD_EXTRA_INPUTS
#endif
// Run after every block of the kernel (a second kernel: split-K's reduction).
#ifndef AFTER_LAUNCH
#define AFTER_LAUNCH
#endif
// The NaN that C and shared memory start as, in C's element type (build_and_run sets it).
#ifndef PT_NAN_BITS
#define PT_NAN_BITS 0x7E00
#endif
// Grid y (split-K's slices): 1 unless a shim says otherwise.
#ifndef GRID_Y
#define GRID_Y 1
#endif
// The blocks run one after another, in grid order unless a shim reverses x (the order in which
// blocks finish is the hardware's to choose: a kernel must not depend on it).
#ifndef BLOCKS_REVERSED
#define BLOCKS_REVERSED 0
#endif
// A pointer that converts to the kernel's pointer types, whichever element type the kernel
// declares (__half, __nv_bfloat16): on hardware the type is only a label on an address too.
struct AnyPtr {
  void* p;
  template <class T> operator T*() const { return (T*)p; }
};
const KernelShape pt_kernel = {NSCALARS, THREADS_, GRID_Y, BLOCKS_REVERSED, PT_NAN_BITS};
// MAIN's variables, by the names the defines above use.
#define PT_MAIN_VARIABLES                                                          \
  char** argv = ctx.argv;                                                          \
  unsigned char *ap = ctx.ap, *bp = ctx.bp, *cp = ctx.cp;                          \
  const size_t a_bytes = ctx.a_bytes, b_bytes = ctx.b_bytes;                       \
  const long c_elems = ctx.c_elems;                                                \
  const int* s = ctx.s;
void pt_prepare(const LaunchContext& ctx) {
  PT_MAIN_VARIABLES
  LOAD_EXTRA_INPUTS
  BEFORE_LAUNCH
}
void pt_run_thread(const LaunchContext& ctx) {
  PT_MAIN_VARIABLES
  pt::t_groups.clear();
  pt::t_open.clear();
  KERNEL(AnyPtr{ap}, AnyPtr{bp}, AnyPtr{cp} EXTRA_POINTERS SCALAR_ARGS EXTRA_ARGS);
  if (!pt::t_open.empty() || !pt::t_groups.empty()) fail("copies in flight at exit", 0, 0);
}
void pt_finish(const LaunchContext& ctx) {
  PT_MAIN_VARIABLES
  AFTER_LAUNCH
}
"""
)

# The host program's main, the same for every kernel: its own translation unit, compiled
# once per process and linked into each harness (build_harness's ``runtime``).
RUNTIME = (
    COMMON_STATE
    + READ_FILE
    + r"""
int main(int argc, char** argv) {
  // argv: a.bin b.bin c.bin c_elems grid_x grid_z smem_bytes scalars...
  const int threads_per_block = pt_kernel.threads, grid_y = pt_kernel.grid_y;
  if (argc < 8 + pt_kernel.nscalars) fail("usage", argc, 0);
  std::vector<unsigned char> a = read_file(argv[1]), b = read_file(argv[2]);
  // 16-byte aligned copies (cudaMalloc gives 256-byte alignment).
  std::vector<unsigned char> a16(a.size() + 16), b16(b.size() + 16);
  unsigned char* ap = a16.data() + (16 - (uintptr_t)a16.data() % 16) % 16;
  unsigned char* bp = b16.data() + (16 - (uintptr_t)b16.data() % 16) % 16;
  std::memcpy(ap, a.data(), a.size());
  std::memcpy(bp, b.data(), b.size());
  g_a = ap; g_a_bytes = a.size(); g_b = bp; g_b_bytes = b.size();
  const long c_elems = std::atol(argv[4]);
  const unsigned grid_x = std::atoi(argv[5]), grid_z = std::atoi(argv[6]);
  g_smem_bytes = std::atoi(argv[7]);
  std::vector<int> s(pt_kernel.nscalars + 1);
  for (int i = 0; i < pt_kernel.nscalars; ++i) s[i] = std::atoi(argv[8 + i]);
  const size_t canary = 4096;
  std::vector<unsigned char> c(2 * canary + 2 * c_elems + 16, 0xAB);
  unsigned char* cp = c.data() + canary;
  cp += (16 - (uintptr_t)cp % 16) % 16;
  const unsigned short nan = pt_kernel.nan_bits;
  for (long i = 0; i < c_elems; ++i)  // NaN fill: an element no thread writes shows
    std::memcpy(cp + 2 * i, &nan, 2);
  const LaunchContext ctx{argv, ap, bp, cp, a.size(), b.size(), c_elems, s.data()};
  gridDim = {grid_x, (unsigned)grid_y, grid_z};
  pt_prepare(ctx);
  g_last_read.assign(g_smem_bytes / 16, INT_MIN);
  for (unsigned z = 0; z < grid_z; ++z)
   for (unsigned y = 0; y < (unsigned)grid_y; ++y)
    for (unsigned xi = 0; xi < grid_x; ++xi) {
      const unsigned x = pt_kernel.blocks_reversed ? grid_x - 1 - xi : xi;
      for (unsigned i = 0; i < g_smem_bytes / 2; ++i)  // NaN fill: unwritten reads show
        std::memcpy(pt_smem + 2 * i, &nan, 2);
      g_landed.assign(g_smem_bytes / 16, INT_MIN);
      g_last_read.assign(g_smem_bytes / 16, INT_MIN);
      g_pending.assign(g_smem_bytes / 16, 0);
      g_epoch = 0;
      Barrier block(threads_per_block, &g_epoch);
      g_block = &block;
      g_warps.clear();
      for (int w = 0; w < threads_per_block / 32; ++w) g_warps.push_back(new Barrier(32));
      g_ws.assign(threads_per_block / 32, WarpShared{});
      std::vector<std::thread> threads;
      for (int t = 0; t < threads_per_block; ++t)
        threads.emplace_back([&, t] {
          threadIdx = {(unsigned)t, 0, 0};
          blockIdx = {x, y, z};
          pt_run_thread(ctx);
        });
      for (auto& th : threads) th.join();
      for (Barrier* w : g_warps) delete w;
    }
  pt_finish(ctx);
  for (size_t i = 0; i < c.size(); ++i) {
    const unsigned char* p = c.data() + i;
    if ((p < cp || p >= cp + 2 * c_elems) && *p != 0xAB) fail("store outside C", (long)(p - cp), 0);
  }
  FILE* f = std::fopen(argv[3], "wb");
  std::fwrite(cp, 2, c_elems, f);
  std::fclose(f);
  std::puts("OK");
  return 0;
}
"""
)


# The NaN each element type's C and shared memory start as (KERNEL_LAUNCH's PT_NAN_BITS): fp16's
# quiet NaN, and bf16's, 0x7FC0, which is a NaN read as fp16 as well (a kernel that decodes
# bf16 operands as fp16 still sees unwritten shared memory as NaN).
NAN_BITS: dict[str, int] = {"float16": 0x7E00, "bfloat16": 0x7FC0}
# The spacing of each element type's subnormals: the absolute part of a rounding's error.
SUBNORMAL_SPACING: dict[str, float] = {"float16": 2.0**-24, "bfloat16": 2.0**-133}

# The mma.sync operand types and cvt destinations a kernel's text may declare, and whether
# each is bf16 (neither string is part of the other).
_MMA_TYPES: dict[str, int] = {
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32": 0,
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32": 1,
}
_CVT_TYPES: dict[str, int] = {"cvt.rn.f16x2.f32": 0, "cvt.rn.bf16x2.f32": 1}
# The wgmma kernels' operand types (m64nNk16, f32 accumulators; any N): A's and B's the same.
_WGMMA_TYPES: dict[str, int] = {".f32.f16.f16 ": 0, ".f32.bf16.bf16 ": 1}
_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16(\.f32\.\w+\.\w+ )")
# Its immediates after the scale-d predicate: scale-a, scale-b, trans-a, trans-b. trans-b 1 reads
# B MN-major (B stored K x N), 0 K-major (N x K).
_WGMMA_IMMEDIATES = re.compile(r"p, 1, 1, 0, ([01]);")


def _declared(code: str, types: dict[str, int], what: str) -> int:
    found = {flag for text, flag in types.items() if text in code}
    assert len(found) == 1, f"the kernel's {what} is not one of {sorted(types)}"
    return found.pop()


# How a bias variant's device text widens a 16-bit bias element (its ``widen_elem``): fp16's
# cvt, or bf16's shift (workers/codegen/memops/cuda_text.py CONVERSIONS).
_WIDEN_TYPES: dict[str, int] = {"cvt.f32.f16": 0, "(unsigned)h << 16": 1}

# A bias variant's bias (workers/codegen/variants.py BIAS_GELU_VARIANTS), passed after C: read
# from bias.bin beside the operands (build_and_run writes it) and widened as the kernel's own
# text declares (PT_WIDEN_BF16), so a kernel whose bias loads disagree with its type fails.
BIAS_SHIM = r"""
static std::vector<unsigned short> g_bias;
namespace pt {
inline float widen_elem(unsigned short h) {
#if PT_WIDEN_BF16
  return b2f(h);
#else
  return h2f(h);
#endif
}
}  // namespace pt
#define EXTRA_POINTERS , AnyPtr{g_bias.data()}
#define LOAD_EXTRA_INPUTS                                                          \
  {                                                                                \
    std::string path(argv[1]);                                                     \
    std::vector<unsigned char> raw = read_file(                                    \
        (path.substr(0, path.rfind('/') + 1) + "bias.bin").c_str());               \
    g_bias.resize(raw.size() / 2);                                                 \
    std::memcpy(g_bias.data(), raw.data(), raw.size());                            \
  }
"""


def element_defines(code: str) -> str:
    """``#define``s for COMMON_SHIM and an MMA shim: the element types that a mma.sync
    kernel's own device text declares (its PTX wrappers, which the emulator replaces), each
    read from its own instruction, not from the workload, so that a kernel that decodes its
    operands as one type and writes C as another fails here as it would on hardware."""
    mma = _declared(code, _MMA_TYPES, "mma.sync operand type")
    cvt = _declared(code, _CVT_TYPES, "f32 -> 16-bit conversion")
    defines = f"#define PT_MMA_BF16 {mma}\n#define PT_CVT_BF16 {cvt}\n"
    if "widen_elem" in code:  # a bias variant: how it widens its bias
        widen = _declared(code, _WIDEN_TYPES, "16-bit -> f32 conversion")
        defines += f"#define PT_WIDEN_BF16 {widen}\n"
    # A wgmma kernel's own MMA (its device text holds the mma.sync wrapper too, unused): its
    # instruction's operand type, PT_WGMMA_BF16, and how it reads B (its trans-b immediate,
    # PT_WGMMA_B_K_MAJOR), for the wgmma shim (tests/test_wgmma_emulated.py).
    if "wgmma.mma_async" in code:
        wgmma = _declared("".join(_WGMMA.findall(code)), _WGMMA_TYPES, "wgmma operand type")
        defines += f"#define PT_WGMMA_BF16 {wgmma}\n"
        trans_b = set(_WGMMA_IMMEDIATES.findall(code))
        assert len(trans_b) == 1, f"the kernel's wgmma trans-b immediates: {trans_b}"
        defines += f"#define PT_WGMMA_B_K_MAJOR {int(trans_b.pop() == '0')}\n"
    return defines


def values_of(c: np.ndarray) -> np.ndarray:
    """A 16-bit array's values: fp16 as is, bf16 (uint16 bits) widened to float32, exactly."""
    return widen(np, c) if c.dtype == np.uint16 else c


def rounded(ref: np.ndarray, dtype: str) -> np.ndarray:
    """The reference rounded to nearest even in ``dtype``, as values (``values_of``)."""
    if dtype == "float16":
        return ref.astype(np.float16)
    # narrow rounds through float32: exact first for the references that are compared exactly
    # (integers below 2^24, see OPERAND_RANGE), so this is one rounding, as the kernel's.
    return values_of(narrow(np, ref, dtype))


def reference(
    workload: AnyWorkload, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """The operator computed with numpy in float64 (an independent im2col for convs), on
    operands as ``operands`` (and ``bias_of``) store them (bf16 as uint16 bits)."""
    a32, b32 = values_of(a).astype(np.float64), values_of(b).astype(np.float64)
    op = workload.op
    if op == "gemm":
        return a32 @ (b32 if workload.b_layout == "kn" else b32.T)
    if op == "gemm_bias_gelu":
        assert bias is not None
        z = a32 @ (b32 if workload.b_layout == "kn" else b32.T) + values_of(bias)
        if workload.approximate == "tanh":
            return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
        return 0.5 * z * (1 + scipy_erf(z / np.sqrt(2)))
    if op == "gemm_swiglu":
        # Both projections, then the gate's and up's columns out of their groups of 8.
        product = a32 @ (b32 if workload.b_layout == "kn" else b32.T)
        groups = product.reshape(workload.m, -1, 2, SWIGLU_INTERLEAVE)
        gate = groups[:, :, 0, :].reshape(workload.m, -1)
        up = groups[:, :, 1, :].reshape(workload.m, -1)
        e = np.exp(-np.abs(gate))  # no overflow: exp of -|gate| only
        return gate * np.where(gate >= 0, 1 / (1 + e), e / (1 + e)) * up
    if op == "bmm":
        return a32 @ (b32 if workload.b_layout == "kn" else b32.transpose(0, 2, 1))
    w = workload
    spatial = 2 if op == "conv2d" else 3
    pad = [(0, 0), *[(w.pad, w.pad)] * spatial, (0, 0)]
    x = np.pad(a32, pad)
    filt = (w.r, w.s) if spatial == 2 else (w.t, w.r, w.s)
    out = w.out_hw if spatial == 2 else w.out_dhw
    y = np.zeros((w.n, *out, w.k), dtype=np.float64)
    for offs in np.ndindex(*filt):
        steps = (
            slice(f, f + w.stride * (o - 1) + 1, w.stride) for f, o in zip(offs, out, strict=True)
        )
        window = x[(slice(None), *steps)]
        y += window @ b32[(slice(None), *offs)].T
    return y


# Operands are small integers stored as fp16 (or bf16: its 8 significant bits hold integers
# up to 256 exactly): every product and partial sum is then an integer far below 2^24, exact
# in fp32 in any order of accumulation (split-K and stream-K included), so the one rounding
# left is the kernel's final store to fp16 (bf16) and C must equal the reference rounded to
# fp16 (bf16) exactly. With normal draws and a tolerance, a wrong rounding mode in the
# epilogue, or a lost partial on a small K, could pass. bf16's sums, up to about a thousand
# on a K of 200, need more than its 8 bits: its final rounding is exercised on a good share
# of the outputs (a quarter of gemm 70x40x200's).
OPERAND_RANGE = (-8, 8)


def operands(workload: AnyWorkload, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    w = workload
    if w.op in ("gemm", "gemm_bias_gelu"):
        a_shape = (w.m, w.k)
        b_shape = (w.k, w.n) if w.b_layout == "kn" else (w.n, w.k)
    elif w.op == "gemm_swiglu":
        a_shape = (w.m, w.k)
        b_shape = (w.k, 2 * w.n) if w.b_layout == "kn" else (2 * w.n, w.k)
    elif w.op == "bmm":
        a_shape = (w.b, w.m, w.k)
        b_shape = (w.b, w.k, w.n) if w.b_layout == "kn" else (w.b, w.n, w.k)
    elif w.op == "conv2d":
        a_shape, b_shape = (w.n, w.h, w.w, w.c), (w.k, w.r, w.s, w.c)
    else:
        a_shape, b_shape = (w.n, w.d, w.h, w.w, w.c), (w.k, w.t, w.r, w.s, w.c)
    low, high = OPERAND_RANGE
    a = rng.integers(low, high + 1, a_shape)
    b = rng.integers(low, high + 1, b_shape)
    if w.op in ("gemm_swiglu", "gemm_bias_gelu"):
        # silu(gate)·up of such sums would overflow fp16 (|y| to 1e5), and GELU of them would
        # be the identity or 0: eighths in [-1/4, 1/4] instead, still exact products and sums,
        # gates (GELU's z) of a few units where silu (GELU) bends.
        a = rng.integers(-2, 3, a_shape) / 8
        b = rng.integers(-2, 3, b_shape) / 8
    # Exact in either type: the same draws (and stream of random numbers) for both.
    if w.dtype == "float16":
        return a.astype(np.float16), b.astype(np.float16)
    return narrow(np, a, w.dtype), narrow(np, b, w.dtype)


def bias_of(workload: AnyWorkload, rng: np.random.Generator) -> np.ndarray | None:
    """A bias variant's bias (eighths in [-1, 1]: exact in either type, z = A·B + bias exact
    in f32), drawn after the operands; None for every other op."""
    if workload.op != "gemm_bias_gelu":
        return None
    bias = rng.integers(-8, 9, workload.n) / 8
    if workload.dtype == "float16":
        return bias.astype(np.float16)
    return narrow(np, bias, workload.dtype)


# Every harness is compiled with these flags (a precompiled header is valid only for them).
_GXX_FLAGS = ("-std=c++17", "-O1", "-pthread", "-w")
# The standard headers the shims include: parsed once per process into a precompiled header
# that g++ reads before each harness (-include), instead of parsing them in every build (a
# third of a build's time). A header the harness includes again is skipped by its guard.
_STANDARD_HEADERS = (
    "math.h", "pthread.h", "sched.h", "linux/futex.h", "sys/syscall.h", "unistd.h", "algorithm",
    "atomic", "chrono", "climits", "cmath",
    "condition_variable", "cstdint", "cstdio", "cstdlib", "cstring", "limits", "map", "mutex",
    "string", "thread", "vector",
)  # fmt: skip
_build_lock = threading.Lock()
_build_dir: Path | None = None
# Executables already built in this process, by the hash of their source: a harness built
# for one test (or case) and needed again, unchanged, is run again rather than rebuilt.
_built: dict[str, Path] = {}
# Object files of harnesses' runtime translation units, by the hash of their source: the
# part of a harness that is the same for many kernels (its main, the threads, the checks),
# about half of a build's time, compiled once per process and linked into each.
_runtime_objects: dict[str, Path] = {}


def _shared_build_dir() -> Path:
    """This process's folder of precompiled standard headers (made once, removed at exit);
    the caller holds ``_build_lock``."""
    global _build_dir
    if _build_dir is None:
        folder = Path(tempfile.mkdtemp(prefix="pipetune-emulator-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        header = folder / "pt_std.h"
        header.write_text("".join(f"#include <{name}>\n" for name in _STANDARD_HEADERS))
        # Without the .gch (a failed build), -include still reads the header itself: slower,
        # the same program.
        subprocess.run(
            ["g++", *_GXX_FLAGS, "-x", "c++-header", str(header), "-o", f"{header}.gch"],
            capture_output=True,
            check=False,
        )
        _build_dir = folder
    return _build_dir


def _runtime_object(source: str, folder: Path) -> Path:
    """The object file of a runtime translation unit, compiled on first use in this process
    (the caller holds ``_build_lock``)."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key not in _runtime_objects:
        src = folder / f"runtime-{key[:16]}.cpp"
        src.write_text(source)
        obj = src.with_suffix(".o")
        header = str(folder / "pt_std.h")
        build = subprocess.run(
            ["g++", *_GXX_FLAGS, "-include", header, "-c", str(src), "-o", str(obj)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert build.returncode == 0, build.stderr[:4000]
        _runtime_objects[key] = obj
    return _runtime_objects[key]


def build_harness(source: str, tmp: Path, runtime: str | None = None) -> Path:
    """Compile a harness program with g++ (its source kept in ``tmp``); the executable's
    path, shared by every caller in this process with the same sources. ``runtime``: a
    second translation unit linked in, compiled once per process for every harness that
    shares it (the entities both units define are ``inline``: one in the program)."""
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / "harness.cpp"
    src.write_text(source)
    key = hashlib.sha256(f"{source}\0{runtime}".encode()).hexdigest()
    with _build_lock:
        folder = _shared_build_dir()
        if key in _built:
            return _built[key]
        objects = [] if runtime is None else [str(_runtime_object(runtime, folder))]
    # In the caller's folder: two threads that build one source at once each write their own.
    exe = tmp / "harness"
    header = str(folder / "pt_std.h")
    build = subprocess.run(
        ["g++", *_GXX_FLAGS, "-include", header, str(src), *objects, "-o", str(exe)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr[:4000]
    with _build_lock:
        _built[key] = exe
    return exe


def build_and_run(
    source: str,
    tmp: Path,
    workload: AnyWorkload,
    grid: tuple[int, int, int],
    smem_bytes: int,
    scalars: tuple[int, ...],
    runtime: str = RUNTIME,
) -> tuple[int, str, np.ndarray | None, np.ndarray]:
    """Build a harness (``source``: ``harness_source``'s kernel unit; ``runtime``: RUNTIME,
    or RUNTIME with a shim's kernel-independent functions, linked in) and run it on seeded
    random operands of ``workload``: (returncode, stderr, C or None, numpy's reference). C is
    held as the workload's dtype is on the host (bf16 as uint16 bits: ``values_of``)."""
    source = f"#define PT_NAN_BITS {NAN_BITS[workload.dtype]:#06x}\n" + source
    exe = build_harness(source, tmp, runtime=runtime)
    rng = np.random.default_rng(7)
    a, b = operands(workload, rng)
    bias = bias_of(workload, rng)
    ref = reference(workload, a, b, bias)
    a.tofile(tmp / "a.bin")
    b.tofile(tmp / "b.bin")
    if bias is not None:
        bias.tofile(tmp / "bias.bin")
    run = subprocess.run(
        [
            str(exe),
            str(tmp / "a.bin"),
            str(tmp / "b.bin"),
            str(tmp / "c.bin"),
            str(ref.size),
            str(grid[0]),
            str(grid[2]),
            str(smem_bytes),
            *map(str, scalars),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    c = None
    if run.returncode == 0:
        c = np.fromfile(tmp / "c.bin", dtype=storage(np, workload.dtype)).reshape(ref.shape)
    return run.returncode, run.stderr, c, ref


def harness_source(shims: str, body: str, kernel_name: str, threads: int, nscalars: int) -> str:
    """The kernel's translation unit of a host program: the defines KERNEL_LAUNCH needs, the
    shims, the kernel, KERNEL_LAUNCH (RUNTIME's main, linked in, calls it)."""
    scalar_args = "".join(f", s[{i}]" for i in range(nscalars))
    defines = (
        f"#define NSCALARS {nscalars}\n#define THREADS_ {threads}\n"
        f"#define KERNEL {kernel_name}\n#define SCALAR_ARGS {scalar_args}\n"
    )
    return defines + shims + body + KERNEL_LAUNCH


def emulate_all(emulate, jobs: list, tmp: Path) -> list:
    """``emulate(*job, folder)`` for every job, two at a time (each a g++ build and a run)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda n: emulate(*jobs[n], tmp / str(n)), range(len(jobs))))


def swiglu_tolerance(ref: np.ndarray, dtype: str) -> np.ndarray:
    """How far a fused SwiGLU output may lie from the float64 reference. The gating is not
    exact in any precision: the kernel's f32 silu rounded to ``dtype`` once is within its
    unit roundoff of the reference (fp16 2^-11, bf16 2^-8 relative), plus the f32 silu's own
    few units of 2^-24, plus the type's subnormal spacing near 0."""
    return (UNIT_ROUNDOFF[dtype] + 2.0**-18) * np.abs(ref) + SUBNORMAL_SPACING[dtype]


def gelu_tolerance(ref: np.ndarray, z: np.ndarray, dtype: str) -> np.ndarray:
    """How far a fused bias + GELU output may lie from the float64 reference: the f32 GELU
    rounded to ``dtype`` once (its unit roundoff, relative), f32's erff/tanhf a few ulp of
    1 scaled by |z| where 1 + erf (tanh) cancels, and the type's subnormal spacing near 0."""
    return (
        (UNIT_ROUNDOFF[dtype] + 2.0**-18) * np.abs(ref)
        + 2.0**-20 * (np.abs(z) + 1)
        + (SUBNORMAL_SPACING[dtype])
    )


def assert_outcomes_match(jobs: list, outcomes: list) -> None:
    """Every job's run ended well, wrote every element, and equals numpy's reference rounded
    to the workload's dtype (exact: see OPERAND_RANGE)."""
    for (workload, schedule), (code, stderr, c, ref) in zip(jobs, outcomes, strict=True):
        where = f"{workload.label()} {schedule.id}"
        assert code == 0, f"{where}: {stderr}"
        values = values_of(c)
        unwritten = int(np.isnan(values).sum())
        assert not unwritten, (
            f"{where}: {unwritten} elements NaN (never written, or computed from unwritten "
            "shared memory)"
        )
        if workload.op == "gemm_bias_gelu":
            # GELU's z is within a few units here (operands): |z| <= |ref| + 1 bounds it.
            tol = gelu_tolerance(ref, np.abs(ref) + 1, workload.dtype)
            bad = np.abs(values.astype(np.float64) - ref) > tol
            assert not bad.any(), f"{where}: {int(bad.sum())} outputs off the reference"
            continue
        if workload.op == "gemm_swiglu":
            tol = swiglu_tolerance(ref, workload.dtype)
            bad = np.abs(values.astype(np.float64) - ref) > tol
            assert not bad.any(), f"{where}: {int(bad.sum())} outputs off the reference"
            continue
        np.testing.assert_array_equal(values, rounded(ref, workload.dtype), err_msg=where)
