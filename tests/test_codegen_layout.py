"""The kernel's index math in numpy (workers/codegen/layout.py mirrors the CUDA helpers):
conflict-free bijective swizzle, loaders that cover a tile once, the periodic loader form,
the epilogue's lane mapping, fast division, and the conv loader against numpy's im2col."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipetune.model.space import KNOBS, Schedule
from pipetune.workers.codegen import layout
from pipetune.workers.codegen.layout import TileGeometry

CPRS = (2, 4, 8, 16, 32)  # 16-byte chunks per smem row: BK of 16..128, BN up to 256


@pytest.mark.parametrize("cpr", CPRS)
def test_swizzle_is_a_bijection_within_each_128_byte_line(cpr):
    rows = 128
    row, col = np.meshgrid(np.arange(rows), np.arange(cpr), indexing="ij")
    logical = (row * cpr + col).ravel()
    phys = np.asarray(layout.swizzle(row, col, cpr)).ravel()
    assert np.array_equal(np.sort(phys), np.arange(rows * cpr))
    assert np.array_equal(phys // 8, logical // 8)  # never leaves its 128-byte line


@pytest.mark.parametrize("cpr", CPRS)
def test_ldmatrix_row_addresses_are_bank_conflict_free(cpr):
    # One 8x8 matrix: 8 consecutive rows from a multiple of 8, one logical chunk column.
    # 32 banks x 4 B: the 8 chunks must sit in 8 distinct 16-byte slots of a 128-byte line.
    for row0 in range(0, 64, 8):
        for col in range(cpr):
            phys = layout.swizzle(np.arange(row0, row0 + 8), col, cpr)
            assert len(set((phys % 8).tolist())) == 8, (cpr, row0, col)


@pytest.mark.parametrize("cpr", CPRS)
def test_unswizzled_layout_would_conflict(cpr):
    """The check above has teeth: without the XOR, rows 128 bytes apart share banks."""
    phys = np.arange(8) * cpr  # column 0 of 8 rows, no swizzle
    assert len(set((phys % 8).tolist())) < 8


def _geometries():
    for brw, bcw, wrt, wct, chunk in itertools.product(*(KNOBS[k] for k in list(KNOBS)[:5])):
        yield TileGeometry.of(Schedule(brw, bcw, wrt, wct, chunk, 2, 2))


@pytest.mark.parametrize("operand", ["a", "b_kn", "b_nk"])
def test_loader_covers_each_tile_chunk_once_and_writes_conflict_free(operand):
    for g in _geometries():
        if operand == "a":
            rows, cpr = g.bm, g.a_cpr
        else:
            kn = operand == "b_kn"
            rows, cpr = g.b_rows(kn), g.b_cpr(kn)
        if (rows * cpr) % g.threads:
            continue  # outside the valid space ("tile loads not divisible by the threads")
        iters = layout.loader_iters(rows, cpr, g.threads)
        tid, it = np.meshgrid(np.arange(g.threads), np.arange(iters), indexing="ij")
        row, col = layout.loader_rows_cols(tid, it, cpr, g.threads)
        assert np.array_equal(np.sort((row * cpr + col).ravel()), np.arange(rows * cpr))
        phys = layout.swizzle(row, col, cpr)
        # The periodic form the kernel uses is the same address.
        period = layout.swizzle_period(rows, cpr, g.threads)
        assert np.array_equal(layout.loader_chunk(tid, it, cpr, g.threads, period), phys)
        # cp.async writes: each 8 consecutive threads fill 8 distinct slots of a line.
        slots = (phys % 8).reshape(g.threads // 8, 8, iters)
        assert all(len(set(slots[q, :, i].tolist())) == 8 for q in range(len(slots))
                   for i in range(iters))  # fmt: skip


def test_ldmatrix_lanes_address_the_isa_matrices():
    lane = np.arange(32)
    q = lane // 8  # the matrix whose rows this lane addresses
    row, col = layout.ldmatrix_a(lane, 0, 0, 0)
    assert np.array_equal(row, (lane % 8) + 8 * (q % 2)) and np.array_equal(col, q // 2)
    row, col = layout.ldmatrix_b_kn(lane, 0, 0, 0)  # rows are k, chunks are n
    assert np.array_equal(row, (lane % 8) + 8 * (q % 2)) and np.array_equal(col, q // 2)
    row, col = layout.ldmatrix_b_nk(lane, 0, 0, 0)  # rows are n, chunks are k
    assert np.array_equal(row, (lane % 8) + 8 * (q // 2)) and np.array_equal(col, q % 2)


def test_epilogue_lanes_cover_the_accumulator_tile_exactly_once():
    for s in (Schedule(1, 1, 1, 1, 1, 1, 1), Schedule(2, 4, 4, 2, 2, 3, 2)):
        g = TileGeometry.of(s)
        hits = np.zeros((g.bm, g.bn), dtype=int)
        for warp, lane, i, j, reg in itertools.product(
            range(g.threads // 32), range(32), range(g.mt), range(2 * g.nt), range(4)
        ):
            wm0, wn0 = layout.warp_origin(warp, g)
            r, c = layout.acc_position(lane, reg)
            hits[wm0 + i * 16 + r, wn0 + j * 8 + c] += 1
        assert (hits == 1).all()


def test_fast_division_matches_integer_division():
    rng = np.random.default_rng(0)
    divisors = [1, 2, 3, 5, 7, 12, 56, 100, 255, 1000, 4097, 65535, 1 << 20, (1 << 31) - 1]
    divisors += rng.integers(1, 1 << 16, 50).tolist()
    n = np.concatenate([np.arange(5000), rng.integers(0, 2**31 - 1, 20000), [2**31 - 1]])
    n = n.astype(np.uint64)
    for d in divisors:
        assert np.array_equal(layout.fast_div(n, d), n // d), d


@pytest.mark.parametrize(
    ("out_dims", "filt", "in_dims", "stride", "pad"),
    [
        ((4, 3), (3, 3), (7, 6), 2, 1),
        ((5, 5), (1, 1), (5, 5), 1, 0),
        ((2, 3, 2), (3, 2, 3), (4, 5, 4), 2, 1),
    ],
)
def test_conv_coordinates_equal_numpy_im2col(out_dims, filt, in_dims, stride, pad):
    batch, c = 2, 8
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *in_dims, c))
    # numpy im2col: pad, take the strided window for each filter offset.
    xp = np.pad(x, [(0, 0), *[(pad, pad)] * len(in_dims), (0, 0)])
    cols = []
    for offs in np.ndindex(*filt):
        steps = (
            slice(f, f + stride * (o - 1) + 1, stride) for f, o in zip(offs, out_dims, strict=True)
        )
        window = xp[(slice(None), *steps)]
        cols.append(window.reshape(-1, c))
    im2col = np.concatenate(cols, axis=1)  # rows m = (n, out...), cols k = (filter..., c)
    m, k = np.meshgrid(np.arange(im2col.shape[0]), np.arange(im2col.shape[1]), indexing="ij")
    n, coords = layout.conv_a_coords(
        m, k, out_dims=out_dims, filt=filt, c=c, stride=stride, pad=pad
    )
    *spatial, channel = coords
    inside = np.ones_like(m, dtype=bool)
    for coord, size in zip(spatial, in_dims, strict=True):
        inside &= (coord >= 0) & (coord < size)
    clipped = [np.clip(coord, 0, size - 1) for coord, size in zip(spatial, in_dims, strict=True)]
    gathered = np.where(inside, x[(n, *clipped, channel)], 0.0)
    assert np.array_equal(gathered, im2col)
