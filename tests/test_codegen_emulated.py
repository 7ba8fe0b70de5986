"""The generated kernels, run on the CPU: g++ builds the real helpers and kernel body with
the PTX wrappers swapped for an emulation of their ISA semantics, and the results must
match numpy's matmul / convolution.

What the emulator checks (no GPU needed; skipped where no g++ is installed), besides what
tests/cuda_emulator.py checks for every kernel:
- ldmatrix and mma are warp-collective (lanes publish operands, meet at a warp barrier, and
  each lane builds its registers from everyone's operands exactly as the PTX ISA's fragment
  tables define them);
- ldmatrix reads only chunks whose copy landed before a barrier, and marks them read for the
  race detector.

What it cannot check: timing, real bank conflicts, and the PTX encodings themselves (NVRTC
compiles those in test_compile_kernels.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import (
    COMMON_SHIM,
    assert_outcomes_match,
    build_and_run,
    emulate_all,
    harness_source,
)

from pipetune.model.space import Schedule
from pipetune.model.workloads import AnyWorkload, bmm, conv2d, conv3d, gemm, gemm_swiglu
from pipetune.workers.codegen import generate, launch
from pipetune.workers.codegen.generator import source_parts

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")

MMA_SYNC_SHIM = r"""
namespace pt {
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

}  // namespace pt
"""


def _emulate(workload: AnyWorkload, schedule: Schedule, tmp: Path, mutate=None):
    """Build and run the emulator; (returncode, stderr, C or None, reference)."""
    kernel = generate(workload, schedule)
    parts = dict(source_parts(kernel.variant, schedule))
    if mutate is not None:
        old, new = mutate
        assert old in parts["kernel"]
        parts["kernel"] = parts["kernel"].replace(old, new)
    grid, scalars = launch(kernel, workload)
    source = harness_source(
        COMMON_SHIM + MMA_SYNC_SHIM, parts["helpers"] + parts["kernel"], kernel.name,
        kernel.threads, len(scalars),
    )  # fmt: skip
    return build_and_run(source, tmp, workload, grid, kernel.smem_bytes, scalars)


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
    # The fused GEMM + SwiGLU: 2n = 80 interleaved columns, so N-tile tails, warp tiles of
    # one and several gate/up pairs, both B layouts.
    (
        gemm_swiglu(37, 40, 72),
        [_s(1, 1, 1, 1, 1, 2, 1), _s(2, 2, 1, 2, 2, 3, 2), _s(1, 1, 2, 4, 2, 4, 2)],
    ),
    (gemm_swiglu(20, 24, 40, b_layout="nk"), [_s(1, 2, 1, 1, 1, 2, 2), _s(2, 1, 2, 2, 1, 3, 1)]),
    (
        conv2d(2, 7, 6, 16, 24, 3, 3, stride=2, pad=1),
        [_s(1, 1, 1, 1, 2, 3, 2), _s(2, 1, 1, 2, 4, 2, 1), _s(1, 1, 2, 1, 1, 6, 2)],
    ),
    (conv3d(1, 4, 5, 5, 8, 16, 3, 3, 3, pad=1), [_s(2, 1, 1, 1, 2, 4, 2)]),
    (conv3d(2, 5, 6, 4, 8, 16, 3, 3, 2, stride=2, pad=1), [_s(1, 1, 2, 1, 1, 1, 1)]),
]


def test_emulated_kernels_match_numpy(tmp_path):
    jobs = [(w, s) for w, schedules in CASES for s in schedules]
    assert_outcomes_match(jobs, emulate_all(_emulate, jobs, tmp_path))


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


@pytest.mark.parametrize(
    "mutation",
    [
        # Gate and up read from each other's n8 tile.
        ("const float* g = &acc[i][2 * t][2 * h];", "const float* g = &acc[i][2 * t + 1][2 * h];"),
        # C's rows taken as wide as the GEMM's (2n), not n.
        ("const int NC = N / 2;", "const int NC = N;"),
        # The output column of the gate's, not the pair's.
        ("const int c = (bn0 + wn0) / 2 + t * 8 + col;", "const int c = bn0 + wn0 + t * 8 + col;"),
    ],
)
def test_emulator_catches_a_broken_swiglu_epilogue(tmp_path, mutation):
    """The fused epilogue's checks fail kernels that gate the wrong pairs or store them in
    the wrong place (a wrong result, an element never written, or a store outside C)."""
    workload, schedule = gemm_swiglu(37, 40, 72), _s(2, 2, 1, 2, 2, 3, 2)
    code, stderr, c, ref = _emulate(workload, schedule, tmp_path, mutation)
    if code == 0:
        tol = (2.0**-11 + 2.0**-18) * np.abs(ref) + 2.0**-24
        assert np.isnan(c).any() or (np.abs(c.astype(np.float64) - ref) > tol).any()
    else:
        assert code == 3 and "store outside C" in stderr, stderr
