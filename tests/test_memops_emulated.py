"""The memory-intensive kernels, run on the CPU: g++ builds the generated helpers,
reductions and kernel entries with the device layer (conversions, loads and stores, shared
memory, shuffles, barriers, fences, atomics) emulated, and the output must match the
numpy reference within the tolerance the GPU check uses (workers/runners/memops_reference).

What the emulator checks (no GPU needed; skipped where no g++ is installed):
- one OS thread per CUDA thread, and the grid run in waves of resident blocks: at most
  SMs × blocks per SM of a small emulated GPU at once, the wave the launch plan assumed, so a
  fused split (blocks that wait for their row's other blocks) runs as it must on a GPU, and
  a plan that relied on more co-residency than one wave would hang (the test times out);
- ``__syncthreads`` is a block barrier; a shuffle is warp-collective (the 32 lanes meet at
  a warp barrier and read each other's values, width and xor mask as the PTX ISA defines);
- every global load and store is checked against its buffer (inside, aligned to its
  vector), shared memory starts as NaN and every access is range-checked, canaries around
  the output catch stray stores, and outputs start as NaN (an unwritten one fails);
- a race detector numbers the block's barrier intervals ("epochs"): a shared-memory half
  may not be read or written in the epoch another thread wrote it, nor written in the
  epoch another thread read it (a missing barrier is a deterministic failure, not luck);
- the workspace starts as the runner leaves it: counters zero, partials arbitrary (here
  NaN, so a block that reads a partial before it was written, a join that does not wait,
  produces NaN); after the run every counter must be zero again, which is all a second run
  on the same workspace needs.

Element types: a kernel's h2f, f2h and pack2 are emulated as its own PTX wrappers declare
them (``conversion_defines``: fp16's cvt, or bf16's shift and cvt), each read from its own
instruction, and the operands are stored and the output read in the workload's dtype (bf16
as uint16 bits, as workers/runners/elements.py holds them): a bf16 kernel with one of fp16's
conversions computes garbage here, as it would on hardware.

What it cannot check: timing, real memory ordering (the emulator's atomics and fences are
sequentially consistent), and the PTX encodings (NVRTC compiles those in
test_memops_compile.py).
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_emulator import (
    BARRIER,
    BF16_CONVERSIONS,
    HALF_CONVERSIONS,
    NAN_BITS,
    READ_FILE,
    build_harness,
)

from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import KNOBS, MemSchedule, MemSpace, schedule_problems
from pipetune.model.memops.workloads import (
    MemWorkload,
    bias_gelu,
    layernorm,
    parse_mem_workload,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.workers.codegen.cuda_text import ELEMENTS
from pipetune.workers.codegen.memops import generate, launch_plan, source_parts
from pipetune.workers.codegen.memops.sample import covering_sample
from pipetune.workers.runners.elements import storage, widen
from pipetune.workers.runners.memops_reference import check, make_inputs, reference

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")

# A small GPU for the emulator: 2 SMs of at most 4 blocks and 1024 threads each, so a wave
# is at most 2048 OS threads, and the spaces (validity, wave bounds, fused splitting's
# one-wave grid) are those of this GPU.
EMU_GPU = replace(
    get_gpu("h100", calibrated=False),
    key="emulated",
    sm_count=2,
    max_blocks_per_sm=4,
    max_threads_per_sm=1024,
)

SHIM = (
    r"""
#include <math.h>
#include <pthread.h>
#include <cmath>
#include <sched.h>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };
// The conversions the kernel's own PTX wrappers declare (conversion_defines): 1 for bf16's.
#ifndef PT_H2F_BF16
#define PT_H2F_BF16 0
#endif
#ifndef PT_F2H_BF16
#define PT_F2H_BF16 0
#endif
#ifndef PT_PACK2_BF16
#define PT_PACK2_BF16 0
#endif
// The kernel's pointer type (its storage struct) and the NaN that y and shared memory start
// as, in the workload's element type (emulate sets both).
#ifndef PT_ELEM
#define PT_ELEM __half
#endif
#ifndef PT_NAN_BITS
#define PT_NAN_BITS 0x7E00
#endif

// The state and checks that the kernel (its translation unit) and MAIN (the runtime's, built
// once per element type: build_harness's ``runtime``) share: inline, one entity in both.
[[noreturn]] inline void fail(const char* what, long a, long b);

"""
    + BARRIER
    + r"""
struct WarpSlots { float f[32]; int i[32]; };
// Race detector, per 2-byte unit of shared memory: the epoch (barrier interval) and thread
// of the last write and of the last read (-1: several readers).
struct WordTrack { int w_epoch = -1, w_thread = -1, r_epoch = -1, r_thread = -1; };
struct BlockCtx {
  unsigned block = 0;
  int epoch = 0;
  Barrier* bar = nullptr;
  std::vector<Barrier*> warps;
  std::vector<WarpSlots> slots;
  std::vector<unsigned char> smem;
  int smem_bytes = 0;  // the launch's dynamic shared memory (smem holds at least 16 bytes)
  std::vector<WordTrack> track;
  std::mutex track_m;
};
inline thread_local BlockCtx* t_ctx = nullptr;
inline thread_local int t_tid = 0;
inline unsigned g_grid = 0;

// Buffers the kernels may touch: [begin, end), writable or not.
struct Region {
  const unsigned char* begin;
  const unsigned char* end;
  bool writable;
  const char* name;
};
inline std::vector<Region> g_regions;

[[noreturn]] inline void fail(const char* what, long a, long b) {
  std::fprintf(stderr, "EMULATOR: %s (%ld, %ld) block %u thread %d\n", what, a, b,
               t_ctx ? t_ctx->block : 0u, t_tid);
  std::fflush(stderr);
  std::_Exit(3);  // the other threads are running: no destructors under them
}

inline void check_access(const void* p, int bytes, bool write) {
  const unsigned char* c = (const unsigned char*)p;
  if ((uintptr_t)c % bytes)
    fail("global access not aligned to its vector", (long)((uintptr_t)c % bytes), bytes);
  for (const Region& r : g_regions)
    if (c >= r.begin && c + bytes <= r.end) {
      if (write && !r.writable) fail("store into an input buffer", (long)(c - r.begin), 0);
      return;
    }
  fail(write ? "store outside every buffer" : "load outside every buffer",
       (long)((uintptr_t)c % 4096), bytes);
}

"""
    + "namespace host {\n"  # both types' conversions, out of the kernel's (pt's) way
    + HALF_CONVERSIONS
    + BF16_CONVERSIONS
    + r"""}  // namespace host
namespace pt {
// The kernel's conversions, each as its PTX wrapper declares it (conversion_defines).
inline float h2f(unsigned short bits) { return PT_H2F_BF16 ? host::b2f(bits) : host::h2f(bits); }
inline unsigned short f2h(float f) { return PT_F2H_BF16 ? host::f2b(f) : host::f2h(f); }
inline unsigned pack2(float lo, float hi) {
  const unsigned short l = PT_PACK2_BF16 ? host::f2b(lo) : host::f2h(lo);
  const unsigned short h = PT_PACK2_BF16 ? host::f2b(hi) : host::f2h(hi);
  return (unsigned)l | ((unsigned)h << 16);
}

template <int V> inline void load_vec(const unsigned short* p, unsigned (&w)[(V + 1) / 2]) {
  check_access(p, 2 * V, false);
  if (V == 1) { w[0] = *p; } else { std::memcpy(w, p, 2 * V); }
}
template <int V> inline void store_vec(unsigned short* p, const unsigned (&w)[(V + 1) / 2]) {
  check_access(p, 2 * V, true);
  if (V == 1) { *p = (unsigned short)w[0]; } else { std::memcpy(p, w, 2 * V); }
}
inline unsigned char* smem_base() { return t_ctx->smem.data(); }
// Range, alignment and race checks of one shared-memory access of `bytes` at `off`.
inline void smem_access(int off, int bytes, bool write) {
  BlockCtx& c = *t_ctx;
  if (off < 0 || off % (bytes < 4 ? bytes : 4) || off + bytes > (int)c.smem.size())
    fail(write ? "shared store out of range" : "shared load out of range", off, c.smem.size());
  std::lock_guard<std::mutex> lk(c.track_m);
  const int e = __atomic_load_n(&c.epoch, __ATOMIC_SEQ_CST);
  for (int word = off / 2; word <= (off + bytes - 1) / 2; ++word) {
    WordTrack& t = c.track[word];
    if (t.w_epoch == e && t.w_thread != t_tid)
      fail(write ? "write-after-write race on shared memory"
                 : "read-after-write race on shared memory (no barrier between)",
           word, t.w_thread);
    if (write) {
      if (t.r_epoch == e && t.r_thread != t_tid)
        fail("write-after-read race on shared memory", word, t.r_thread);
      t.w_epoch = e; t.w_thread = t_tid;
    } else {
      t.r_thread = (t.r_epoch == e && t.r_thread != t_tid) ? -1 : t_tid;
      t.r_epoch = e;
    }
  }
}
template <int V>
inline void smem_store_vec(unsigned char* sm, int off, const unsigned (&w)[(V + 1) / 2]) {
  smem_access(off, 2 * V, true);
  std::memcpy(sm + off, w, 2 * V);
}
template <int V>
inline void smem_load_vec(const unsigned char* sm, int off, unsigned (&w)[(V + 1) / 2]) {
  smem_access(off, 2 * V, false);
  w[0] = 0;
  std::memcpy(w, sm + off, 2 * V);
}
inline void smem_store_f32(unsigned char* sm, int off, float v) {
  smem_access(off, 4, true);
  std::memcpy(sm + off, &v, 4);
}
inline float smem_load_f32(const unsigned char* sm, int off) {
  smem_access(off, 4, false);
  float v;
  std::memcpy(&v, sm + off, 4);
  return v;
}
inline void warp_sync() { t_ctx->warps[t_tid >> 5]->wait(); }
inline float shfl_xor(float v, int mask, int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) || mask >= width)
    fail("shuffle width/mask", width, mask);
  WarpSlots& s = t_ctx->slots[t_tid >> 5];
  const int lane = t_tid & 31;
  s.f[lane] = v;
  warp_sync();
  const float out = s.f[lane ^ mask];
  warp_sync();
  return out;
}
inline float shfl_xor32(float v, int mask) { return shfl_xor(v, mask, 32); }
inline int shfl_first(int v) {
  WarpSlots& s = t_ctx->slots[t_tid >> 5];
  s.i[t_tid & 31] = v;
  warp_sync();
  const int out = s.i[0];
  warp_sync();
  return out;
}
inline void block_sync() { t_ctx->bar->wait(); }
inline void fence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline int atomic_add(int* p, int v) {
  check_access(p, 4, true);
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline int load_volatile(const int* p) {
  check_access(p, 4, false);
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
inline void store_volatile(int* p, int v) {
  check_access(p, 4, true);
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
inline float load_partial(const float* p) {
  check_access(p, 4, false);
  float v;
  __atomic_load(p, &v, __ATOMIC_SEQ_CST);
  return v;
}
inline void store_partial(float* p, float v) {
  check_access(p, 4, true);
  __atomic_store(p, &v, __ATOMIC_SEQ_CST);
}
inline void spin_pause() { sched_yield(); }
inline void compiler_fence() {}
template <int W> inline void opaque(unsigned (&)[W]) {}
inline int dynamic_smem_bytes() { return t_ctx->smem_bytes; }
inline void trap() { fail("trap: the kernel refused the launch", t_ctx->block, t_tid); }
inline int thread_index() { return t_tid; }
inline int block_index() { return (int)t_ctx->block; }
inline int grid_size() { return (int)g_grid; }
}  // namespace pt

typedef void (*Entry)(const PT_ELEM*, const PT_ELEM*, const PT_ELEM*, PT_ELEM*, float*, int,
                      int, float, float, int);
"""
)

MAIN = (
    READ_FILE
    + r"""
// 16-byte aligned copy with canaries (0xAB) around it.
struct Guarded {
  std::vector<unsigned char> raw;
  unsigned char* p = nullptr;
  size_t bytes = 0;
  static const size_t kCanary = 4096;
  void init(size_t n) {
    bytes = n;
    raw.assign(2 * kCanary + n + 16, 0xAB);
    p = raw.data() + kCanary;
    p += (16 - (uintptr_t)p % 16) % 16;
  }
  void canaries(const char* what) const {
    for (size_t i = 0; i < raw.size(); ++i) {
      const unsigned char* q = raw.data() + i;
      if ((q < p || q >= p + bytes) && *q != 0xAB) fail(what, (long)(q - p), 0);
    }
  }
};

// The kernel's entries, KERNEL0 and KERNEL1, as its translation unit lists them (ENTRIES).
extern const Entry pt_entries[2];

// One launch: `wave` block slots of `threads` OS threads each (created once per launch);
// slot b runs blocks b, b + wave, ... in turn, all of its threads together.
struct Slot {
  BlockCtx ctx;
  Barrier* turn = nullptr;  // the slot's threads switch blocks together
  int smem_bytes = 0;
};
struct ThreadArg { Slot* slot; unsigned first; unsigned wave; int tid; Entry entry;
                   const PT_ELEM *x, *p0, *p1; PT_ELEM* y; float* ws; int rows, cols; float eps;
                   float scale; int queries; };

static void reset_block(BlockCtx& c, unsigned block, int smem_bytes) {
  c.block = block;
  __atomic_store_n(&c.epoch, 0, __ATOMIC_SEQ_CST);
  c.smem.assign(smem_bytes > 0 ? smem_bytes : 16, 0);
  c.smem_bytes = smem_bytes;
  for (size_t i = 0; i + 1 < c.smem.size(); i += 2) {  // NaN halves: unwritten reads show
    c.smem[i] = PT_NAN_BITS & 0xFF;
    c.smem[i + 1] = PT_NAN_BITS >> 8;
  }
  c.track.assign(c.smem.size() / 2 + 1, WordTrack{});
}

static void* thread_main(void* a) {
  ThreadArg* t = (ThreadArg*)a;
  t_ctx = &t->slot->ctx;
  t_tid = t->tid;
  for (unsigned block = t->first; block < g_grid; block += t->wave) {
    t->slot->turn->wait();
    if (t->tid == 0) reset_block(t->slot->ctx, block, t->slot->smem_bytes);
    t->slot->turn->wait();
    t->entry(t->x, t->p0, t->p1, t->y, t->ws, t->rows, t->cols, t->eps, t->scale, t->queries);
  }
  return nullptr;
}

static void run_launch(Entry entry, unsigned grid, int threads, int smem_bytes, unsigned wave,
                       const PT_ELEM* x, const PT_ELEM* p0, const PT_ELEM* p1, PT_ELEM* y,
                       float* ws, int rows, int cols, float eps, float scale, int queries) {
  g_grid = grid;
  const unsigned slots = grid < wave ? grid : wave;
  std::vector<Slot> slot(slots);
  std::vector<ThreadArg> args(slots * threads);
  std::vector<pthread_t> ids(slots * threads);
  for (unsigned b = 0; b < slots; ++b) {
    BlockCtx& c = slot[b].ctx;
    c.bar = new Barrier(threads, &c.epoch);
    for (int w = 0; w < (threads + 31) / 32; ++w) c.warps.push_back(new Barrier(32));
    c.slots.assign((threads + 31) / 32, WarpSlots{});
    slot[b].turn = new Barrier(threads);
    slot[b].smem_bytes = smem_bytes;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 128 * 1024);
  for (unsigned b = 0; b < slots; ++b)
    for (int t = 0; t < threads; ++t) {
      ThreadArg& a = args[b * threads + t];
      a = ThreadArg{&slot[b], b, wave, t, entry, x, p0, p1, y, ws, rows, cols, eps, scale,
                    queries};
      if (pthread_create(&ids[b * threads + t], &attr, thread_main, &a))
        fail("pthread_create", b, t);
    }
  for (auto& id : ids) pthread_join(id, nullptr);
  for (Slot& s : slot) {
    delete s.turn;
    delete s.ctx.bar;
    for (Barrier* w : s.ctx.warps) delete w;
  }
}

int main(int argc, char** argv) {
  // argv: x.bin p0.bin p1.bin y.bin y_elems ws_floats counters_offset wave rows cols eps
  //       scale queries runs n_launches, then per launch: entry grid threads smem
  if (argc < 16) fail("usage", argc, 0);
  std::vector<unsigned char> xin = read_file(argv[1]), p0in = read_file(argv[2]),
                             p1in = read_file(argv[3]);
  const long y_elems = std::atol(argv[5]);
  const long ws_floats = std::atol(argv[6]);
  const long counters = std::atol(argv[7]);
  const unsigned wave = (unsigned)std::atol(argv[8]);
  const int rows = std::atoi(argv[9]), cols = std::atoi(argv[10]);
  const float eps = (float)std::atof(argv[11]);
  const float scale = (float)std::atof(argv[12]);
  const int queries = std::atoi(argv[13]);
  const int runs = std::atoi(argv[14]);
  const int n_launch = std::atoi(argv[15]);
  Guarded x, p0, p1, y, ws;
  x.init(xin.size()); std::memcpy(x.p, xin.data(), xin.size());
  p0.init(p0in.size()); std::memcpy(p0.p, p0in.data(), p0in.size());
  p1.init(p1in.size()); std::memcpy(p1.p, p1in.data(), p1in.size());
  y.init(2 * y_elems);
  ws.init(4 * ws_floats);
  std::memset(ws.p, 0, 4 * ws_floats);
  g_regions = {{x.p, x.p + x.bytes, false, "x"}, {p0.p, p0.p + p0.bytes, false, "p0"},
               {p1.p, p1.p + p1.bytes, false, "p1"}, {y.p, y.p + y.bytes, true, "y"},
               {ws.p, ws.p + ws.bytes, true, "ws"}};
  const Entry* entries = pt_entries;
  for (int rep = 0; rep < runs; ++rep) {
    for (long i = 0; i < y_elems; ++i) {
      y.p[2 * i] = PT_NAN_BITS & 0xFF;
      y.p[2 * i + 1] = PT_NAN_BITS >> 8;
    }
    // Partials are scratch (only the counters must stay zero): poison them, so a block
    // that reads a partial before its writer published it reads NaN.
    for (long i = 0; i < counters && i < ws_floats; ++i) ((float*)ws.p)[i] = NAN;
    for (int l = 0; l < n_launch; ++l) {
      const char** a = (const char**)argv + 16 + 4 * l;
      run_launch(entries[std::atoi(a[0])], (unsigned)std::atol(a[1]), std::atoi(a[2]),
                 std::atoi(a[3]), wave,
                 (const PT_ELEM*)x.p, (const PT_ELEM*)p0.p, (const PT_ELEM*)p1.p,
                 (PT_ELEM*)y.p, (float*)ws.p, rows, cols, eps, scale, queries);
    }
  }
  x.canaries("store around x");
  y.canaries("store outside y");
  ws.canaries("store outside the workspace");
  const int* cnt = (const int*)(ws.p + 4 * counters);
  for (long i = 0; counters < ws_floats && i < ws_floats - counters; ++i)
    if (cnt[i]) fail("a row counter was left non-zero", i, cnt[i]);
  FILE* f = std::fopen(argv[4], "wb");
  std::fwrite(y.p, 2, y_elems, f);
  std::fclose(f);
  std::puts("OK");
  return 0;
}
"""
)


# The conversions a kernel's PTX wrappers may declare, each read from its own instruction (no
# text is part of another), and whether it is bf16's: the shim converts as the kernel says.
_CONVERSIONS: dict[str, dict[str, int]] = {
    "PT_H2F_BF16": {'asm("cvt.f32.f16 ': 0, "__uint_as_float(": 1},
    "PT_F2H_BF16": {'asm("cvt.rn.f16.f32 ': 0, 'asm("cvt.rn.bf16.f32 ': 1},
    "PT_PACK2_BF16": {'asm("cvt.rn.f16x2.f32 ': 0, 'asm("cvt.rn.bf16x2.f32 ': 1},
}


def conversion_defines(device: str) -> str:
    """``#define``s for SHIM: the conversions that a kernel's own device text (its PTX
    wrappers, which the shim replaces) declares, not the workload's type, so that a kernel
    whose conversions disagree with its data fails here as it would on hardware."""
    defines = ""
    for name, declared in _CONVERSIONS.items():
        found = {flag for text, flag in declared.items() if text in device}
        assert len(found) == 1, f"the kernel's {name} is not one of {sorted(declared)}"
        defines += f"#define {name} {found.pop()}\n"
    return defines


# The kernel's translation unit lists its entries for MAIN's (the runtime's).
ENTRIES = "extern const Entry pt_entries[2];\nconst Entry pt_entries[2] = {KERNEL0, KERNEL1};\n"


def _harness_source(workload: MemWorkload, schedule: MemSchedule, mutate=None) -> tuple[str, str]:
    """The harness of a kernel, as two translation units: (the kernel's, the runtime's:
    MAIN, the same for every kernel of an element type and conversions, so built once).
    ``mutate`` replaces a text of its entries (or reductions), or else of its PTX wrappers
    ("device": the shim replaces them, but reads their conversions)."""
    parts = source_parts(workload, schedule)
    kernel = parts["common"] + parts["kernel"]
    device = parts["device"]
    if mutate is not None:
        old, new = mutate
        if old in kernel:
            kernel = kernel.replace(old, new)
        else:
            assert old in device, old
            device = device.replace(old, new)
    k = generate(workload, schedule)
    second = k.entries[1] if len(k.entries) > 1 else k.entries[0]
    shared = (
        f"#define PT_ELEM {ELEMENTS[workload.dtype].c_type}\n"
        f"#define PT_NAN_BITS {NAN_BITS[workload.dtype]:#06x}\n"
        + conversion_defines(device)
        + parts["preamble"]
        + SHIM
    )
    entries = f"#define KERNEL0 {k.entries[0]}\n#define KERNEL1 {second}\n"
    return entries + shared + parts["helpers"] + kernel + ENTRIES, shared + MAIN


def emulate(
    workload: MemWorkload,
    schedule: MemSchedule,
    tmp: Path,
    mutate=None,
    seed=7,
    inputs=None,
    run_as: MemWorkload | None = None,
):
    """Build and run the emulator on ``inputs`` (default: the verifier's, drawn with
    ``seed``); (returncode, stderr, output or None, ref, tol). ``run_as``: the kernel and
    launch plan of ``workload``, launched on another shape of the same rows (as a caller
    of an exported kernel might)."""
    kernel = generate(workload, schedule)
    blocks_per_sm = int(MemSpace(workload, EMU_GPU, schedule.knob_arrays()).blocks_per_sm[0])
    plan = launch_plan(kernel, workload, EMU_GPU.sm_count, blocks_per_sm)
    kernel_unit, runtime_unit = _harness_source(workload, schedule, mutate)
    exe = build_harness(kernel_unit, tmp, runtime=runtime_unit)
    if run_as is not None:
        assert run_as.rows == workload.rows  # the workspace is sized for the rows
        workload = run_as
    if inputs is None:
        inputs = make_inputs(workload, seed)
    ref, tol = reference(np, workload, inputs)
    names = {"x": inputs["x"]}
    first = plan.launches[0]
    files = []
    for slot, arg in zip(("x", "p0", "p1"), first.arguments[:3], strict=True):
        path = tmp / f"{slot}.bin"
        (inputs[arg] if arg in inputs else names["x"]).tofile(path)
        files.append(str(path))
    ws = plan.buffer("ws")
    ws_floats = ws.shape[0]
    counters = workload.rows * schedule.blocks_per_row * 3 if ws_floats > 4 else ws_floats
    args = [
        *files,
        str(tmp / "y.bin"),
        str(ref.size),
        str(ws_floats),
        str(counters),
        str(EMU_GPU.sm_count * blocks_per_sm),
        str(workload.rows),
        str(workload.cols),
        repr(float(first.scalars["eps"])),
        repr(float(first.scalars["scale"])),
        str(int(first.scalars["queries"])),
        "1",
        str(len(plan.launches)),
    ]
    for launch in plan.launches:
        args += [
            str(kernel.entries.index(launch.kernel)),
            str(launch.grid[0]),
            str(launch.block[0]),
            str(launch.smem_bytes),
        ]
    run = subprocess.run(
        [str(exe), *args], capture_output=True, text=True, check=False, timeout=240
    )
    out = None
    if run.returncode == 0:
        out = np.fromfile(tmp / "y.bin", dtype=storage(np, workload.dtype)).reshape(ref.shape)
    return run.returncode, run.stderr, out, ref, tol


# Small shapes with tails: rows not a multiple of rows_per_block, segments of unequal length
# (cols / vector not a multiple of blocks_per_row), vectors per segment not a multiple of the
# threads (idle lanes in the last batch). Each op has cases reaching every knob value
# (checked by test_cases_reach_every_knob_value_of_every_op).
WORKLOADS: dict[str, list[MemWorkload]] = {
    "reduce": [reduce(37, 200), reduce(5, 1032, "max"), reduce(3, 4200), reduce(70, 16, "max")],
    "softmax": [softmax(37, 200), softmax(5, 1032), softmax(3, 4200), softmax(70, 16)],
    # attention's (a kernel kind of its own): each row's cut at its own offset
    "softmax-causal": [softmax(36, 200, 0.125, causal=True, queries=3),
                       softmax(6, 1032, 0.125, causal=True, queries=3),
                       softmax(3, 4200, 0.125, causal=True, queries=3),
                       softmax(70, 16, 0.125, causal=True, queries=14)],
    "layernorm": [layernorm(37, 200), layernorm(5, 1032), layernorm(3, 4200), layernorm(70, 16)],
    "rmsnorm": [rmsnorm(37, 200), rmsnorm(5, 1032, 1e-6), rmsnorm(3, 4200), rmsnorm(70, 16)],
    "bias_gelu": [bias_gelu(37, 200), bias_gelu(5, 1032, "tanh"), bias_gelu(3, 4200),
                  bias_gelu(70, 16, "tanh")],
    "silu_mul": [silu_mul(37, 200), silu_mul(5, 1032), silu_mul(3, 4200), silu_mul(70, 16)],
}  # fmt: skip
EXTRA_CASES = 2  # random cases beyond the knob coverage, per op


def _valid(workload: MemWorkload, schedule: MemSchedule) -> bool:
    return not schedule_problems(schedule, workload, EMU_GPU)


def _emulation_costs(space: MemSpace) -> np.ndarray:
    """Seconds, roughly, per schedule: a g++ build, the OS threads created (a wave's, per
    launch) and the barriers and shuffles of every work item."""
    g = space.geometry
    launches = g.launches
    threads = g.threads
    created = np.minimum(space.grid, space.capacity) * threads * launches
    synced = g.items * threads * launches
    return 1.0 + created / 7000 + synced / 20_000


@cache
def stratified_cases(op: str, extra: int = EXTRA_CASES, seed: int = 0):
    """Cases of one op that reach every knob value its emulated spaces allow, cheapest
    first (covering_sample), plus ``extra`` random ones; every workload (tail) appears."""
    candidates = []
    for w in WORKLOADS[op]:
        space = MemSpace.enumerate(w, EMU_GPU)
        costs = _emulation_costs(space)
        candidates += [(w, space[i], float(costs[i])) for i in range(len(space))]
    chosen = covering_sample(candidates, lambda c: c[1], cost=lambda c: c[2], extra=extra,
                             seed=seed)  # fmt: skip
    for w in WORKLOADS[op]:  # every tail shape at least once
        if all(c[0] is not w for c in chosen):
            chosen.append(min((c for c in candidates if c[0] is w), key=lambda c: c[2]))
    return [(w, s) for w, s, _ in chosen]


def test_cases_reach_every_knob_value_of_every_op():
    for op in WORKLOADS:
        cases = stratified_cases(op)
        for knob in KNOBS:
            reached = {getattr(s, knob.name) for _, s in cases}
            allowed = {
                getattr(s, knob.name) for w in WORKLOADS[op] for s in MemSpace.enumerate(w, EMU_GPU)
            }
            assert reached == allowed, (op, knob.name, sorted(allowed - reached))
        # what the op can use at all: splitting and packing, the caches of a second pass
        assert {s.blocks_per_row for _, s in cases} >= {1, 2, 128}
        assert {s.rows_per_block for _, s in cases} >= {1, 2, 64}


def _emulate_each(jobs: list[tuple[MemWorkload, MemSchedule]], tmp: Path) -> list[Any]:
    """``emulate`` of each (workload, schedule), two at a time, in order (each in its own
    folder under ``tmp``)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda n: emulate(*jobs[n], tmp / str(n)), range(len(jobs))))


@pytest.mark.parametrize("op", list(WORKLOADS))
def test_emulated_kernels_match_numpy(tmp_path, op):
    cases = stratified_cases(op)
    outcomes = _emulate_each(cases, tmp_path)
    for (workload, schedule), (code, stderr, out, ref, tol) in zip(cases, outcomes, strict=True):
        where = f"{workload.label()} {schedule.id}"
        assert code == 0, f"{where}: {stderr}"
        passed, _, why = check(np, out, ref, tol)
        assert passed, f"{where}: {why}"


@pytest.mark.parametrize(
    ("workload", "schedule", "mutation", "symptom"),
    [
        # The last batch's bound dropped: loads run past the segment into the next row.
        (softmax(5, 200), MemSchedule(32, 1, 1, 1, 0, 0, 0),
         ("if (u < vfull) load_vec<VEC>(xr + u * VEC, xw[j]);",
          "load_vec<VEC>(xr + u * VEC, xw[j]);"), "wrong result or fault"),
        # A split row's blocks stop waiting for each other (the fused join without its wait).
        (softmax(3, 4200), MemSchedule(64, 1, 4, 8, 2, 1, 1),
         ("while (load_volatile(&arrive[row]) < SPLIT) spin_pause();", ""),
         "wrong result or fault"),
        # The last block does not reset the row's counter: the second run goes wrong.
        (reduce(3, 4200), MemSchedule(64, 1, 4, 8, 0, 1, 0),
         ("store_volatile(&arrive[row], 0);  // the workspace is left zeroed", ""),
         "wrong result or fault"),
        # The multi-warp row reduction skips its first barrier.
        (layernorm(5, 1032), MemSchedule(128, 1, 1, 2, 1, 0, 0),
         ("if ((tid & 31) == 0) slot_store(sm, (tid >> 5) * SLOT, s);\n    block_sync();",
          "if ((tid & 31) == 0) slot_store(sm, (tid >> 5) * SLOT, s);"), "wrong result or fault"),
        # Layer norm without its epsilon: on rows of variance ~1 it moved no fp16 output.
        (layernorm(5, 1032), MemSchedule(128, 1, 1, 2, 1, 0, 0),
         ("finish(st, eps)", "finish(st, 0.f)"), "wrong result or fault"),
        # RMS norm without its epsilon, and scaled by x where gamma goes (a split row).
        (rmsnorm(5, 1032), MemSchedule(128, 1, 1, 2, 1, 0, 0),
         ("finish(st, eps)", "finish(st, 0.f)"), "wrong result or fault"),
        (rmsnorm(3, 4200), MemSchedule(64, 1, 4, 8, 2, 1, 1),
         ("load_vec<VEC>(p0 + u * VEC, gw[j]);", "load_vec<VEC>(xr + u * VEC, gw[j]);"),
         "wrong result or fault"),
        # SwiGLU's up read from the gate's half of the row, or from the output's row stride.
        (silu_mul(5, 1032), MemSchedule(32, 1, 4, 8, 0, 0, 0),
         ("load_vec<VEC>(xr + cols + u * VEC, uw[j]);", "load_vec<VEC>(xr + u * VEC, uw[j]);"),
         "wrong result or fault"),
        (silu_mul(5, 1032), MemSchedule(32, 1, 4, 8, 0, 0, 0),
         ("row * (X_ROW * cols)", "row * cols"), "wrong result or fault"),
    ],
)  # fmt: skip
def test_emulator_catches_broken_kernels(tmp_path, workload, schedule, mutation, symptom):
    """The emulator is only evidence if it fails broken kernels: break some on purpose."""
    assert _valid(workload, schedule)
    code, stderr, out, ref, tol = emulate(workload, schedule, tmp_path, mutation)
    if code == 0:
        assert not check(np, out, ref, tol)[0], "a broken kernel passed"
    else:
        assert code == 3 and "EMULATOR" in stderr, stderr


@pytest.mark.parametrize(
    "schedule",
    [
        MemSchedule(32, 1, 1, 8, 0, 0, 0),  # a warp per row
        MemSchedule(128, 1, 1, 2, 0, 0, 0),  # a row over several warps
        MemSchedule(8, 4, 1, 2, 0, 0, 0),  # rows packed in a block
        MemSchedule(64, 1, 4, 8, 0, 0, 0),  # a row split over blocks, two passes
        MemSchedule(64, 1, 4, 8, 0, 1, 1),  # split, fused
    ],
    ids=lambda s: s.id,
)
def test_a_row_max_keeps_a_nan_as_torch_amax_does(tmp_path, schedule):
    # fmaxf returns the other operand: a row holding a NaN reduced to its largest number.
    workload = reduce(6, 4200, "max")
    assert _valid(workload, schedule)
    inputs = make_inputs(workload, 3)
    x = inputs["x"].copy()
    x[1, 5] = np.nan  # in the first segment
    x[3, 4199] = np.nan  # in the last vector of the last segment
    x[4, :] = -np.inf  # no NaN: the max of -inf is -inf
    code, stderr, out, _, _ = emulate(workload, schedule, tmp_path, inputs={"x": x})
    assert code == 0, stderr
    expected = x.astype(np.float32).max(axis=1)  # numpy's max keeps NaN
    assert np.isnan(out[[1, 3]]).all()
    assert out[4] == -np.inf
    rows = [0, 2, 5]
    np.testing.assert_array_equal(out[rows].astype(np.float32), expected[rows])


@pytest.mark.parametrize(
    ("schedule", "cache"),
    [
        (MemSchedule(32, 1, 1, 8, 2, 0, 0), "registers"),  # one vector a thread, compiled in
        (MemSchedule(32, 1, 1, 8, 1, 0, 0), "shared memory"),  # sized by the launch plan
    ],
    ids=lambda v: v if isinstance(v, str) else v.id,
)
def test_a_row_longer_than_the_kernel_holds_traps_instead_of_a_wrong_result(
    tmp_path, schedule, cache
):
    """An exported softmax takes cols as an argument, but its row cache was sized for the
    cols it was generated and planned for: launched on 1024 columns, a kernel made for 256
    wrote 1024 of 4096 outputs, each normalised over its first 256 columns, and exited
    cleanly. It now traps (the launch fails); a shorter row of as many vectors a thread
    is still right."""
    tuned = softmax(4, 256)
    assert _valid(tuned, schedule)
    code, stderr, out, _, _ = emulate(tuned, schedule, tmp_path / "long", run_as=softmax(4, 1024))
    assert code == 3 and "trap: the kernel refused the launch" in stderr, (cache, stderr)
    code, stderr, out, ref, tol = emulate(
        tuned, schedule, tmp_path / "short", run_as=softmax(4, 128)
    )
    assert code == 0, stderr
    assert check(np, out, ref, tol)[0]


# ---- attention's softmax: scaled, causally masked -----------------------------------------

# Every place a softmax reads x: the statistics pass from each cache level (registers,
# shared memory, global), the output pass after a fused split's join, and a two-pass split's
# second kernel; rows packed in a block, a row over several warps.
ATTENTION_MAPPINGS = {
    "registers": MemSchedule(32, 1, 1, 8, 2, 0, 0),
    "smem-packed": MemSchedule(8, 4, 1, 2, 1, 0, 0),
    "global-warps": MemSchedule(128, 1, 1, 2, 0, 0, 0),
    "split-two_pass": MemSchedule(32, 1, 4, 8, 0, 0, 0),
    "split-fused": MemSchedule(32, 1, 4, 8, 0, 1, 1),
}
# A square mask (prefill; its rows too short for a split), and 3 queries against 1032 keys (a
# chunk of queries after 1029 cached keys: each row's last visible key falls inside a
# vector); scaled as attention's 1/sqrt(64).
ATTENTION_WORKLOADS = [
    softmax(264, 264, scale=0.125, causal=True),
    softmax(12, 1032, scale=0.125, causal=True, queries=3),
]


@pytest.mark.parametrize("mapping", list(ATTENTION_MAPPINGS))
def test_emulated_attention_softmax_matches_numpy(tmp_path, mapping):
    schedule = ATTENTION_MAPPINGS[mapping]
    jobs = [w for w in ATTENTION_WORKLOADS if _valid(w, schedule)]
    assert ATTENTION_WORKLOADS[1] in jobs and (len(jobs) == 2 or schedule.blocks_per_row > 1)
    outcomes = _emulate_each([(w, schedule) for w in jobs], tmp_path)
    for workload, (code, stderr, out, ref, tol) in zip(jobs, outcomes, strict=True):
        where = f"{workload.label()} {schedule.id}"
        assert code == 0, f"{where}: {stderr}"
        passed, _, why = check(np, out, ref, tol)
        assert passed, f"{where}: {why}"
        y = widen(np, out)
        q, cols = workload.mask_queries, workload.cols
        hidden = np.arange(cols)[None, :] > np.arange(workload.rows)[:, None] % q + (cols - q)
        assert (y[hidden] == 0).all() and (y[~hidden] > 0).all(), where
        np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=0.02)


def test_an_attention_softmax_is_a_plain_one_of_scaled_masked_inputs(tmp_path):
    """The mask and the scale change the values, not the kernel: a plain softmax of x·scale
    with the hidden keys at -inf gives the same outputs."""
    schedule = ATTENTION_MAPPINGS["split-fused"]
    attention = ATTENTION_WORKLOADS[1]
    inputs = make_inputs(attention, 5)
    code, stderr, masked, _, _ = emulate(attention, schedule, tmp_path / "a", inputs=inputs)
    assert code == 0, stderr
    z = widen(np, inputs["x"]) * np.float32(0.125)
    hidden = np.arange(1032)[None, :] > np.arange(12)[:, None] % 3 + 1029
    z[hidden] = -np.inf
    plain = {"x": z.astype(np.float16)}  # x·0.125 is exact in fp16 (a power of two)
    code, stderr, out, _, _ = emulate(softmax(12, 1032), schedule, tmp_path / "p", inputs=plain)
    assert code == 0, stderr
    np.testing.assert_array_equal(masked, out)


CUT_LOAD = "      load_cut(xr, vfull, limit, scale, f);"


@pytest.mark.parametrize(
    ("mapping", "mutation"),
    [
        # The cut vector's output left unmasked (the statistics still see the mask).
        ("split-two_pass", (CUT_LOAD + "\n      for (int e = 0;",
                            CUT_LOAD.replace("limit", "cols") + "\n      for (int e = 0;")),
        # The hidden keys' outputs left unwritten (the harness fills y with NaN first).
        ("registers", ("store_vec<VEC>(y + base + u * VEC, zero);", "")),
        # The mask aligned to the first key (torch's is_causal) rather than the last.
        ("smem-packed", ("row % queries + (cols - queries)", "row % queries")),
        # The scale left out of the statistics pass, or the cut vector left out of it.
        ("global-warps", ("          scale_input(f, scale);\n", "")),
        ("split-fused", ("      accumulate(st, f);\n    }\n", "    }\n")),
    ],
    ids=["cut-unmasked", "hidden-unwritten", "top-left", "unscaled-statistics", "cut-uncounted"],
)  # fmt: skip
def test_emulator_catches_a_wrong_attention_softmax(tmp_path, mapping, mutation):
    schedule = ATTENTION_MAPPINGS[mapping]
    # The square mask hides whole vectors (its alignment cannot show); the 3 queries' rows hide
    # only parts of their last.
    square = mapping == "registers"
    workload = ATTENTION_WORKLOADS[0 if square else 1]
    assert _valid(workload, schedule)
    code, stderr, out, ref, tol = emulate(workload, schedule, tmp_path, mutation)
    assert code == 0, stderr
    assert not check(np, out, ref, tol)[0], "a broken kernel passed"


# ---- bfloat16 ----------------------------------------------------------------------------


def _bf16(workload: MemWorkload) -> MemWorkload:
    """The workload on bfloat16 elements (the constructors take no dtype)."""
    return parse_mem_workload({**workload.model_dump(), "dtype": "bfloat16"})


# bfloat16 changes only the kernels' storage type and conversions (tests/test_memops_bfloat16.py),
# so every op on two mappings covers what differs: a row per block (vectors of 2: pack2 on
# one word), and a row split over 4 blocks with a second kernel (vectors of 8, a last
# segment shorter than the others, idle lanes); the reductions' outputs through f2h.
BF16_WORKLOADS = [reduce(5, 1032), reduce(5, 1032, "max"), softmax(5, 1032), layernorm(5, 1032),
                  rmsnorm(5, 1032, 1e-6), bias_gelu(5, 1032), bias_gelu(5, 1032, "tanh"),
                  silu_mul(5, 1032)]  # fmt: skip
BF16_MAPPINGS = {"one-row": MemSchedule(128, 1, 1, 2, 0, 0, 0),
                 "split-two_pass": MemSchedule(32, 1, 4, 8, 0, 0, 0)}  # fmt: skip


@pytest.mark.parametrize("mapping", list(BF16_MAPPINGS))
def test_emulated_bf16_kernels_match_numpy(tmp_path, mapping):
    schedule = BF16_MAPPINGS[mapping]
    jobs = [_bf16(w) for w in BF16_WORKLOADS]
    assert all(_valid(w, schedule) for w in jobs)
    outcomes = _emulate_each([(w, schedule) for w in jobs], tmp_path)
    for workload, (code, stderr, out, ref, tol) in zip(jobs, outcomes, strict=True):
        where = f"{workload.label()} {schedule.id}"
        assert code == 0, f"{where}: {stderr}"
        assert out.dtype == np.uint16  # bf16's bits, as the runners hold them
        passed, _, why = check(np, out, ref, tol)
        assert passed, f"{where}: {why}"
        if workload.op == "reduce" and workload.reduction == "max":
            continue  # exact in either type
        # Not vacuous: the outputs carry bf16's rounding, outside fp16's tolerance.
        _, fp16_tol = reference(np, workload.model_copy(update={"dtype": "float16"}),
                                make_inputs(workload, 7))  # fmt: skip
        assert (np.abs(widen(np, out) - ref) > fp16_tol).any(), where


# The h2f bodies of the two element types (the only conversion that is not a cvt's type).
H2F_FP16 = r"""  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
  return f;"""
H2F_BF16 = "  return __uint_as_float((unsigned)h << 16);"


@pytest.mark.parametrize(
    ("workload", "mapping", "mutation"),
    [
        # A bf16 kernel that packs its outputs as fp16 (two a word).
        (_bf16(softmax(5, 1032)), "one-row", ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32")),
        # A bf16 reduce whose one output a row is converted as fp16.
        (_bf16(reduce(5, 1032)), "split-two_pass", ("cvt.rn.bf16.f32", "cvt.rn.f16.f32")),
        # A bf16 kernel that reads its inputs (x and gamma) as fp16.
        (_bf16(rmsnorm(5, 1032)), "one-row", (H2F_BF16, H2F_FP16)),
        # And a fp16 kernel that packs its outputs as bf16.
        (softmax(5, 1032), "split-two_pass", ("cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32")),
    ],
    ids=["bf16-pack2", "bf16-f2h", "bf16-h2f", "fp16-pack2"],
)
def test_emulator_catches_a_kernel_with_the_other_types_conversion(
    tmp_path, workload, mapping, mutation
):
    """The shim converts as the kernel's own PTX wrappers say, not as the workload says: a
    kernel whose conversion is the other type's computes garbage, and the check that passes
    the consistent kernels fails it."""
    code, stderr, out, ref, tol = emulate(workload, BF16_MAPPINGS[mapping], tmp_path, mutation)
    assert code == 0, stderr
    passed, _, why = check(np, out, ref, tol)
    assert not passed
    # Most of the outputs are wrong, not one: the type alone is.
    assert (np.abs(widen(np, out) - ref) > tol).mean() > 0.5, why
