"""The wgmma probe kernel (workers/codegen/wgmma.py), run on the CPU by the emulator of
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

What it cannot check: the proxy fence (``fence.proxy.async``) and the real hardware's reading
of the descriptors; a GPU settles those (benchmarks/wgmma_probe.py).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from cuda_emulator import (
    COMMON_SHIM,
    assert_outcomes_match,
    build_and_run,
    emulate_all,
    harness_source,
)

from pipetune.model.workloads import bmm, gemm
from pipetune.workers.codegen import wgmma
from pipetune.workers.codegen.wgmma import WgmmaConfig
from pipetune.workers.compile import compile_source

WGMMA_SHIM = r"""
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
inline unsigned swizzled(unsigned a) { return a ^ (((a >> 7) & 7u) << 4); }
// Element (row, k) of a K-major operand; element (mn, k) of an MN-major one (fp16, T = 8).
inline unsigned k_major(const Descriptor& d, int row, int k) {
  return swizzled(d.start + (row % 8) * 128 + (row / 8) * d.stride + (k % 8) * 2 + (k / 8) * 16);
}
inline unsigned mn_major(const Descriptor& d, int mn, int k) {
  return swizzled(d.start + (mn % 64) * 2 + (mn / 64) * d.leading + (k % 8) * 128 +
                  (k / 8) * d.stride);
}
inline float smem_f(unsigned addr) {
  if (addr + 2 > g_smem_bytes) fail("wgmma reads past shared memory", addr, g_smem_bytes);
  unsigned short v; std::memcpy(&v, pt_smem + addr, 2); return h2f(v);
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
      op.chunks.push_back(mn_major(op.b, col, k) / 16);
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
          sum += smem_f(k_major(op.a, row, k)) * smem_f(mn_major(op.b, col, k));
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

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")


def _emulate(workload, config: WgmmaConfig, tmp, mutate=None):
    kernel = wgmma.generate(workload, config)
    parts = wgmma.source_parts(kernel.variant, config)
    body = parts["kernel"]
    if mutate is not None:
        old, new = mutate
        assert old in body
        body = body.replace(old, new)
    grid, scalars = wgmma.launch(kernel, workload)
    source = harness_source(
        "#include <algorithm>\n" + COMMON_SHIM + WGMMA_SHIM,
        parts["helpers"] + body,
        kernel.name,
        kernel.threads,
        len(scalars),
    )
    return build_and_run(source, tmp, workload, grid, kernel.smem_bytes, scalars)


# Tails in M, N and K; one, two and four warpgroups; three to five stages (the ring wraps).
CASES = [
    (gemm(130, 136, 200), WgmmaConfig(128, 128, 3)),
    (gemm(130, 136, 200), WgmmaConfig(128, 128, 5)),
    (gemm(70, 200, 520), WgmmaConfig(64, 256, 4)),
    (bmm(2, 72, 64, 136), WgmmaConfig(64, 128, 4)),
    (gemm(264, 72, 136), WgmmaConfig(256, 64, 3)),
    (gemm(130, 72, 200), WgmmaConfig(128, 64, 4)),
]


def test_emulated_wgmma_kernels_match_numpy(tmp_path):
    assert_outcomes_match(CASES, emulate_all(_emulate, CASES, tmp_path))


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
    for variant in wgmma.VARIANTS:
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
