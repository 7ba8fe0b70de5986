"""The wgmma probe kernel (workers/codegen/wgmma/), run on the CPU by the emulator of
tests/cuda_emulator.py, must match numpy; and NVRTC must compile every probe shape for sm_90a
without spills or serialised MMAs.

The emulated ``wgmma.mma_async`` reads its operands through the descriptors as the PTX ISA
defines the 128-byte-swizzle canonical layouts ("Shared Memory Matrix Layout": K-major
((8,m),(T,2k)):((8T,SBO),(1,T)), MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 8 halves,
the swizzle XORing address bits 4-6 with bits 7-9), written here independently of the
kernel's loader, and lays out its result as the ISA's m64nNk16 accumulator fragment. An MMA
is asynchronous: it checks at issue that its chunks landed before a barrier, reads them when
its ``wgmma.wait_group`` retires it (the latest moment), and until then any cp.async into them
is a race.

The TMA loader's shim (``TMA_SHIM``, its functions in ``TMA_RUNTIME``) reads the box of a
tensor map described by the specs that ``wgmma.tensor_map_specs`` gives the driver (zeros
past the edges, 128-byte lines swizzled by their shared-memory address, the source kept
inside its operand), counts its bytes on an emulated mbarrier (arrivals, expected
transactions, phases) only when a thread waits on it, and lands the data only when a wait
sees the phase complete: a consumer that skips or mistimes its wait reads NaN or a stale
tile, and a byte total the copies never reach never completes.

bfloat16 kernels run too: the wgmma shim decodes the operands as the kernel's own wgmma
instruction declares them (``.f16.f16`` or ``.bf16.bf16``, read by cuda_emulator's
``element_defines`` as ``PT_WGMMA_BF16``) and ``pack_half2`` encodes as its cvt says, so a
kernel whose type words disagree with its operands computes garbage here as on hardware.

What it cannot check: the proxy fences (``fence.proxy.async``, the tensor-map acquire, the
mbarrier-init fence) and the real hardware's reading of the descriptors and tensor maps; a
GPU settles those (benchmarks/wgmma_probe.py).
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from cuda_emulator import (
    BIAS_SHIM,
    COMMON_SHIM,
    RUNTIME,
    assert_outcomes_match,
    build_and_run,
    element_defines,
    emulate_all,
    gelu_tolerance,
    harness_source,
    rounded,
    swiglu_tolerance,
    values_of,
)

from pipetune.model.workloads import bmm, gemm, gemm_bias_gelu, gemm_swiglu
from pipetune.workers.codegen import wgmma
from pipetune.workers.codegen.variants import BIAS_GELU_VARIANTS, b_layout_of
from pipetune.workers.codegen.variants import variant_of as workload_variant
from pipetune.workers.codegen.wgmma import WgmmaConfig
from pipetune.workers.compile import compile_source

# The 128-byte swizzle: address bits 4-6 XORed with bits 7-9 (the wgmma shim's descriptors and
# the TMA runtime's boxes: one definition in both translation units).
SWIZZLE = r"""
namespace pt {
inline unsigned swizzled(unsigned a) { return a ^ (((a >> 7) & 7u) << 4); }
}  // namespace pt
"""

WGMMA_SHIM = (
    SWIZZLE
    + r"""
namespace pt {
inline void wgmma_fence() {}
inline void fence_proxy_async() {}  // proxies are not emulated
inline void fence_operand(float&) {}

struct Descriptor { unsigned start, leading, stride; };
inline Descriptor decode(unsigned long long d) {
  if ((d >> 62) != 1) fail("descriptor: not the 128-byte swizzle layout", (long)(d >> 62), 0);
  if ((d >> 49) & 7) fail("descriptor: base offset not 0", (long)((d >> 49) & 7), 0);
  return {(unsigned)(d & 0x3FFF) << 4, (unsigned)((d >> 16) & 0x3FFF) << 4,
          (unsigned)((d >> 32) & 0x3FFF) << 4};
}
// Element (row, k) of a K-major operand; element (mn, k) of an MN-major one (2-byte elements,
// fp16 or bf16: T = 8).
inline unsigned k_major(const Descriptor& d, int row, int k) {
  return swizzled(d.start + (row % 8) * 128 + (row / 8) * d.stride + (k % 8) * 2 + (k / 8) * 16);
}
inline unsigned mn_major(const Descriptor& d, int mn, int k) {
  return swizzled(d.start + (mn % 64) * 2 + (mn / 64) * d.leading + (k % 8) * 128 +
                  (k / 8) * d.stride);
}
// B as the kernel's own instruction reads it (its trans-b immediate, element_defines): K-major
// (B stored N x K) or MN-major (K x N).
#ifndef PT_WGMMA_B_K_MAJOR
#error "PT_WGMMA_B_K_MAJOR: the harness reads trans-b from the kernel (element_defines)"
#endif
inline unsigned b_at(const Descriptor& d, int n, int k) {
#if PT_WGMMA_B_K_MAJOR
  return k_major(d, n, k);
#else
  return mn_major(d, n, k);
#endif
}
// The operands as the kernel's own wgmma instruction declares them (element_defines): a kernel
// whose instruction names another type than its operands hold computes garbage, as on hardware.
#ifndef PT_WGMMA_BF16
#error "PT_WGMMA_BF16: the harness reads the wgmma operand type from the kernel (element_defines)"
#endif
inline float smem_f(unsigned addr) {
  if (addr + 2 > g_smem_bytes) fail("wgmma reads past shared memory", addr, g_smem_bytes);
  unsigned short v; std::memcpy(&v, pt_smem + addr, 2);
#if PT_WGMMA_BF16
  return b2f(v);
#else
  return h2f(v);
#endif
}
// The m64nNk16 f32 accumulator fragment: thread t of the warpgroup, register i.
inline void fragment(int t, int i, int& row, int& col) {
  row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2);
  col = 8 * (i / 4) + 2 * (t % 4) + i % 2;
}

struct MmaOp { float* d; int n; Descriptor a, b; std::vector<unsigned> chunks; };
thread_local std::vector<MmaOp> t_mma_open;
thread_local std::vector<std::vector<MmaOp>> t_mma_groups;

template <int NACC>
inline void wgmma_tile(float (&d)[NACC], unsigned long long da, unsigned long long db) {
  const int t = threadIdx.x % 128;
  MmaOp op{d, NACC, decode(da), decode(db), {}};
  for (int i = 0; i < NACC; ++i) {
    int row, col;
    fragment(t, i, row, col);
    for (int k = 0; k < 16; ++k) {
      op.chunks.push_back(k_major(op.a, row, k) / 16);
      op.chunks.push_back(b_at(op.b, col, k) / 16);
    }
  }
  std::sort(op.chunks.begin(), op.chunks.end());
  op.chunks.erase(std::unique(op.chunks.begin(), op.chunks.end()), op.chunks.end());
  std::lock_guard<std::mutex> lk(g_track);
  for (unsigned c : op.chunks) {
    if (c >= g_landed.size()) fail("wgmma reads past shared memory", c * 16, g_smem_bytes);
    if (g_landed[c] == INT_MIN || g_landed[c] >= g_epoch)
      fail("wgmma reads a chunk whose copy has not landed before a barrier", c, g_epoch);
    ++g_pending[c];
  }
  t_mma_open.push_back(op);
}
inline void wgmma_commit() { t_mma_groups.push_back(t_mma_open); t_mma_open.clear(); }
template <int N> inline void wgmma_wait() {
  std::lock_guard<std::mutex> lk(g_track);
  while ((int)t_mma_groups.size() > N) {
    for (MmaOp& op : t_mma_groups.front()) {
      const int t = threadIdx.x % 128;
      for (int i = 0; i < op.n; ++i) {
        int row, col;
        fragment(t, i, row, col);
        float sum = 0.f;
        for (int k = 0; k < 16; ++k)
          sum += smem_f(k_major(op.a, row, k)) * smem_f(b_at(op.b, col, k));
        op.d[i] += sum;
      }
      for (unsigned c : op.chunks) {
        --g_pending[c];
        g_last_read[c] = g_epoch;
      }
    }
    t_mma_groups.erase(t_mma_groups.begin());
  }
}
}  // namespace pt
"""
)

# The TMA loader's types and functions, as both translation units see them: the kernel's
# unit calls them, TMA_RUNTIME (linked in: the same for every kernel, built once) defines them.
TMA_DECLARATIONS = r"""
#include <chrono>
#include <map>
// A tensor map as the emulator reads it (the real one is the driver's opaque 128 bytes).
struct FakeTensorMap {
  const unsigned char* base; size_t bytes;
  long dims[3], strides[2]; int box[3];
};
// How long an mbarrier wait may take before it is a hang (the kernel's unit: PT_MBARRIER_WAIT_S).
extern const int pt_mbarrier_wait_s;
namespace pt {
void mbarrier_init(unsigned bar, unsigned count);
void mbarrier_expect_tx(unsigned bar, unsigned bytes);
bool mbarrier_try_wait(unsigned bar, unsigned parity);
void mbarrier_wait(unsigned bar, unsigned parity);
void tma_load_3d(unsigned dst, const void* map, int c0, int c1, int c2, unsigned bar);
}  // namespace pt
"""

TMA_SHIM = (
    TMA_DECLARATIONS
    + r"""
#include <limits>
using std::max;
using std::min;
static std::vector<float> g_w;  // split-K's (stream-K's) workspace of f32 partial sums
static std::vector<unsigned> g_arrivals;  // stream-K's arrival counter per tile
// The blocks run one at a time: a fence has nothing to order, an atomic nothing to race.
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline float __ldcg(const float* p) { return *p; }
static FakeTensorMap g_tmaps[2];
static void set_tmap(FakeTensorMap& m, const unsigned char* base, size_t bytes, long d0, long d1,
                     long d2, long s1, long s2, int b0, int b1, int b2) {
  m = {base, bytes, {d0, d1, d2}, {s1, s2}, {b0, b1, b2}};
}
#ifndef PT_MBARRIER_WAIT_S  // how long a wait may take before it is a hang
#define PT_MBARRIER_WAIT_S 20
#endif
const int pt_mbarrier_wait_s = PT_MBARRIER_WAIT_S;
namespace pt {
inline void tensormap_acquire(const void*) {}
inline void fence_mbarrier_init() {}
}  // namespace pt
"""
)

# The TMA unit and its mbarriers: the same for every kernel, so in the runtime's translation
# unit (RUNTIME's main beside them), compiled once per process.
TMA_RUNTIME = (
    RUNTIME
    + SWIZZLE
    + TMA_DECLARATIONS
    + r"""
namespace pt {
struct Mbarrier {
  int expected = 0, pending = 0;
  long tx = 0;
  unsigned completed = 0;              // phases completed so far
  long in_flight_bytes = 0;            // issued copies not yet delivered
  std::vector<Copy> in_flight, done;   // copies of the current phase; of completed ones
};
static std::map<unsigned, Mbarrier> g_mbar;  // by shared address; guarded by g_track

void mbarrier_init(unsigned bar, unsigned count) {
  std::lock_guard<std::mutex> lk(g_track);
  if (bar % 8 || bar + 8 > g_smem_bytes) fail("mbarrier address", bar, g_smem_bytes);
  Mbarrier m;
  m.expected = m.pending = (int)count;
  g_mbar[bar] = m;
}
static Mbarrier& mbar(unsigned bar) {
  auto it = g_mbar.find(bar);
  if (it == g_mbar.end()) fail("mbarrier used before its init", bar, 0);
  return it->second;
}
static void complete_if_due(Mbarrier& m) {
  if (m.pending < 0) fail("mbarrier: more arrivals than its count", m.pending, 0);
  if (m.tx < 0) fail("mbarrier: more bytes landed than were expected", m.tx, 0);
  if (m.pending == 0 && m.tx == 0) {
    m.done.insert(m.done.end(), m.in_flight.begin(), m.in_flight.end());
    m.in_flight.clear();
    ++m.completed;
    m.pending = m.expected;
  }
}
void mbarrier_expect_tx(unsigned bar, unsigned bytes) {
  std::lock_guard<std::mutex> lk(g_track);
  Mbarrier& m = mbar(bar);
  m.tx += bytes;
  --m.pending;
  complete_if_due(m);
}
bool mbarrier_try_wait(unsigned bar, unsigned parity) {
  std::lock_guard<std::mutex> lk(g_track);
  Mbarrier& m = mbar(bar);
  if ((m.completed & 1u) == (parity & 1u)) {  // that phase is still running
    // The TMA unit delivers the issued copies only now, when somebody waits for them (the
    // latest it may): a wait that returns too early finds nothing landed.
    m.tx -= m.in_flight_bytes;
    m.in_flight_bytes = 0;
    complete_if_due(m);
    return false;
  }
  // The copies of completed phases land now (the latest moment they may), as synchronised
  // by the mbarrier rather than a block barrier.
  for (const Copy& c : m.done) {
    std::memcpy(pt_smem + c.dst, c.data, 16);
    g_landed[c.dst / 16] = INT_MIN + 1;
  }
  m.done.clear();
  return true;
}
void mbarrier_wait(unsigned bar, unsigned parity) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(pt_mbarrier_wait_s);
  while (!mbarrier_try_wait(bar, parity)) {
    if (std::chrono::steady_clock::now() > deadline)
      fail("an mbarrier phase never completes", bar, parity);
    std::this_thread::yield();
  }
}
// The box at (c0, c1, c2): element (i0, i1, i2) of the box lands at byte 2 * i0 of line
// (i2 * box1 + i1), lines 128 bytes long, each 16-byte unit swizzled by its address.
void tma_load_3d(unsigned dst, const void* map, int c0, int c1, int c2, unsigned bar) {
  const FakeTensorMap& t = *(const FakeTensorMap*)map;
  if (dst % 128) fail("TMA destination not 128-byte aligned", dst, 0);
  if (t.box[0] * 2 != 128) fail("TMA box: the 128-byte swizzle needs 128-byte lines", t.box[0], 0);
  const long lines = (long)t.box[1] * t.box[2];
  if (dst + lines * 128 > g_smem_bytes) fail("TMA writes past shared memory", dst, lines);
  std::vector<Copy> copies(lines * 8);
  for (long line = 0; line < lines; ++line)
    for (int i0 = 0; i0 < t.box[0]; ++i0) {
      const long x = c0 + i0, y = c1 + line % t.box[1], z = c2 + line / t.box[1];
      unsigned short v = 0;
      if (x >= 0 && x < t.dims[0] && y >= 0 && y < t.dims[1] && z >= 0 && z < t.dims[2]) {
        const long at = z * t.strides[1] + y * t.strides[0] + x * 2;
        if (at < 0 || at + 2 > (long)t.bytes) fail("TMA reads outside its operand", at, t.bytes);
        std::memcpy(&v, t.base + at, 2);
      }
      Copy& c = copies[line * 8 + i0 / 8];
      c.dst = swizzled(dst + line * 128 + (i0 / 8) * 16);
      std::memcpy(c.data + (i0 % 8) * 2, &v, 2);
    }
  std::lock_guard<std::mutex> lk(g_track);
  for (const Copy& c : copies) {
    if (g_mbar.count(c.dst & ~7u) || g_mbar.count((c.dst & ~7u) + 8))
      fail("TMA writes over an mbarrier", c.dst, 0);
    if (g_last_read[c.dst / 16] == g_epoch)
      fail("write-after-read race on shared chunk", c.dst / 16, g_epoch);
    if (g_pending[c.dst / 16] > 0)
      fail("write-after-read race: an MMA in flight reads the shared chunk", c.dst / 16, g_epoch);
  }
  Mbarrier& m = mbar(bar);
  m.in_flight.insert(m.in_flight.end(), copies.begin(), copies.end());
  m.in_flight_bytes += lines * 128;
}
}  // namespace pt
"""
)


def _tma_defines(workload, config: WgmmaConfig, sms: int = 3, reversed_blocks: bool = False) -> str:
    """The emulated tensor maps, filled from the specs the probe hands the driver (and for
    stream-K, its workspace and counters, the blocks run in reverse with `reversed_blocks`)."""
    view = workload.gemm_view()
    b_layout = b_layout_of(workload_variant(workload))
    specs = wgmma.tensor_map_specs(
        view.m, view.n, view.k, view.batch, config, workload.dtype, b_layout
    )
    fills = []
    for i, (spec, pointer, size) in enumerate(
        zip(specs, ("ap", "bp"), ("a_bytes", "b_bytes"), strict=True)
    ):
        numbers = ", ".join(map(str, (*spec.dims, *spec.strides, *spec.box)))
        fills.append(f"set_tmap(g_tmaps[{i}], {pointer}, {size}, {numbers});")
    extra = ", (const void*)&g_tmaps[0], (const void*)&g_tmaps[1]"
    defines = ""
    if config.splits > 1:
        # The workspace starts as NaN (a partial never stored shows), and the reduction kernel
        # runs after the main one, one emulated thread at a time (it has no barriers).
        fills.append(
            f"g_w.assign({config.splits} * c_elems, std::numeric_limits<float>::quiet_NaN());"
        )
        extra += ", g_w.data()"
        threads = wgmma.REDUCE_THREADS
        reduce = wgmma.reduce_kernel_name(workload_variant(workload), config, workload.dtype)
        blocks = f"(c_elems / 2 + {threads - 1}) / {threads}"
        defines = (
            f"#define GRID_Y {config.splits}\n"
            f"#define AFTER_LAUNCH for (unsigned bx = 0; bx < {blocks}; ++bx) "
            f"for (unsigned t = 0; t < {threads}; ++t) {{ blockIdx = {{bx, 0, 0}}; "
            f"threadIdx = {{t, 0, 0}}; {reduce}(g_w.data(), AnyPtr{{cp}}, (int)c_elems); }}\n"
        )
    if config.stream_k:
        # The workspace starts as NaN (a partial read before it was stored shows); the
        # counters start at zero, and the block that sums a tile must leave its counter there.
        grid, scalars = wgmma.launch(wgmma.generate(workload, config), workload, sms)
        floats, counters = wgmma.stream_k_buffers(config, grid[0], scalars[-1])
        fills.append(f"g_w.assign({floats}, std::numeric_limits<float>::quiet_NaN());")
        fills.append(f"g_arrivals.assign({counters}, 0u);")
        extra += ", g_w.data(), g_arrivals.data()"
        defines = (
            f"#define BLOCKS_REVERSED {int(reversed_blocks)}\n"
            "#define AFTER_LAUNCH for (unsigned v : g_arrivals) "
            'if (v) fail("a tile\'s arrival counter left set", (long)v, 0);\n'
        )
    return f"#define BEFORE_LAUNCH {' '.join(fills)}\n#define EXTRA_ARGS {extra}\n" + defines


pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")


def _emulate(
    workload, config: WgmmaConfig, tmp, mutate=None, sms: int = 3, reverse=False, wait_s=None
):
    """Build and run one kernel (``sms``: the SMs a persistent kernel's grid is sized for,
    few, so that each block walks several tiles; ``reverse``: stream-K's blocks run last to
    first; ``wait_s``: how long an mbarrier wait may take before the run fails as hung, 20 s
    unless given). ``mutate`` (old, new) edits the kernel's helpers, its body or its device text
    (the PTX wrappers, which the emulator replaces but reads its element types from)."""
    kernel = wgmma.generate(workload, config)
    parts = wgmma.source_parts(kernel.variant, config, kernel.dtype)
    helpers, body, device = parts["helpers"], parts["kernel"], parts["device"]
    if mutate is not None:
        old, new = mutate
        assert old in helpers or old in body or old in device
        helpers, body = helpers.replace(old, new), body.replace(old, new)
        device = device.replace(old, new)
    grid, scalars = wgmma.launch(kernel, workload, sms)
    tma = config.loader == "tma"
    shims = element_defines(device) + "#include <algorithm>\n" + COMMON_SHIM + WGMMA_SHIM
    if kernel.variant in BIAS_GELU_VARIANTS:
        shims += BIAS_SHIM
    if wait_s is not None:
        shims = f"#define PT_MBARRIER_WAIT_S {wait_s}\n" + shims
    if tma:
        shims = _tma_defines(workload, config, sms, reverse) + shims + TMA_SHIM
    source = harness_source(
        shims,
        helpers + body,
        kernel.name,
        kernel.threads,
        len(scalars),
    )
    runtime = TMA_RUNTIME if tma else RUNTIME
    return build_and_run(source, tmp, workload, grid, kernel.smem_bytes, scalars, runtime)


# Tails in M, N and K; one, two and four warpgroups; three to five stages (the ring wraps).
CASES = [
    (gemm(130, 136, 200), WgmmaConfig(128, 128, 3)),
    (gemm(130, 136, 200), WgmmaConfig(128, 128, 5)),
    (gemm(70, 200, 520), WgmmaConfig(64, 256, 4)),
    (bmm(2, 72, 64, 136), WgmmaConfig(64, 128, 4)),
    (gemm(264, 72, 136), WgmmaConfig(256, 64, 3)),
    (gemm(130, 72, 200), WgmmaConfig(128, 64, 4)),
]


# The TMA loader: tails in M, N (a slab of B wholly past N copies another) and K, one to three
# warpgroups, a batch, the ring wrapping; and the staged epilogue.
TMA_CASES = [
    (gemm(130, 136, 200), WgmmaConfig(128, 128, 4, loader="tma")),
    (gemm(70, 200, 520), WgmmaConfig(64, 256, 4, loader="tma")),
    (bmm(2, 72, 64, 136), WgmmaConfig(64, 128, 3, loader="tma")),
    (gemm(200, 72, 136), WgmmaConfig(192, 128, 4, loader="tma")),
    # The staged epilogue, after either loader.
    (bmm(2, 136, 200, 72), WgmmaConfig(128, 128, 4, loader="tma", epilogue="staged")),
    (gemm(70, 200, 136), WgmmaConfig(64, 256, 3, epilogue="staged")),
    # Split-K: slices of three K tiles; uneven slices, the last one with none; a batch.
    (gemm(130, 136, 520), WgmmaConfig(128, 128, 4, loader="tma", splits=3)),
    (gemm(70, 72, 328), WgmmaConfig(64, 64, 6, loader="tma", splits=4)),
    (bmm(2, 72, 64, 200), WgmmaConfig(64, 128, 3, loader="tma", splits=2)),
]


# The persistent kernel, on 3 SMs: blocks walking two or more tiles, unevenly (8 tiles over 3
# blocks); one K tile per output tile (the loads run ahead into the next tiles) and a K tail;
# a batch (tiles of several batch entries in one block); one to three warpgroups.
PERSISTENT = {"loader": "tma", "epilogue": "staged", "persistent": True}
PERSISTENT_CASES = [
    (gemm(130, 136, 200), WgmmaConfig(64, 128, 4, **PERSISTENT)),
    (gemm(200, 72, 64), WgmmaConfig(64, 64, 6, **PERSISTENT)),
    (bmm(3, 72, 64, 136), WgmmaConfig(64, 128, 4, **PERSISTENT)),
    (gemm(260, 136, 40), WgmmaConfig(128, 64, 3, **PERSISTENT)),
    (gemm(200, 136, 136), WgmmaConfig(192, 128, 3, **PERSISTENT)),
]


def test_emulated_persistent_wgmma_kernels_match_numpy(tmp_path):
    assert_outcomes_match(PERSISTENT_CASES, emulate_all(_emulate, PERSISTENT_CASES, tmp_path))


def test_a_persistent_grid_is_one_block_per_sm_at_most():
    config = WgmmaConfig(64, 128, 4, **PERSISTENT)
    kernel = wgmma.generate(bmm(3, 72, 64, 136), config)
    # 2 x 1 tiles in each of 3 batch entries: 6 tiles, passed after M, N and K.
    assert wgmma.launch(kernel, bmm(3, 72, 64, 136), sms=4) == ((4, 1, 1), (72, 64, 136, 6))
    assert wgmma.launch(kernel, bmm(3, 72, 64, 136), sms=132) == ((6, 1, 1), (72, 64, 136, 6))
    with pytest.raises(ValueError, match="one block per SM"):
        wgmma.launch(kernel, bmm(3, 72, 64, 136))


def test_emulator_catches_a_persistent_kernel_refilling_a_stage_in_use(tmp_path):
    # The stage whose MMAs may still be in flight, refilled: across tiles as within one.
    mutation = ("const int next = kt + STAGES - 2;", "const int next = kt + STAGES - 1;")
    code, stderr, _, _ = _emulate(
        gemm(130, 136, 200), WgmmaConfig(64, 128, 4, **PERSISTENT), tmp_path, mutation
    )
    assert code == 3, stderr
    assert "write-after-read" in stderr


@pytest.mark.parametrize(
    "mutation",
    [
        # Accumulators cleared only before a block's first tile.
        ("for (int i = 0; i < ACC; ++i) acc[i] = 0.f;  // each tile from zero",
         "for (int i = 0; i < ACC; ++i) if (local == 0) acc[i] = 0.f;"),
        # The mbarrier phase counted from each tile's first load instead of running on: the
        # second tile's waits return on the first tile's completed phases and read its data.
        ("static_cast<unsigned>(kt / STAGES) & 1u",
         "static_cast<unsigned>(k_step / STAGES) & 1u"),
    ],
    ids=["sums-kept", "phase-per-tile"],
)  # fmt: skip
def test_broken_persistent_kernels_are_caught_by_the_numbers(tmp_path, mutation):
    """No race, no fault: only the comparison with numpy sees these."""
    code, stderr, c, ref = _emulate(
        gemm(130, 136, 200), WgmmaConfig(64, 128, 4, **PERSISTENT), tmp_path, mutation
    )
    assert code == 0, stderr
    assert not np.allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2)


# Stream-K (workload, config, SMs, blocks run last to first): shares cutting tiles unevenly,
# with a K tail (6 tiles of 9 steps over 4 blocks), the same in reverse; one tile shared by
# five blocks (three of them wholly inside it); shares across a batch's entries; one K step
# per tile (every tile whole, the loads running ahead across tiles); three warpgroups.
STREAM_K = {**PERSISTENT, "stream_k": True}
STREAM_K_CASES = [
    (gemm(130, 136, 520), WgmmaConfig(64, 128, 4, **STREAM_K), 4, False),
    (gemm(130, 136, 520), WgmmaConfig(64, 128, 4, **STREAM_K), 4, True),
    (gemm(64, 64, 640), WgmmaConfig(64, 64, 6, **STREAM_K), 5, True),
    (bmm(3, 72, 64, 136), WgmmaConfig(64, 128, 4, **STREAM_K), 4, False),
    (gemm(200, 72, 64), WgmmaConfig(64, 64, 6, **STREAM_K), 3, False),
    (gemm(200, 136, 200), WgmmaConfig(192, 128, 3, **STREAM_K), 3, False),
]


def _emulate_shared(workload, config, sms, reverse, tmp):
    return _emulate(workload, config, tmp, sms=sms, reverse=reverse)


def test_emulated_stream_k_wgmma_kernels_match_numpy(tmp_path):
    outcomes = emulate_all(_emulate_shared, STREAM_K_CASES, tmp_path)
    assert_outcomes_match([(w, c) for w, c, _, _ in STREAM_K_CASES], outcomes)


def test_a_stream_k_launch_shares_out_k_steps_not_tiles():
    config = WgmmaConfig(64, 128, 4, **STREAM_K)
    kernel = wgmma.generate(gemm(130, 136, 520), config)
    # 3 x 2 tiles of 9 K steps: 54 steps, one block per SM up to one step each.
    assert wgmma.launch(kernel, gemm(130, 136, 520), sms=4) == ((4, 1, 1), (130, 136, 520, 6))
    assert wgmma.launch(kernel, gemm(130, 136, 520), sms=132) == ((54, 1, 1), (130, 136, 520, 6))
    # Two partial tiles of 128 threads' 64 accumulators per block; a counter per tile.
    assert wgmma.stream_k_buffers(config, 4, 6) == (4 * 2 * 128 * 64, 6)


def test_a_stream_k_tile_sums_the_same_whichever_block_finishes_last(tmp_path):
    """The block that sums a shared tile adds every share's partials in block order, its own
    read back from the workspace: the same f32 sum, rounded the same, in any finishing
    order (five blocks share the one tile; run first to last, then last to first)."""
    workload, config = gemm(64, 64, 640), WgmmaConfig(64, 64, 6, **STREAM_K)
    forward = _emulate(workload, config, tmp_path / "forward", sms=5)
    backward = _emulate(workload, config, tmp_path / "backward", sms=5, reverse=True)
    assert forward[0] == 0 and backward[0] == 0, forward[1] + backward[1]
    assert np.array_equal(forward[2].view(np.uint16), backward[2].view(np.uint16))


@pytest.mark.parametrize(
    ("mutation", "symptom"),
    [
        # The last block writes its own partial sums only.
        (("for (int h = first; h <= last; ++h)", "for (int h = block; h <= block; ++h)"),
         "numbers"),
        # Both partial tiles of a block stored to one slot: the first is overwritten before
        # the block that sums that tile reads it.
        (("W + partial_slot(block, begin, tile_begin)",
          "W + partial_slot(block, tile_begin, tile_begin)"),
         "numbers"),
        # The counter not set back: the next launch would miscount.
        (("if (tid == 0) arrivals[index] = 0u;", ""), "arrival counter left set"),
    ],
    ids=["own-partial-only", "one-slot", "counter-kept"],
)  # fmt: skip
def test_broken_stream_k_kernels_are_caught(tmp_path, mutation, symptom):
    code, stderr, c, ref = _emulate(
        gemm(130, 136, 520), WgmmaConfig(64, 128, 4, **STREAM_K), tmp_path, mutation, sms=4
    )
    if symptom == "numbers":
        assert code == 0, stderr
        assert np.isnan(c).any() or not np.allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2)
    else:
        assert code == 3, stderr
        assert symptom in stderr


def test_emulated_wgmma_kernels_match_numpy(tmp_path):
    assert_outcomes_match(CASES, emulate_all(_emulate, CASES, tmp_path))


def test_emulated_tma_wgmma_kernels_match_numpy(tmp_path):
    assert_outcomes_match(TMA_CASES, emulate_all(_emulate, TMA_CASES, tmp_path))


@pytest.mark.parametrize(
    ("mutation", "symptom"),
    [
        # Waiting on the other parity: the first wait returns before any copy landed.
        (("static_cast<unsigned>(kt / STAGES) & 1u",
          "(static_cast<unsigned>(kt / STAGES) + 1u) & 1u"),
         "not landed"),
        # Refilling the stage whose MMAs may still be in flight.
        (("const int next = kt + STAGES - 2;", "const int next = kt + STAGES - 1;"),
         "write-after-read"),
        # A byte count the copies overshoot, and one they never reach.
        (("mbarrier_expect_tx(bar, static_cast<unsigned>(STAGE_BYTES));",
          "mbarrier_expect_tx(bar, static_cast<unsigned>(STAGE_BYTES - B_SLAB_BYTES));"),
         "more bytes landed"),
        (("mbarrier_expect_tx(bar, static_cast<unsigned>(STAGE_BYTES));",
          "mbarrier_expect_tx(bar, static_cast<unsigned>(STAGE_BYTES + 16));"),
         "never completes"),
    ],
)  # fmt: skip
def test_emulator_catches_broken_tma_kernels(tmp_path, mutation, symptom):
    # A hang is told by its wait outlasting a deadline: 2 s here, where one is expected
    # (the default's 20 s is for correct kernels on a busy machine).
    code, stderr, _, _ = _emulate(
        gemm(70, 72, 328), WgmmaConfig(64, 256, 4, loader="tma"), tmp_path, mutation, wait_s=2
    )
    assert code == 3, stderr
    assert symptom in stderr


@pytest.mark.parametrize(
    ("mutation", "symptom"),
    [
        # The next tile's copies into the stage whose MMAs retired in this very epoch.
        (("const int next = kt + STAGES - 2;", "const int next = kt + STAGES - 1;"),
         "write-after-read"),
        # One copy group too few retired before the MMAs read the tile.
        (("cp_async_wait<STAGES - 3>();", "cp_async_wait<STAGES - 2>();"), "not landed"),
        # No barrier between the copies landing and the MMAs reading them.
        (("__syncthreads();  // everyone's copies", "// everyone's copies"), "not landed"),
    ],
)  # fmt: skip
def test_emulator_catches_broken_wgmma_kernels(tmp_path, mutation, symptom):
    """The emulator is evidence only if it fails broken kernels: break one on purpose."""
    code, stderr, _, _ = _emulate(gemm(70, 64, 328), WgmmaConfig(64, 128, 4), tmp_path, mutation)
    assert code == 3, stderr
    assert symptom in stderr


def test_a_split_that_counts_k_tiles_twice_is_caught_by_the_numbers(tmp_path):
    """Every slice running the whole K loop is no race and no fault: the sums come out
    several times too large, and only the comparison with numpy sees it."""
    mutation = ("const int kt0 = static_cast<int>(blockIdx.y) * per_slice;", "const int kt0 = 0;")
    code, stderr, c, ref = _emulate(
        gemm(64, 64, 256), WgmmaConfig(64, 64, 6, loader="tma", splits=2), tmp_path, mutation
    )
    assert code == 0, stderr
    assert not np.allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2)


def test_the_two_readings_of_the_b_descriptor_differ(tmp_path):
    """The probe also builds each shape with the B descriptor's offsets swapped, in case the
    hardware reads them the other way round; under the ISA's canonical layout that variant
    computes something else (else the GPU could not tell them apart)."""
    code, stderr, c, ref = _emulate(
        gemm(64, 128, 128), WgmmaConfig(64, 128, 3, "swapped"), tmp_path
    )
    assert code == 0, stderr
    assert not np.allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("config", wgmma.PROBE_CONFIGS, ids=lambda c: c.id)
def test_probe_shapes_compile_for_hopper(config):
    """NVRTC (no GPU) builds every probe shape for sm_90a: no spills, and ptxas did not
    serialise the MMAs (it warns when the accumulators are touched while one is in flight)."""
    # The bias + GELU epilogue is the staged one's (its B loads are gemm_kn's and gemm_nk's).
    staged = config.epilogue == "staged" and config.splits == 1
    for variant in ("gemm_kn", "gemm_nk", "bmm", *(("gemm_bias_gelu_kn",) if staged else ())):
        kernel = wgmma.generate(variant, config)
        result = compile_source(kernel.code, "sm_90a", entry=kernel.name)
        assert result.spill_stores_bytes == 0 and result.spill_loads_bytes == 0, result.log
        assert "wgmma" not in result.log.lower(), result.log
        assert result.registers <= 255


def test_configs_are_checked():
    with pytest.raises(ValueError, match="block_n"):
        WgmmaConfig(128, 96, 4)
    with pytest.raises(ValueError, match="stages"):
        WgmmaConfig(128, 128, 2)
    with pytest.raises(ValueError, match="shared memory"):
        WgmmaConfig(256, 256, 4)
    with pytest.raises(ValueError, match="whole 16-byte copies"):
        WgmmaConfig(192, 128, 4)
    with pytest.raises(ValueError, match="b_descriptor"):
        WgmmaConfig(128, 128, 4, "sideways")
    with pytest.raises(ValueError, match="loader"):
        WgmmaConfig(128, 128, 4, loader="bulk")
    with pytest.raises(ValueError, match="epilogue"):
        WgmmaConfig(128, 128, 4, epilogue="tma-store")
    with pytest.raises(ValueError, match="splits"):
        WgmmaConfig(128, 128, 4, loader="tma", splits=0)
    with pytest.raises(ValueError, match="split-K is built for the TMA loader"):
        WgmmaConfig(128, 128, 4, splits=2)
    with pytest.raises(ValueError, match="split-K is built for the TMA loader"):
        WgmmaConfig(128, 128, 4, loader="tma", epilogue="staged", splits=2)
    with pytest.raises(ValueError, match="stream-K is built on the persistent kernel"):
        WgmmaConfig(128, 128, 4, loader="tma", epilogue="staged", stream_k=True)
    assert WgmmaConfig(128, 128, 4, **STREAM_K).id == "wg128x128s4_tma_st_sk"
    # Stream-K's flag after the persistent kernel's C tile.
    assert (
        WgmmaConfig(128, 128, 4, **STREAM_K).smem_bytes
        == WgmmaConfig(128, 128, 4, **PERSISTENT).smem_bytes + 16
    )
    assert WgmmaConfig(128, 128, 4, loader="tma", splits=3).id == "wg128x128s4_tma_k3"
    assert WgmmaConfig(128, 128, 4, "swapped", "tma", "staged").id == "wg128x128s4_tma_st_bswap"
    # The TMA loader has no per-thread copies to divide evenly.
    assert WgmmaConfig(192, 128, 4, loader="tma").threads == 384


def test_tensor_map_specs_describe_the_operands():
    config = WgmmaConfig(128, 256, 4, loader="tma")
    a, b = wgmma.tensor_map_specs(200, 328, 96, 3, config)
    assert (a.dims, a.strides, a.box) == ((96, 200, 3), (192, 200 * 96 * 2), (64, 128, 1))
    assert (b.dims, b.strides, b.box) == ((328, 96, 3), (656, 96 * 328 * 2), (64, 64, 1))
    # The bytes one stage expects: one A box and four B boxes, as the kernel counts them.
    assert math.prod(a.box) * 2 + 4 * math.prod(b.box) * 2 == config.stage_bytes
    with pytest.raises(ValueError, match="multiples of 8"):
        wgmma.tensor_map_specs(200, 330, 96, 1, config)


# The Hopper family's shapes the probe never built (model/hopper/space.py allows them): three
# warpgroups 256 wide, four 192 wide, one 192 wide persistent, the deepest ring (8 stages),
# stream-K 192 wide; tails in M, N and K, a batch. Made through the family's configuration map.
def _family_case(workload, tile_m, tile_n, stages, tile_loop, sms=3):
    from pipetune.model.hopper.space import HopperSchedule
    from pipetune.workers.codegen.wgmma.family import config_of

    return workload, config_of(HopperSchedule(tile_m, tile_n, stages, tile_loop)), sms, False


FAMILY_CASES = [
    _family_case(gemm(200, 264, 200), 192, 256, 3, 0),
    _family_case(gemm(264, 200, 136), 256, 192, 3, 0),
    _family_case(bmm(2, 72, 200, 584), 64, 192, 6, 1),
    _family_case(gemm(70, 72, 1032), 64, 64, 8, 0),
    _family_case(gemm(130, 200, 520), 128, 192, 4, 2, sms=5),
]


def test_emulated_family_only_shapes_match_numpy(tmp_path):
    outcomes = emulate_all(_emulate_shared, FAMILY_CASES, tmp_path)
    assert_outcomes_match([(w, c) for w, c, _, _ in FAMILY_CASES], outcomes)


# ---- bfloat16 --------------------------------------------------------------------------------

# bfloat16 kernels of every kind (workload, config, SMs, blocks run last to first): the cp.async
# loader with the direct epilogue, the TMA loader with either epilogue, split-K (its reduction
# kernel rounds to bf16), persistent and stream-K. Their operands are bf16 bits, decoded as the
# kernel's own wgmma instruction says, and C must be the reference rounded to bf16 exactly (a
# fifth to two fifths of each case's sums lie past bf16's 8 bits: the final rounding is
# exercised, see cuda_emulator.OPERAND_RANGE).
BF16 = {"dtype": "bfloat16"}
BF16_CASES = [
    (gemm(130, 136, 200, **BF16), WgmmaConfig(128, 128, 3), 3, False),
    (bmm(2, 72, 64, 136, **BF16), WgmmaConfig(64, 128, 3, loader="tma"), 3, False),
    (gemm(70, 200, 136, **BF16), WgmmaConfig(64, 256, 3, "canonical", "tma", "staged"), 3, False),
    (gemm(70, 72, 328, **BF16), WgmmaConfig(64, 64, 6, loader="tma", splits=4), 3, False),
    (bmm(3, 72, 64, 136, **BF16), WgmmaConfig(64, 128, 4, **PERSISTENT), 3, False),
    (gemm(130, 136, 520, **BF16), WgmmaConfig(64, 128, 4, **STREAM_K), 4, True),
]


def test_emulated_bfloat16_wgmma_kernels_match_numpy(tmp_path):
    outcomes = emulate_all(_emulate_shared, BF16_CASES, tmp_path)
    assert_outcomes_match([(w, c) for w, c, _, _ in BF16_CASES], outcomes)


@pytest.mark.parametrize(
    "mutation",
    [
        # The instruction reads the bf16 operands as fp16.
        (".f32.bf16.bf16 ", ".f32.f16.f16 "),
        # The results rounded to fp16 and stored in C's bf16 slots.
        ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32"),
    ],
    ids=["wgmma-f16", "cvt-f16"],
)
def test_a_bfloat16_kernel_with_a_float16_type_word_is_caught(tmp_path, mutation):
    """The emulator decodes operands and encodes results as the kernel's own instructions say
    (cuda_emulator.element_defines), not as the workload says: one float16 word left in a
    bfloat16 kernel computes garbage here, as it would on hardware."""
    workload = gemm(130, 136, 200, **BF16)
    config = WgmmaConfig(64, 128, 4, loader="tma", epilogue="staged")
    code, stderr, c, ref = _emulate(workload, config, tmp_path, mutation)
    assert code == 0, stderr
    assert not np.array_equal(values_of(c), rounded(ref, "bfloat16"))


# ---- B stored N x K (gemm_nk, bmm_nk) ---------------------------------------------------------

# B K-major in shared memory, as A (workload, config, SMs, blocks run last to first): the cp.async
# loader, the TMA loader with either epilogue (rows of B past N land as zeros), split-K,
# persistent and stream-K; one to four warpgroups, 64 to 256 columns; tails in M, N and K; and
# bfloat16. The emulated wgmma reads B as the kernel's own instruction says (its trans-b
# immediate), so a kernel that lays B out one way and tells wgmma the other fails here.
NK = {"b_layout": "nk"}
NK_CASES = [
    (gemm(130, 136, 200, **NK), WgmmaConfig(128, 128, 3), 3, False),
    (gemm(264, 72, 136, **NK), WgmmaConfig(256, 64, 3), 3, False),
    (gemm(70, 200, 520, **NK), WgmmaConfig(64, 256, 4, loader="tma"), 3, False),
    (
        gemm(130, 200, 136, **NK),
        WgmmaConfig(128, 128, 4, loader="tma", epilogue="staged"),
        3,
        False,
    ),
    (gemm(70, 72, 328, **NK), WgmmaConfig(64, 64, 6, loader="tma", splits=4), 3, False),
    (gemm(200, 136, 200, **NK), WgmmaConfig(192, 128, 3, **PERSISTENT), 3, False),
    (gemm(130, 136, 520, **NK), WgmmaConfig(64, 128, 4, **STREAM_K), 4, True),
    (
        gemm(130, 136, 200, **NK, **BF16),
        WgmmaConfig(64, 128, 4, loader="tma", epilogue="staged"),
        3,
        False,
    ),
    # Batched (bmm_nk, attention's Q·Kᵀ): each entry's B at its own offset (cp.async) or
    # batch coordinate (TMA), the one block per tile kind and the persistent ones.
    (bmm(2, 72, 64, 136, **NK), WgmmaConfig(64, 128, 4), 3, False),
    (
        bmm(2, 136, 200, 72, **NK),
        WgmmaConfig(128, 128, 4, loader="tma", epilogue="staged"),
        3,
        True,
    ),
    (bmm(3, 72, 64, 136, **NK), WgmmaConfig(64, 128, 4, **PERSISTENT), 3, False),
    (bmm(3, 72, 64, 136, **NK), WgmmaConfig(64, 128, 4, **STREAM_K), 4, False),
]


def test_emulated_wgmma_kernels_of_b_stored_n_by_k_match_numpy(tmp_path):
    outcomes = emulate_all(_emulate_shared, NK_CASES, tmp_path)
    assert_outcomes_match([(w, c) for w, c, _, _ in NK_CASES], outcomes)


@pytest.mark.parametrize(
    ("config", "mutation"),
    [
        # wgmma told to transpose a K-major B.
        (WgmmaConfig(64, 128, 4, loader="tma"), ("p, 1, 1, 0, 0;", "p, 1, 1, 0, 1;")),
        # The k16 steps walking B's K as an N-major B's (16 lines on instead of 32 bytes).
        (WgmmaConfig(64, 128, 4, loader="tma"),
         ("smem_descriptor(stage_b + static_cast<unsigned>(ks * 32), 16u, 1024u)",
          "smem_descriptor(stage_b + static_cast<unsigned>(ks * 16 * 128), 16u, 1024u)")),
        # The cp.async loader reading B as if stored K x N.
        (WgmmaConfig(64, 128, 4),
         ("B + static_cast<long long>(gn) * K + gk", "B + static_cast<long long>(gk) * N + gn")),
    ],
    ids=["trans-b", "k-step", "copy-source"],
)  # fmt: skip
def test_broken_n_by_k_kernels_are_caught(tmp_path, config, mutation):
    """Each is caught by a fault (a read of a chunk no copy filled, a misaligned copy) or by
    the numbers."""
    code, stderr, c, ref = _emulate(gemm(130, 136, 200, **NK), config, tmp_path, mutation)
    assert code in (0, 3), stderr
    if code == 3:
        assert "EMULATOR:" in stderr
    else:
        assert not np.allclose(c.astype(np.float32), ref, rtol=2e-3, atol=2e-2)


def test_tensor_map_of_b_stored_n_by_k_is_one_box_of_the_blocks_rows():
    config = WgmmaConfig(128, 256, 4, loader="tma")
    _, b = wgmma.tensor_map_specs(200, 328, 96, 3, config, b_layout="nk")
    assert (b.dims, b.strides, b.box) == ((96, 328, 3), (192, 96 * 328 * 2), (64, 256, 1))
    # One A box and one B box: the bytes the kernel expects per stage.
    a, _ = wgmma.tensor_map_specs(200, 328, 96, 3, config, b_layout="nk")
    assert (math.prod(a.box) + math.prod(b.box)) * 2 == config.stage_bytes
    with pytest.raises(ValueError, match="b_layout"):
        wgmma.tensor_map_specs(200, 328, 96, 3, config, b_layout="kk")


def test_the_swapped_b_descriptor_reading_is_refused_for_a_k_major_b():
    with pytest.raises(ValueError, match="swapped B descriptor"):
        wgmma.generate("gemm_nk", WgmmaConfig(64, 128, 3, "swapped"))


# ---- bias + GELU in the staged epilogue ------------------------------------------------------

# C = gelu(A @ B + bias) (workload, config, SMs, blocks run last to first): either loader, one
# block per tile, persistent and stream-K (shares summed before the epilogue); both layouts of
# B, both forms of GELU; tails in M, N (bias columns past N) and K; several column tiles (the
# bias read at the tile's own columns); and bfloat16 (its bias widened as bf16).
STAGED = {"epilogue": "staged"}
BIAS_CASES = [
    (gemm_bias_gelu(130, 200, 136), WgmmaConfig(64, 128, 4, **STAGED), 3, False),
    (
        gemm_bias_gelu(130, 200, 136, b_layout="nk", approximate="tanh"),
        WgmmaConfig(128, 128, 4, loader="tma", **STAGED),
        3,
        False,
    ),
    (
        gemm_bias_gelu(200, 136, 200, approximate="tanh"),
        WgmmaConfig(64, 64, 6, **PERSISTENT),
        3,
        False,
    ),
    (gemm_bias_gelu(130, 136, 520, b_layout="nk"), WgmmaConfig(64, 128, 4, **STREAM_K), 4, True),
    (
        gemm_bias_gelu(130, 200, 136, b_layout="nk", dtype="bfloat16"),
        WgmmaConfig(64, 128, 4, loader="tma", **STAGED),
        3,
        False,
    ),
]


def test_emulated_bias_gelu_wgmma_kernels_match_the_reference(tmp_path):
    outcomes = emulate_all(_emulate_shared, BIAS_CASES, tmp_path)
    assert_outcomes_match([(w, c) for w, c, _, _ in BIAS_CASES], outcomes)


def _off_gelu_reference(workload, c, ref) -> bool:
    """Whether some output lies outside the bias + GELU check's tolerance."""
    tol = gelu_tolerance(ref, np.abs(ref) + 1, workload.dtype)
    return bool((np.abs(values_of(c).astype(np.float64) - ref) > tol).any())


@pytest.mark.parametrize(
    ("dtype", "mutation"),
    [
        # The bias left out.
        ("float16", ("return col < N ? widen_elem(bias[col]) : 0.f;", "return 0.f;")),
        # The next column pair's bias.
        ("float16", ("bias_at(bn0 + col)", "bias_at(bn0 + col + 2)")),
        # The bias of the tile's column instead of C's (the same in the first column tile).
        ("float16", ("bias_at(bn0 + col)", "bias_at(col)")),
        # GELU's other form whatever the argument says.
        ("float16", ("const bool tanh_form = gelu_tanh != 0;", "const bool tanh_form = true;")),
        # A bf16 kernel that widens its bias as fp16.
        ("bfloat16", ("return __uint_as_float((unsigned)h << 16);", "return 0.f;  // cvt.f32.f16")),
    ],
    ids=["no-bias", "next-column", "tile-column", "one-form", "bf16-as-fp16"],
)
def test_emulator_catches_a_broken_wgmma_bias_gelu_epilogue(tmp_path, dtype, mutation):
    workload = gemm_bias_gelu(130, 200, 136, dtype=dtype)
    config = WgmmaConfig(64, 128, 4, loader="tma", **STAGED)
    code, stderr, c, ref = _emulate(workload, config, tmp_path, mutation)
    assert code == 0, stderr
    assert _off_gelu_reference(workload, c, ref)


def test_the_bias_gelu_epilogue_is_the_staged_ones():
    for config in (WgmmaConfig(64, 128, 4), WgmmaConfig(64, 128, 4, loader="tma", splits=2)):
        with pytest.raises(ValueError, match="staged epilogue"):
            wgmma.generate("gemm_bias_gelu_kn", config)


# ---- the SwiGLU in the staged epilogue -------------------------------------------------------

# C = silu(A @ W_gate) · (A @ W_up), B's 2n columns interleaving gate and up in groups of 8
# (workload, config, SMs, blocks run last to first): either loader, one block per tile,
# persistent and stream-K, both layouts of B; tails in M, in the GEMM's 2n columns (a 16-column
# group wholly past them) and in K; several column tiles (C's columns from bn0 / 2); bfloat16.
SWIGLU_CASES = [
    (gemm_swiglu(130, 104, 136), WgmmaConfig(64, 128, 4, **STAGED), 3, False),
    (
        gemm_swiglu(130, 104, 200, b_layout="nk"),
        WgmmaConfig(128, 128, 4, loader="tma", **STAGED),
        3,
        False,
    ),
    (gemm_swiglu(200, 72, 200), WgmmaConfig(64, 64, 6, **PERSISTENT), 3, False),
    (gemm_swiglu(130, 72, 520, b_layout="nk"), WgmmaConfig(64, 128, 4, **STREAM_K), 4, True),
    (
        gemm_swiglu(130, 104, 136, dtype="bfloat16"),
        WgmmaConfig(64, 256, 3, loader="tma", **STAGED),
        3,
        False,
    ),
]


def test_emulated_swiglu_wgmma_kernels_match_the_reference(tmp_path):
    outcomes = emulate_all(_emulate_shared, SWIGLU_CASES, tmp_path)
    assert_outcomes_match([(w, c) for w, c, _, _ in SWIGLU_CASES], outcomes)


@pytest.mark.parametrize(
    "mutation",
    [
        # Gate and up taken the other way round.
        ("g0 = acc[i + h], g1 = acc[i + h + 1], u0 = acc[i + h + 4], u1 = acc[i + h + 5];",
         "u0 = acc[i + h], u1 = acc[i + h + 1], g0 = acc[i + h + 4], g1 = acc[i + h + 5];"),
        # C's columns from the tile's own instead of bn0 / 2 on.
        ("* NC + bn0 / 2 + col)", "* NC + col)"),
        # A C column per GEMM column pair, not per gate column.
        ("col / 16 * 8 + col % 8", "col / 2"),
    ],
    ids=["gate-up-swapped", "tile-columns", "column-map"],
)  # fmt: skip
def test_emulator_catches_a_broken_wgmma_swiglu_epilogue(tmp_path, mutation):
    workload = gemm_swiglu(130, 104, 136)
    config = WgmmaConfig(64, 128, 4, loader="tma", **STAGED)
    code, stderr, c, ref = _emulate(workload, config, tmp_path, mutation)
    assert code in (0, 3), stderr
    if code == 0:
        tol = swiglu_tolerance(ref, workload.dtype)
        values = values_of(c).astype(np.float64)
        assert np.isnan(values).any() or (np.abs(values - ref) > tol).any()
