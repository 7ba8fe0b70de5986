"""A CPU emulator of generated CUDA kernels: g++ builds a kernel's real helpers and body with
its PTX wrappers swapped for emulations of their ISA semantics (tests/test_codegen_emulated.py
for the mma.sync family, tests/test_wgmma_emulated.py for the wgmma probe).

The common part (``COMMON_SHIM``, ``MAIN``):
- one OS thread per CUDA thread; ``__syncthreads`` is a block barrier;
- cp.async is deferred: a copy lands only when its thread's ``cp.async.wait_group`` retires
  its group (the latest moment hardware may deliver it); shared memory starts as NaN;
- a race detector numbers the barrier intervals ("epochs"): a cp.async may not target a
  16-byte chunk that any thread read in the same epoch, nor one that an asynchronous MMA in
  flight reads (write-after-read); readers may read only chunks whose copy landed in an
  earlier epoch (read-after-write needs a barrier);
- every cp.async source lies inside A or B (and is 16-byte aligned), every shared address
  inside the dynamic allocation, and canaries around C catch out-of-bounds stores.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pipetune.model.workloads import SWIGLU_INTERLEAVE, AnyWorkload

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

COMMON_SHIM = (
    r"""
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct __half { unsigned short bits; };

alignas(128) unsigned char pt_smem[1 << 18];
static unsigned g_smem_bytes = 0;
static const unsigned char *g_a = nullptr, *g_b = nullptr;
static size_t g_a_bytes = 0, g_b_bytes = 0;

[[noreturn]] static void fail(const char* what, long a, long b) {
  std::fprintf(stderr, "EMULATOR: %s (%ld, %ld) block (%u,%u) thread %u\n", what, a, b,
               blockIdx.x, blockIdx.z, threadIdx.x);
  std::fflush(stderr);
  // _Exit, not exit: the other threads are still running, and exit() would destroy the
  // globals they use under them (a segfault instead of the verdict, now and then).
  std::_Exit(3);
}

struct Barrier {
  std::mutex m;
  std::condition_variable cv;
  int count, waiting = 0;
  unsigned long gen = 0;
  void (*on_release)() = nullptr;
  explicit Barrier(int n) : count(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m);
    unsigned long g = gen;
    if (++waiting == count) {
      waiting = 0;
      if (on_release) on_release();
      ++gen;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return gen != g; });
    }
  }
};

// Race detector state, per 16-byte shared-memory chunk.
static std::mutex g_track;
static int g_epoch = 0;
static std::vector<int> g_last_read, g_landed;
// Asynchronous reads in flight per chunk (wgmma issued, not yet retired by its wait_group).
static std::vector<int> g_pending;
static void next_epoch() { ++g_epoch; }

static Barrier* g_block = nullptr;
static std::vector<Barrier*> g_warps;
struct WarpShared { unsigned addr[32]; unsigned a[32][4]; unsigned b[32][2]; };
static std::vector<WarpShared> g_ws;

void __syncthreads() { g_block->wait(); }

"""
    + HALF_CONVERSIONS
    + r"""
namespace pt {
inline unsigned smem_u32(const void* p) {
  return (unsigned)((const unsigned char*)p - pt_smem);
}
inline void opaque(int&) {}

struct Copy { unsigned dst; unsigned char data[16]; };
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
  return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
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

MAIN = (
    READ_FILE
    + r"""
// Kernel arguments after the scalars (the TMA loader's tensor maps), and set-up that needs
// the operands (filling those maps): empty unless a shim defines them.
#ifndef EXTRA_ARGS
#define EXTRA_ARGS
#endif
#ifndef BEFORE_LAUNCH
#define BEFORE_LAUNCH
#endif
// Run after every block of the kernel (a second kernel: split-K's reduction).
#ifndef AFTER_LAUNCH
#define AFTER_LAUNCH
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
int main(int argc, char** argv) {
  // argv: a.bin b.bin c.bin c_elems grid_x grid_z smem_bytes scalars...
  if (argc < 8 + NSCALARS) fail("usage", argc, 0);
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
  int s[NSCALARS];
  for (int i = 0; i < NSCALARS; ++i) s[i] = std::atoi(argv[8 + i]);
  const size_t canary = 4096;
  std::vector<unsigned char> c(2 * canary + 2 * c_elems + 16, 0xAB);
  unsigned char* cp = c.data() + canary;
  cp += (16 - (uintptr_t)cp % 16) % 16;
  for (long i = 0; i < c_elems; ++i) {  // NaN fill: an element no thread writes shows
    const unsigned short nan = 0x7E00;
    std::memcpy(cp + 2 * i, &nan, 2);
  }
  gridDim = {grid_x, GRID_Y, grid_z};
  BEFORE_LAUNCH
  g_last_read.assign(g_smem_bytes / 16, INT_MIN);
  for (unsigned z = 0; z < grid_z; ++z)
   for (unsigned y = 0; y < GRID_Y; ++y)
    for (unsigned xi = 0; xi < grid_x; ++xi) {
      const unsigned x = BLOCKS_REVERSED ? grid_x - 1 - xi : xi;
      for (unsigned i = 0; i < g_smem_bytes / 2; ++i) {  // NaN fill: unwritten reads show
        const unsigned short nan = 0x7E00;
        std::memcpy(pt_smem + 2 * i, &nan, 2);
      }
      g_landed.assign(g_smem_bytes / 16, INT_MIN);
      g_last_read.assign(g_smem_bytes / 16, INT_MIN);
      g_pending.assign(g_smem_bytes / 16, 0);
      g_epoch = 0;
      Barrier block(THREADS_);
      block.on_release = next_epoch;
      g_block = &block;
      g_warps.clear();
      for (int w = 0; w < THREADS_ / 32; ++w) g_warps.push_back(new Barrier(32));
      g_ws.assign(THREADS_ / 32, WarpShared{});
      std::vector<std::thread> threads;
      for (int t = 0; t < THREADS_; ++t)
        threads.emplace_back([&, t] {
          threadIdx = {(unsigned)t, 0, 0};
          blockIdx = {x, y, z};
          pt::t_groups.clear();
          pt::t_open.clear();
          KERNEL((const __half*)ap, (const __half*)bp, (__half*)cp SCALAR_ARGS EXTRA_ARGS);
          if (!pt::t_open.empty() || !pt::t_groups.empty()) fail("copies in flight at exit", 0, 0);
        });
      for (auto& th : threads) th.join();
      for (Barrier* w : g_warps) delete w;
    }
  AFTER_LAUNCH
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


def reference(workload: AnyWorkload, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The operator computed with numpy in float64 (an independent im2col for convs)."""
    a32, b32 = a.astype(np.float64), b.astype(np.float64)
    op = workload.op
    if op == "gemm":
        return a32 @ (b32 if workload.b_layout == "kn" else b32.T)
    if op == "gemm_swiglu":
        # Both projections, then the gate's and up's columns out of their groups of 8.
        product = a32 @ (b32 if workload.b_layout == "kn" else b32.T)
        groups = product.reshape(workload.m, -1, 2, SWIGLU_INTERLEAVE)
        gate = groups[:, :, 0, :].reshape(workload.m, -1)
        up = groups[:, :, 1, :].reshape(workload.m, -1)
        e = np.exp(-np.abs(gate))  # no overflow: exp of -|gate| only
        return gate * np.where(gate >= 0, 1 / (1 + e), e / (1 + e)) * up
    if op == "bmm":
        return a32 @ b32
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


# Operands are small integers stored as fp16: every product and partial sum is then an
# integer far below 2^24, exact in fp32 in any order of accumulation (split-K and stream-K
# included), so the one rounding left is the kernel's final store to fp16 and C must equal
# the reference rounded to fp16 exactly. With normal draws and a tolerance, a wrong rounding
# mode in the epilogue, or a lost partial on a small K, could pass.
OPERAND_RANGE = (-8, 8)


def operands(workload: AnyWorkload, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    w = workload
    if w.op == "gemm":
        a_shape = (w.m, w.k)
        b_shape = (w.k, w.n) if w.b_layout == "kn" else (w.n, w.k)
    elif w.op == "gemm_swiglu":
        a_shape = (w.m, w.k)
        b_shape = (w.k, 2 * w.n) if w.b_layout == "kn" else (2 * w.n, w.k)
    elif w.op == "bmm":
        a_shape, b_shape = (w.b, w.m, w.k), (w.b, w.k, w.n)
    elif w.op == "conv2d":
        a_shape, b_shape = (w.n, w.h, w.w, w.c), (w.k, w.r, w.s, w.c)
    else:
        a_shape, b_shape = (w.n, w.d, w.h, w.w, w.c), (w.k, w.t, w.r, w.s, w.c)
    low, high = OPERAND_RANGE
    a = rng.integers(low, high + 1, a_shape).astype(np.float16)
    b = rng.integers(low, high + 1, b_shape).astype(np.float16)
    if w.op == "gemm_swiglu":
        # silu(gate)·up of such sums would overflow fp16 (|y| to 1e5): eighths in [-1/4, 1/4]
        # instead, still exact products and sums, gates of a few units where silu bends.
        a = (rng.integers(-2, 3, a_shape) / 8).astype(np.float16)
        b = (rng.integers(-2, 3, b_shape) / 8).astype(np.float16)
    return a, b


def build_harness(source: str, tmp: Path) -> Path:
    """Compile a harness program with g++ in ``tmp``; the executable's path."""
    tmp.mkdir(parents=True, exist_ok=True)
    src, exe = tmp / "harness.cpp", tmp / "harness"
    src.write_text(source)
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-pthread", "-w", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr[:4000]
    return exe


def build_and_run(
    source: str,
    tmp: Path,
    workload: AnyWorkload,
    grid: tuple[int, int, int],
    smem_bytes: int,
    scalars: tuple[int, ...],
) -> tuple[int, str, np.ndarray | None, np.ndarray]:
    """Build a harness (``source``: defines, shims, the kernel, MAIN) and run it on seeded
    random operands of ``workload``: (returncode, stderr, C or None, numpy's reference)."""
    exe = build_harness(source, tmp)
    a, b = operands(workload, np.random.default_rng(7))
    ref = reference(workload, a, b)
    a.tofile(tmp / "a.bin")
    b.tofile(tmp / "b.bin")
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
        c = np.fromfile(tmp / "c.bin", dtype=np.float16).reshape(ref.shape)
    return run.returncode, run.stderr, c, ref


def harness_source(shims: str, body: str, kernel_name: str, threads: int, nscalars: int) -> str:
    """A complete host program: the defines MAIN needs, the shims, the kernel, MAIN."""
    scalar_args = "".join(f", s[{i}]" for i in range(nscalars))
    defines = (
        f"#define NSCALARS {nscalars}\n#define THREADS_ {threads}\n"
        f"#define KERNEL {kernel_name}\n#define SCALAR_ARGS {scalar_args}\n"
    )
    return defines + shims + body + MAIN


def emulate_all(emulate, jobs: list, tmp: Path) -> list:
    """``emulate(*job, folder)`` for every job, two at a time (each a g++ build and a run)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda n: emulate(*jobs[n], tmp / str(n)), range(len(jobs))))


def assert_outcomes_match(jobs: list, outcomes: list) -> None:
    """Every job's run ended well, wrote every element, and equals numpy's reference rounded
    to fp16 (exact: see OPERAND_RANGE)."""
    for (workload, schedule), (code, stderr, c, ref) in zip(jobs, outcomes, strict=True):
        where = f"{workload.label()} {schedule.id}"
        assert code == 0, f"{where}: {stderr}"
        unwritten = int(np.isnan(c).sum())
        assert not unwritten, (
            f"{where}: {unwritten} elements NaN (never written, or computed from unwritten "
            "shared memory)"
        )
        if workload.op == "gemm_swiglu":
            # The gating is not exact in any precision: the kernel's f32 silu rounded to fp16
            # once is within half an fp16 unit of the float64 reference (2^-11 relative), plus
            # the f32 silu's own few units of 2^-24, plus fp16's subnormal spacing near 0.
            tol = (2.0**-11 + 2.0**-18) * np.abs(ref) + 2.0**-24
            bad = np.abs(c.astype(np.float64) - ref) > tol
            assert not bad.any(), f"{where}: {int(bad.sum())} outputs off the reference"
            continue
        np.testing.assert_array_equal(c, ref.astype(np.float16), err_msg=where)
