"""The generated kernels, run on the CPU: g++ builds the real helpers and kernel body with
the PTX wrappers swapped for an emulation of their ISA semantics, and the results must
match numpy's matmul / convolution.

What the emulator checks (no GPU needed; skipped where no g++ is installed), besides what
tests/cuda_emulator.py checks for every kernel:
- ldmatrix and mma are warp-collective (lanes publish operands, meet at a warp barrier, and
  each lane builds its registers from everyone's operands exactly as the PTX ISA's fragment
  tables define them);
- ldmatrix reads only chunks whose copy landed before a barrier, and marks them read for the
  race detector;
- the mma decodes its operands, and pack_half2 encodes C, in the types the kernel's own mma
  and cvt instructions declare (fp16 or bf16), so kernels whose parts disagree fail.

What it cannot check: timing, real bank conflicts, and the PTX encodings themselves (NVRTC
compiles those in test_compile_kernels.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import (
    BIAS_SHIM,
    COMMON_SHIM,
    READ_FILE,
    assert_outcomes_match,
    build_and_run,
    build_harness,
    element_defines,
    emulate_all,
    gelu_tolerance,
    harness_source,
    rounded,
    swiglu_tolerance,
    values_of,
)

from pipetune.model.space import Schedule
from pipetune.model.workloads import (
    AnyWorkload,
    bmm,
    conv2d,
    conv3d,
    gemm,
    gemm_bias_gelu,
    gemm_swiglu,
    parse_workload,
)
from pipetune.workers.codegen import generate, launch
from pipetune.workers.codegen.generator import source_parts
from pipetune.workers.codegen.variants import BIAS_GELU_VARIANTS
from pipetune.workers.runners.elements import narrow, widen

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

// An A or B element's value, decoded as the kernel's mma instruction declares its operands
// (PT_MMA_BF16: element_defines), whatever the workload's type.
inline float mma_operand(unsigned short bits) {
#if PT_MMA_BF16
  return b2f(bits);
#else
  return h2f(bits);
#endif
}

// mma.m16n8k16.row.col f32.f16.f16.f32 (or .bf16.bf16) with the ISA's fragment layouts
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
          mma_operand((unsigned short)(s.a[t][i / 2] >> (16 * (i % 2))));
    for (int i = 0; i < 4; ++i)
      B[2 * tg + (i % 2) + 8 * (i / 2)][g] =
          mma_operand((unsigned short)(s.b[t][i / 2] >> (16 * (i % 2))));
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


def _emulate(
    workload: AnyWorkload,
    schedule: Schedule,
    tmp: Path,
    mutate: tuple[str, str] | None = None,
) -> tuple[int, str, np.ndarray | None, np.ndarray]:
    """Build and run the emulator; (returncode, stderr, C or None, reference). ``mutate``
    replaces a text of the kernel body, or else of the PTX wrappers ("device": the emulator
    replaces them, but reads the element types they declare)."""
    kernel = generate(workload, schedule)
    parts = dict(source_parts(kernel.variant, schedule, workload.dtype))
    if mutate is not None:
        old, new = mutate
        part = "kernel" if old in parts["kernel"] else "device"
        assert old in parts[part]
        parts[part] = parts[part].replace(old, new)
    grid, scalars = launch(kernel, workload)
    bias = BIAS_SHIM if kernel.variant in BIAS_GELU_VARIANTS else ""
    source = harness_source(
        element_defines(parts["device"]) + COMMON_SHIM + MMA_SYNC_SHIM + bias,
        parts["helpers"] + parts["kernel"], kernel.name, kernel.threads, len(scalars),
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
    # Each B stored N x K (attention's Q·Kᵀ): each batch entry's B rows at its own offset.
    (bmm(3, 20, 24, 40, b_layout="nk"), [_s(1, 1, 1, 1, 1, 2, 2), _s(2, 2, 1, 1, 2, 3, 1)]),
    # The fused GEMM + SwiGLU: 2n = 80 interleaved columns, so N-tile tails, warp tiles of
    # one and several gate/up pairs, both B layouts.
    (
        gemm_swiglu(37, 40, 72),
        [_s(1, 1, 1, 1, 1, 2, 1), _s(2, 2, 1, 2, 2, 3, 2), _s(1, 1, 2, 4, 2, 4, 2)],
    ),
    (gemm_swiglu(20, 24, 40, b_layout="nk"), [_s(1, 2, 1, 1, 1, 2, 2), _s(2, 1, 2, 2, 1, 3, 1)]),
    # The GEMM with bias + GELU in its epilogue: both forms, both layouts, N-tile tails (N =
    # 40 and 24 against 32- and 64-wide tiles) and M tails.
    (
        gemm_bias_gelu(37, 40, 72),
        [_s(1, 1, 1, 1, 1, 2, 1), _s(2, 2, 1, 2, 2, 3, 2), _s(1, 1, 2, 4, 2, 4, 2)],
    ),
    (
        gemm_bias_gelu(20, 24, 40, b_layout="nk", approximate="tanh"),
        [_s(1, 2, 1, 1, 1, 2, 2), _s(2, 1, 2, 2, 1, 3, 1)],
    ),
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


@pytest.mark.parametrize(
    ("dtype", "mutation"),
    [
        # The bias left out.
        ("float16", ("acc[i][j][2 * h] + b0, tanh_form", "acc[i][j][2 * h], tanh_form")),
        # The next column pair's bias.
        ("float16", ("(bias + col)", "(bias + col + 2)")),
        # The two values of a bias pair swapped.
        ("float16", ("(pair & 0xFFFFu)", "(pair >> 16)")),
        # GELU's other form (the tanh form's argument ignored).
        ("float16", ("const bool tanh_form = gelu_tanh != 0;", "const bool tanh_form = true;")),
        # A bf16 kernel that widens its bias as fp16.
        ("bfloat16", ("return __uint_as_float((unsigned)h << 16);", "return 0.f;  // cvt.f32.f16")),
    ],
)
def test_emulator_catches_a_broken_bias_gelu_epilogue(tmp_path, dtype, mutation):
    """The bias + GELU epilogue's check fails a kernel that adds no bias, another column's,
    applies GELU's other form, or widens a bf16 bias as fp16."""
    workload = gemm_bias_gelu(37, 40, 72, dtype=dtype)
    code, stderr, c, ref = _emulate(workload, _s(2, 2, 1, 2, 2, 3, 2), tmp_path, mutation)
    if code == 0:
        tol = gelu_tolerance(ref, np.abs(ref) + 1, dtype)
        values = values_of(c).astype(np.float64)
        assert np.isnan(values).any() or (np.abs(values - ref) > tol).any()
    else:
        assert code == 3 and "outside" in stderr, stderr


def _bf16(workload: AnyWorkload) -> AnyWorkload:
    """The workload on bfloat16 operands (conv2d() and conv3d() take no dtype)."""
    return parse_workload({**workload.model_dump(), "dtype": "bfloat16"})


# The bfloat16 kernels: the same text as fp16's but for the storage type, the mma operand
# type and the output conversion, so a few schedules per operator (tails in M, N and K, both
# B layouts, register double buffering, BK beyond the K tail) cover what differs.
BF16_CASES = [
    (gemm(70, 40, 200, dtype="bfloat16"), [_s(2, 1, 1, 2, 1, 3, 2), _s(1, 2, 2, 1, 8, 2, 2)]),
    (gemm(33, 48, 72, b_layout="nk", dtype="bfloat16"), [_s(2, 2, 1, 1, 4, 2, 2)]),
    (bmm(3, 20, 24, 40, dtype="bfloat16"), [_s(1, 1, 1, 1, 1, 2, 2)]),
    (_bf16(conv2d(2, 7, 6, 16, 24, 3, 3, stride=2, pad=1)), [_s(2, 1, 1, 2, 4, 2, 1)]),
    (_bf16(conv3d(1, 4, 5, 5, 8, 16, 3, 3, 3, pad=1)), [_s(2, 1, 1, 1, 2, 4, 2)]),
    (gemm_swiglu(37, 40, 72, dtype="bfloat16"), [_s(2, 2, 1, 2, 2, 3, 2)]),
    (gemm_swiglu(20, 24, 40, b_layout="nk", dtype="bfloat16"), [_s(1, 2, 1, 1, 1, 2, 2)]),
    (gemm_bias_gelu(37, 40, 72, dtype="bfloat16"), [_s(2, 2, 1, 2, 2, 3, 2)]),
    (
        gemm_bias_gelu(20, 24, 40, b_layout="nk", approximate="tanh", dtype="bfloat16"),
        [_s(1, 2, 1, 1, 1, 2, 2)],
    ),
]


def test_emulated_bf16_kernels_match_numpy(tmp_path: Path) -> None:
    jobs = [(w, s) for w, schedules in BF16_CASES for s in schedules]
    outcomes = emulate_all(_emulate, jobs, tmp_path)
    assert_outcomes_match(jobs, outcomes)
    # Not vacuous: C comes back as bf16 bits, and the exact comparisons rounded outputs that
    # need more than bf16's 8 significant bits (fp16 would have held them exactly).
    (workload, _), (_, _, c, ref) = jobs[0], outcomes[0]
    assert c.dtype == np.uint16
    assert (rounded(ref, workload.dtype) != ref).any()


@pytest.mark.parametrize(
    ("dtype", "mutation"),
    [
        # A bf16 kernel whose output conversion is fp16's.
        ("bfloat16", ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32")),
        # A bf16 kernel whose mma reads its bf16 operands as fp16.
        ("bfloat16", (".f32.bf16.bf16.f32", ".f32.f16.f16.f32")),
        # An fp16 kernel whose mma reads its fp16 operands as bf16.
        ("float16", (".f32.f16.f16.f32", ".f32.bf16.bf16.f32")),
    ],
)
def test_emulator_catches_mixed_element_types(
    tmp_path: Path, dtype: str, mutation: tuple[str, str]
) -> None:
    """The emulated mma decodes and pack_half2 encodes as the kernel's own instructions say,
    not as the workload says: a kernel whose parts disagree on the element type computes
    garbage, and the check that passes the consistent kernels fails it."""
    workload = gemm(70, 40, 88, dtype=dtype)
    code, stderr, c, ref = _emulate(workload, _s(2, 1, 1, 2, 2, 3, 2), tmp_path, mutation)
    assert code == 0, stderr
    values = values_of(c)
    assert not np.isnan(values).any()  # every element written: the types alone are wrong
    assert (values != rounded(ref, dtype)).mean() > 0.5


def test_emulator_catches_a_bf16_swiglu_with_fp16_conversion(tmp_path: Path) -> None:
    """bf16's SwiGLU tolerance (2^-8 relative) still fails a kernel that stores fp16 bits."""
    workload = gemm_swiglu(37, 40, 72, dtype="bfloat16")
    mutation = ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32")
    code, stderr, c, ref = _emulate(workload, _s(2, 2, 1, 2, 2, 3, 2), tmp_path, mutation)
    assert code == 0, stderr
    off = np.abs(values_of(c).astype(np.float64) - ref) > swiglu_tolerance(ref, "bfloat16")
    assert off.any()


BF16_CONVERSION_MAIN = r"""
int main(int argc, char** argv) {
  // argv: floats.bin (float32, an even count) words.bin (pack_half2's words) widened.bin
  std::vector<unsigned char> in = read_file(argv[1]);
  std::vector<float> x(in.size() / 4);
  std::memcpy(x.data(), in.data(), in.size());
  std::vector<unsigned> words(x.size() / 2);
  for (size_t i = 0; i < words.size(); ++i) words[i] = pt::pack_half2(x[2 * i], x[2 * i + 1]);
  std::vector<float> widened(1 << 16);  // every bf16 bit pattern, decoded
  for (unsigned b = 0; b < (1u << 16); ++b) widened[b] = b2f((unsigned short)b);
  FILE* f = std::fopen(argv[2], "wb");
  std::fwrite(words.data(), 4, words.size(), f);
  std::fclose(f);
  f = std::fopen(argv[3], "wb");
  std::fwrite(widened.data(), 4, widened.size(), f);
  std::fclose(f);
  return 0;
}
"""


def test_emulated_bf16_conversions_match_the_host(tmp_path: Path) -> None:
    """The shim's bf16 conversions are the host's (runners/elements.py, which the reference
    rounds with): round to nearest even on ties, carries into the exponent, overflow to
    infinity, subnormals and NaN; b2f on every bit pattern. lo lands in the low half."""
    rng = np.random.default_rng(3)
    special = np.array(
        [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x3FFF8000, 0x7F7FFFFF, 0x7F7F8000,
         0x7F7F7FFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0x00000000,
         0x80000000, 0x00008000, 0x00018000, 0x007FFFFF, 0x807F8000, 0xC1000000],
        dtype=np.uint32,
    )  # fmt: skip
    bits = np.concatenate([special, rng.integers(0, 2**32, 20000, dtype=np.uint32)])
    x = bits.view(np.float32)
    x.tofile(tmp_path / "floats.bin")
    exe = build_harness(
        "#define PT_CVT_BF16 1\n" + COMMON_SHIM + READ_FILE + BF16_CONVERSION_MAIN, tmp_path
    )
    run = subprocess.run(
        [str(exe), *(str(tmp_path / n) for n in ("floats.bin", "words.bin", "widened.bin"))],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    words = np.fromfile(tmp_path / "words.bin", dtype=np.uint32)
    got = np.stack([words & 0xFFFF, words >> 16], axis=1).reshape(-1).astype(np.uint16)
    want = narrow(np, x, "bfloat16")
    nan = np.isnan(x)
    # NaN's payload is each side's own (the shim's cvt.rn gives the canonical 0x7FFF).
    assert np.isnan(widen(np, got[nan])).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])
    every = np.arange(1 << 16, dtype=np.uint16)
    widened = np.fromfile(tmp_path / "widened.bin", dtype=np.uint32)
    np.testing.assert_array_equal(widened, widen(np, every).view(np.uint32))
