"""The kernel's index math, in Python, mirroring the generated CUDA helpers one for one.

Why a mirror: the kernels cannot run on a machine without a GPU, but their index math can.
The tests run these functions in numpy simulations (the swizzle is conflict-free, the
loader covers a tile exactly once, the conv loader equals im2col, a whole block tile computed
through ldmatrix/mma fragment semantics equals A @ B), and a host build of the generated
C++ helpers (g++, where present) is checked against these functions value for value.

All functions work element-wise on Python ints and on numpy integer arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.model.space import MMA_TILE, VECTOR_ELEMS, Schedule

CHUNK_BYTES = 16  # one cp.async / one ldmatrix row address: 8 fp16 values


@dataclass(frozen=True)
class TileGeometry:
    """Compile-time constants of one schedule, named as in the generated source."""

    bm: int
    bn: int
    bk: int
    wm: int  # warp tile rows
    wn: int  # warp tile columns
    warps_m: int
    warps_n: int
    mt: int  # 16-row MMA tiles per warp
    nt: int  # 16-column tiles per warp (two m16n8 MMAs each)
    ksteps: int  # k16 steps per shared-memory tile
    stages: int
    reg_stages: int
    threads: int

    @classmethod
    def of(cls, s: Schedule) -> TileGeometry:
        return cls(
            bm=s.block_m,
            bn=s.block_n,
            bk=s.block_k,
            wm=MMA_TILE * s.warp_row_tiles,
            wn=MMA_TILE * s.warp_col_tiles,
            warps_m=s.block_row_warps,
            warps_n=s.block_col_warps,
            mt=s.warp_row_tiles,
            nt=s.warp_col_tiles,
            ksteps=s.chunk,
            stages=s.smem_stages,
            reg_stages=s.reg_stages,
            threads=s.threads,
        )

    # Shared-memory tiles, in 16-byte chunks per row ("CPR").
    @property
    def a_cpr(self) -> int:
        """A tile: BM rows of BK halves (k contiguous)."""
        return self.bk // VECTOR_ELEMS

    def b_rows(self, b_kn: bool) -> int:
        return self.bk if b_kn else self.bn

    def b_cpr(self, b_kn: bool) -> int:
        """B tile: BK rows of BN halves for K×N operands, else BN rows of BK halves."""
        return (self.bn if b_kn else self.bk) // VECTOR_ELEMS

    @property
    def a_stage_bytes(self) -> int:
        return self.bm * self.bk * 2

    @property
    def b_stage_bytes(self) -> int:
        return self.bn * self.bk * 2

    @property
    def smem_bytes(self) -> int:
        return self.stages * (self.a_stage_bytes + self.b_stage_bytes)


def swizzle(row: Any, col: Any, cpr: int) -> Any:
    """Physical 16-byte chunk index of logical chunk (row, col) in a tile of cpr chunks a row.

    Shared memory has 32 banks of 4 bytes: one 128-byte line = 8 chunks. ldmatrix reads
    one chunk from each of 8 consecutive rows per 8x8 matrix; unswizzled, rows whose
    starts are a multiple of 128 bytes apart hit the same banks (8-way conflict when a row is
    128 bytes or more). The swizzle XORs the chunk's slot within its 128-byte line (3 bits)
    with the line's index modulo 8:
    - cpr >= 8 (a row is one or more whole lines): col ^ (row % 8), within the row;
    - cpr < 8 (8/cpr rows share a line): on the linear chunk index L = row*cpr + col,
      L ^ ((L >> 3) % 8).
    Both are bijections within each 128-byte line (only the low 3 bits change), and the
    8 row addresses of one ldmatrix matrix (8 consecutive rows starting at a multiple of 8,
    same logical col) land in 8 different slots: conflict-free.
    """
    if cpr >= 8:
        return row * cpr + (col ^ (row & 7))
    linear = row * cpr + col
    return linear ^ ((linear >> 3) & 7)


def loader_rows_cols(tid: Any, it: Any, cpr: int, threads: int) -> tuple[Any, Any]:
    """Tile (row, 16-byte chunk column) that thread tid copies at loader iteration it.

    Chunks are numbered row-major, thread tid takes chunks tid, tid+threads, ...: adjacent
    threads read adjacent 16 bytes of global memory (coalesced). threads is a multiple of
    cpr (both powers of two, threads >= 32 >= cpr), so a thread keeps one column.
    """
    return tid // cpr + it * (threads // cpr), tid % cpr


def loader_iters(rows: int, cpr: int, threads: int) -> int:
    """Loader iterations per tile (ceil: a partial last iteration is guarded)."""
    return -(-rows * cpr // threads)


def loader_chunk(tid: Any, it: Any, cpr: int, threads: int, period: int) -> Any:
    """Physical smem chunk of loader iteration it, in the periodic form the kernel uses."""
    row, col = loader_rows_cols(tid, it % period, cpr, threads)
    return swizzle(row, col, cpr) + (it // period) * (period * (threads // cpr) * cpr)


def swizzle_period(rows: int, cpr: int, threads: int) -> int:
    """Smallest period P with loader_chunk(.., P) == swizzle of the true row, for all threads.

    The pattern always repeats once the rows advance by a multiple of 64 (a multiple of 8
    rows and of 8 lines), so the search ends by P = iterations.
    """
    iters = loader_iters(rows, cpr, threads)
    tid = np.arange(threads)[:, None]
    it = np.arange(iters)[None, :]
    row, col = loader_rows_cols(tid, it, cpr, threads)
    exact = swizzle(row, col, cpr)
    period = 1
    while period < iters and not np.array_equal(loader_chunk(tid, it, cpr, threads, period), exact):
        period *= 2
    return period


def warp_origin(warp: Any, g: TileGeometry) -> tuple[Any, Any]:
    """Row and column of a warp's tile in the block tile (warps row-major over N)."""
    return (warp // g.warps_n) * g.wm, (warp % g.warps_n) * g.wn


def ldmatrix_a(lane: Any, wm0: Any, i: Any, ks: Any) -> tuple[Any, Any]:
    """(row, chunk col) lane addresses for ldmatrix.x4 of A's 16x16 tile i at k-step ks.

    Matrices 0..3 = rows 0-7/k 0-7, rows 8-15/k 0-7, rows 0-7/k 8-15, rows 8-15/k 8-15:
    exactly the registers a0..a3 of mma.m16n8k16's A fragment.
    """
    return wm0 + i * 16 + (lane & 15), ks * 2 + (lane >> 4)


def ldmatrix_b_kn(lane: Any, wn0: Any, j: Any, ks: Any) -> tuple[Any, Any]:
    """Lane addresses for ldmatrix.x4.trans of a K×N smem tile (rows k, chunks of n).

    Matrices: k 0-7/n 0-7, k 8-15/n 0-7, k 0-7/n 8-15, k 8-15/n 8-15; .trans hands lane l the
    (k = 2(l%4)+{0,1}, n = l/4) pair: registers b0,b1 of the first n8 MMA, then of the second.
    """
    return ks * 16 + (lane & 15), (wn0 + j * 16) // 8 + (lane >> 4)


def ldmatrix_b_nk(lane: Any, wn0: Any, j: Any, ks: Any) -> tuple[Any, Any]:
    """Lane addresses for ldmatrix.x4 (no .trans) of an N×K smem tile (rows n, chunks of k).

    Matrices: n 0-7/k 0-7, n 0-7/k 8-15, n 8-15/k 0-7, n 8-15/k 8-15: the same register
    order as ldmatrix_b_kn.
    """
    return wn0 + j * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)


def acc_position(lane: Any, reg: Any) -> tuple[Any, Any]:
    """(row, col) inside one m16n8 accumulator tile of f32 register reg (0..3) of a lane."""
    return (lane >> 2) + 8 * (reg >> 1), 2 * (lane & 3) + (reg & 1)


def fast_divmod_params(d: int) -> tuple[int, int]:
    """(multiplier, shift) for dividing n < 2^31 by d with a 32-bit mul.hi (d >= 1).

    p = 31 + ceil(log2 d), m = ceil(2^p / d) < 2^32; n / d = mulhi(n, m) >> (p - 32).
    d == 1 is flagged by multiplier 0 (the quotient is n itself).
    """
    if d < 1:
        raise ValueError("divisor must be positive")
    if d == 1:
        return 0, 0
    log2 = (d - 1).bit_length()  # ceil(log2 d) for d >= 2
    p = 31 + log2
    return ((1 << p) + d - 1) // d, p - 32


def fast_div(n: Any, d: int) -> Any:
    mul, shift = fast_divmod_params(d)
    if mul == 0:
        return n
    return ((n * mul) >> 32) >> shift


def conv_a_coords(
    m: Any,
    k: Any,
    *,
    out_dims: tuple[int, ...],
    filt: tuple[int, ...],
    c: int,
    stride: int,
    pad: int,
) -> tuple[Any, Any]:
    """Implicit-GEMM A coordinates: GEMM (row m, col k) -> (batch n, input spatial coords).

    m = ((n*O + o)*P + p)*Q + q over the output (O absent in 2-D), k = ((t*R + r)*S + s)*C + c
    over the filter; the input coordinate along each spatial axis is out*stride - pad + f.
    Returns (n, [input coords per axis]) with the channel as the last entry of the list.
    """
    rest = m
    out_coords = []
    for size in reversed(out_dims):
        out_coords.append(rest % size)
        rest = rest // size
    n = rest
    out_coords.reverse()
    channel = k % c
    rest = k // c
    filt_coords = []
    for size in reversed(filt):
        filt_coords.append(rest % size)
        rest = rest // size
    filt_coords.reverse()
    coords = [o * stride - pad + f for o, f in zip(out_coords, filt_coords, strict=True)]
    return n, [*coords, channel]
