"""How the curve command draws without a plotting backend: the PNG encoder, the chart,
the sparkline and the milestone rows."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from pipetune.clients.cli.client_cmds import milestones, sparkline
from pipetune.clients.png_chart import BLUE, Series, encode_png, line_chart, nice_ticks, write_png


def _decode(data: bytes) -> np.ndarray:
    """A minimal PNG reader for what encode_png writes (8-bit RGB, filter 0)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = body
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2) and b"IEND" in chunks
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8)
    rows = raw.reshape(height, 1 + 3 * width)
    assert not rows[:, 0].any()  # filter type 0 on every row
    return rows[:, 1:].reshape(height, width, 3)


def test_png_round_trip():
    pixels = np.random.default_rng(0).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    assert np.array_equal(_decode(encode_png(pixels)), pixels)


def test_chart_draws_the_curve_inside_the_axes(tmp_path: Path):
    xs = list(range(1, 11))
    ys = [10, 30, 30, 55, 55, 55, 80, 80, 80, 81]
    path = tmp_path / "c.png"
    write_png(path, line_chart([Series(xs, ys, "best")], "task 1", "trials", "TFLOP/s"))
    image = _decode(path.read_bytes())
    assert image.shape == (540, 900, 3)
    curve = np.all(image == BLUE, axis=2)
    rows, cols = np.nonzero(curve[60:460, 110:870])  # the plot area
    assert rows.size > 500 and cols.max() - cols.min() > 600


def test_ticks_are_round_and_cover_the_range():
    assert nice_ticks(3.2, 97.0) == [0, 20, 40, 60, 80, 100]
    ticks = nice_ticks(1, 16)
    assert ticks[0] <= 1 and ticks[-1] >= 16


def test_sparkline_and_milestones():
    assert sparkline([None, 1.0, 2.0, 4.0]) == " ▁▃█"
    assert sparkline([]) == ""
    assert milestones(16) == [1, 2, 5, 10, 16]
    assert milestones(50) == [1, 2, 5, 10, 20, 50]
