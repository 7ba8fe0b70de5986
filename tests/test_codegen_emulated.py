"""The generated kernels, run on the CPU: g++ builds the real helpers and kernel body with
the PTX wrappers swapped for an emulation of their ISA semantics, and the results must
match numpy's matmul / convolution.

What the emulator checks (no GPU needed; skipped where no g++ is installed):
- one OS thread per CUDA thread; ``__syncthreads`` is a block barrier, ldmatrix and mma are
  warp-collective (lanes publish operands, meet at a warp barrier, and each lane builds its
  registers from everyone's operands exactly as the PTX ISA's fragment tables define them);
- cp.async is deferred: a copy lands only when its thread's ``cp.async.wait_group`` retires
  its group (the latest moment hardware may deliver it); shared memory starts as NaN;
- a race detector numbers the barrier intervals ("epochs"): a cp.async may not target a
  16-byte chunk that any thread read in the same epoch (write-after-read), and ldmatrix may
  read only chunks whose copy landed in an earlier epoch (read-after-write needs a barrier);
- every cp.async source lies inside A or B (and is 16-byte aligned), every shared address
  inside the dynamic allocation, and canaries around C catch out-of-bounds stores.

What it cannot check: timing, real bank conflicts, and the PTX encodings themselves (NVRTC
compiles those in test_compile_kernels.py).
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pipetune.model.space import Schedule
from pipetune.model.workloads import AnyWorkload, bmm, conv2d, conv3d, gemm
from pipetune.workers.codegen import generate, launch
from pipetune.workers.codegen.generator import source_parts

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")

SHIM = r"""
#include <climits>
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
static void next_epoch() { ++g_epoch; }

static Barrier* g_block = nullptr;
static std::vector<Barrier*> g_warps;
struct WarpShared { unsigned addr[32]; unsigned a[32][4]; unsigned b[32][2]; };
static std::vector<WarpShared> g_ws;

void __syncthreads() { g_block->wait(); }

static float h2f(unsigned short bits) { _Float16 h; std::memcpy(&h, &bits, 2); return (float)h; }
static unsigned short f2h(float f) {
  _Float16 h = (_Float16)f;  // round to nearest even, as cvt.rn
  unsigned short b;
  std::memcpy(&b, &h, 2);
  return b;
}

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

inline int lane_id() { return threadIdx.x & 31; }
inline WarpShared& ws() { return g_ws[threadIdx.x >> 5]; }
inline void warp_sync() { g_warps[threadIdx.x >> 5]->wait(); }

inline unsigned short smem_half(unsigned addr) {
  if (addr + 2 > g_smem_bytes) fail("ldmatrix reads past shared memory", addr, g_smem_bytes);
  unsigned short v; std::memcpy(&v, pt_smem + addr, 2); return v;
}

template <bool TRANS>
inline void ldmatrix(unsigned (&r)[4], unsigned addr) {
  const int l = lane_id();
  if (addr % 16) fail("ldmatrix row address not 16-byte aligned", addr, 0);
  {
    std::lock_guard<std::mutex> lk(g_track);
    if (g_landed[addr / 16] == INT_MIN || g_landed[addr / 16] >= g_epoch)
      fail("ldmatrix reads a chunk whose copy has not landed before a barrier", addr / 16, g_epoch);
    g_last_read[addr / 16] = g_epoch;
  }
  ws().addr[l] = addr;
  warp_sync();
  for (int q = 0; q < 4; ++q) {
    unsigned short lo, hi;
    if (!TRANS) {  // lane l: row l/4, columns 2(l%4), 2(l%4)+1 of matrix q
      const unsigned row = ws().addr[8 * q + l / 4];
      lo = smem_half(row + 2 * (2 * (l % 4)));
      hi = smem_half(row + 2 * (2 * (l % 4) + 1));
    } else {  // .trans: rows 2(l%4), 2(l%4)+1, column l/4
      lo = smem_half(ws().addr[8 * q + 2 * (l % 4)] + 2 * (l / 4));
      hi = smem_half(ws().addr[8 * q + 2 * (l % 4) + 1] + 2 * (l / 4));
    }
    r[q] = (unsigned)lo | ((unsigned)hi << 16);
  }
  warp_sync();
}
inline void ldmatrix_x4(unsigned (&r)[4], unsigned addr) { ldmatrix<false>(r, addr); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) { ldmatrix<true>(r, addr); }

// mma.m16n8k16.row.col f32.f16.f16.f32 with the ISA's fragment layouts
// (g = lane/4, t = lane%4): A a_i at row g + 8*((i/2)%2), col 2t + (i%2) + 8*(i/4);
// B b_i at k 2t + (i%2) + 8*(i/2), n g; C c_i at row g + 8*(i/2), col 2t + (i%2).
inline void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const int l = lane_id();
  WarpShared& s = ws();
  for (int i = 0; i < 4; ++i) s.a[l][i] = a[i];
  s.b[l][0] = b0; s.b[l][1] = b1;
  warp_sync();
  float A[16][16], B[16][8];
  for (int t = 0; t < 32; ++t) {
    const int g = t / 4, tg = t % 4;
    for (int i = 0; i < 8; ++i)
      A[g + 8 * ((i / 2) % 2)][2 * tg + (i % 2) + 8 * (i / 4)] =
          h2f((unsigned short)(s.a[t][i / 2] >> (16 * (i % 2))));
    for (int i = 0; i < 4; ++i)
      B[2 * tg + (i % 2) + 8 * (i / 2)][g] = h2f((unsigned short)(s.b[t][i / 2] >> (16 * (i % 2))));
  }
  for (int i = 0; i < 4; ++i) {
    const int row = l / 4 + 8 * (i / 2), col = 2 * (l % 4) + (i % 2);
    float sum = 0.f;
    for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
    d[i] += sum;
  }
  warp_sync();
}

inline unsigned pack_half2(float lo, float hi) {
  return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
}
}  // namespace pt
"""

MAIN = r"""
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
  std::memset(cp, 0, 2 * c_elems);
  gridDim = {grid_x, 1, grid_z};
  g_last_read.assign(g_smem_bytes / 16, INT_MIN);
  for (unsigned z = 0; z < grid_z; ++z)
    for (unsigned x = 0; x < grid_x; ++x) {
      for (unsigned i = 0; i < g_smem_bytes / 2; ++i) {  // NaN fill: unwritten reads show
        const unsigned short nan = 0x7E00;
        std::memcpy(pt_smem + 2 * i, &nan, 2);
      }
      g_landed.assign(g_smem_bytes / 16, INT_MIN);
      g_last_read.assign(g_smem_bytes / 16, INT_MIN);
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
          blockIdx = {x, 0, z};
          pt::t_groups.clear();
          pt::t_open.clear();
          KERNEL((const __half*)ap, (const __half*)bp, (__half*)cp SCALAR_ARGS);
          if (!pt::t_open.empty() || !pt::t_groups.empty()) fail("copies in flight at exit", 0, 0);
        });
      for (auto& th : threads) th.join();
      for (Barrier* w : g_warps) delete w;
    }
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


def _harness_source(parts: dict[str, str], kernel_name: str, threads: int, nscalars: int) -> str:
    """A complete host program: the shim, the kernel's helpers and body, and main."""
    scalar_args = "".join(f", s[{i}]" for i in range(nscalars))
    defines = (
        f"#define NSCALARS {nscalars}\n#define THREADS_ {threads}\n"
        f"#define KERNEL {kernel_name}\n#define SCALAR_ARGS {scalar_args}\n"
    )
    return defines + SHIM + parts["helpers"] + parts["kernel"] + MAIN


def _reference(workload: AnyWorkload, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The operator computed with numpy in float32 (an independent im2col for convs)."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    op = workload.op
    if op == "gemm":
        return a32 @ (b32 if workload.b_layout == "kn" else b32.T)
    if op == "bmm":
        return a32 @ b32
    w = workload
    spatial = 2 if op == "conv2d" else 3
    pad = [(0, 0), *[(w.pad, w.pad)] * spatial, (0, 0)]
    x = np.pad(a32, pad)
    filt = (w.r, w.s) if spatial == 2 else (w.t, w.r, w.s)
    out = w.out_hw if spatial == 2 else w.out_dhw
    y = np.zeros((w.n, *out, w.k), dtype=np.float32)
    for offs in np.ndindex(*filt):
        steps = (
            slice(f, f + w.stride * (o - 1) + 1, w.stride) for f, o in zip(offs, out, strict=True)
        )
        window = x[(slice(None), *steps)]
        y += window @ b32[(slice(None), *offs)].T
    return y


def _operands(workload: AnyWorkload, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    w = workload
    if w.op == "gemm":
        a_shape = (w.m, w.k)
        b_shape = (w.k, w.n) if w.b_layout == "kn" else (w.n, w.k)
    elif w.op == "bmm":
        a_shape, b_shape = (w.b, w.m, w.k), (w.b, w.k, w.n)
    elif w.op == "conv2d":
        a_shape, b_shape = (w.n, w.h, w.w, w.c), (w.k, w.r, w.s, w.c)
    else:
        a_shape, b_shape = (w.n, w.d, w.h, w.w, w.c), (w.k, w.t, w.r, w.s, w.c)
    a = rng.standard_normal(a_shape).astype(np.float16)
    b = rng.standard_normal(b_shape).astype(np.float16)
    return a, b


def _emulate(workload: AnyWorkload, schedule: Schedule, tmp: Path, mutate=None):
    """Build and run the emulator; (returncode, stderr, C or None, reference)."""
    kernel = generate(workload, schedule)
    parts = dict(source_parts(kernel.variant, schedule))
    if mutate is not None:
        old, new = mutate
        assert old in parts["kernel"]
        parts["kernel"] = parts["kernel"].replace(old, new)
    grid, scalars = launch(kernel, workload)
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / "harness.cpp"
    src.write_text(_harness_source(parts, kernel.name, kernel.threads, len(scalars)))
    exe = tmp / "harness"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-pthread", "-w", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr[:4000]
    a, b = _operands(workload, np.random.default_rng(7))
    ref = _reference(workload, a, b)
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
            str(kernel.smem_bytes),
            *map(str, scalars),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    c = None
    if run.returncode == 0:
        c = np.fromfile(tmp / "c.bin", dtype=np.float16).reshape(ref.shape)
    return run.returncode, run.stderr, c, ref


def _s(*knobs: int) -> Schedule:
    return Schedule(*knobs)


# (workload, schedules): small problems with tails in M, N and K, and schedules of up to
# four warps over every smem_stages value, both reg_stages, every chunk and both B layouts.
CASES = [
    (
        gemm(70, 40, 200),
        [
            _s(1, 1, 1, 1, 1, 1, 1),
            _s(2, 1, 1, 2, 1, 3, 2),  # odd k-steps with register double buffering
            _s(1, 1, 4, 4, 2, 3, 2),  # the largest warp tile
            _s(2, 2, 1, 1, 1, 6, 2),  # six stages, wrapping around the ring
            _s(1, 2, 2, 1, 8, 2, 2),  # BK = 128 > K tail
        ],
    ),
    (
        gemm(33, 48, 72, b_layout="nk"),
        [_s(1, 1, 2, 2, 2, 4, 1), _s(2, 2, 1, 1, 4, 2, 2), _s(1, 2, 1, 1, 1, 5, 2)],
    ),
    (bmm(3, 20, 24, 40), [_s(1, 1, 1, 1, 1, 2, 2), _s(2, 1, 1, 1, 2, 1, 2)]),
    (
        conv2d(2, 7, 6, 16, 24, 3, 3, stride=2, pad=1),
        [_s(1, 1, 1, 1, 2, 3, 2), _s(2, 1, 1, 2, 4, 2, 1), _s(1, 1, 2, 1, 1, 6, 2)],
    ),
    (conv3d(1, 4, 5, 5, 8, 16, 3, 3, 3, pad=1), [_s(2, 1, 1, 1, 2, 4, 2)]),
    (conv3d(2, 5, 6, 4, 8, 16, 3, 3, 2, stride=2, pad=1), [_s(1, 1, 2, 1, 1, 1, 1)]),
]


def test_emulated_kernels_match_numpy(tmp_path):
    jobs = [(w, s) for w, schedules in CASES for s in schedules]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(
            pool.map(lambda job: _emulate(job[1][0], job[1][1], tmp_path / str(job[0])),
                     enumerate(jobs))
        )  # fmt: skip
    for (workload, schedule), (code, stderr, c, ref) in zip(jobs, outcomes, strict=True):
        where = f"{workload.label()} {schedule.id}"
        assert code == 0, f"{where}: {stderr}"
        assert not np.isnan(c).any(), f"{where}: read unwritten shared memory"
        np.testing.assert_allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2, err_msg=where)


@pytest.mark.parametrize(
    ("mutation", "symptom"),
    [
        # One group too few retired before crossing to the next tile.
        (("cp_async_wait<STAGES - 2>();  // tile kt+1 has landed",
          "cp_async_wait<STAGES - 1>();"), "not landed"),
        # The next tile's copies written into the stage being read.
        (("return read_stage == 0 ? STAGES - 1 : read_stage - 1;",
          "return read_stage;"), "write-after-read"),
        # The two n8 halves of the B fragment swapped.
        (("fb[buf][j][0], fb[buf][j][1]", "fb[buf][j][1], fb[buf][j][0]"), "wrong result"),
    ],
)  # fmt: skip
def test_emulator_catches_broken_kernels(tmp_path, mutation, symptom):
    """The emulator is only evidence if it fails broken kernels: break one on purpose."""
    code, stderr, c, ref = _emulate(gemm(70, 40, 88), _s(2, 1, 1, 2, 2, 3, 2), tmp_path, mutation)
    if symptom == "wrong result":
        assert code == 0, stderr
        assert not np.allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2)
    else:
        assert code == 3
        assert symptom in stderr
