"""A line chart written as a PNG with numpy and zlib only.

Plotly's PNG export needs kaleido (and a browser engine), which pipetune does not depend
on; a best-so-far curve needs only axes, ticks, a step line and a title, so this draws them
into an RGB array (5×7 bitmap font, clients.font5x7) and encodes the PNG itself
(8-bit RGB, one zlib stream, filter 0 per row).
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipetune.clients.font5x7 import HEIGHT as GLYPH_H
from pipetune.clients.font5x7 import WIDTH as GLYPH_W
from pipetune.clients.font5x7 import glyph

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (30, 30, 30)
GRID: Color = (225, 225, 225)
BLUE: Color = (31, 119, 180)
ORANGE: Color = (255, 127, 14)


@dataclass(frozen=True)
class Series:
    xs: Sequence[float]
    ys: Sequence[float]
    label: str
    color: Color = BLUE
    step: bool = True  # best-so-far curves hold their value until the next improvement


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE):
        self.width, self.height = width, height
        self.pixels = np.empty((height, width, 3), dtype=np.uint8)
        self.pixels[:] = background

    def fill(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        x0, x1 = sorted((max(0, x0), min(self.width, x1)))
        y0, y1 = sorted((max(0, y0), min(self.height, y1)))
        self.pixels[y0:y1, x0:x1] = color

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 2):
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        xs = np.rint(np.linspace(x0, x1, steps)).astype(int)
        ys = np.rint(np.linspace(y0, y1, steps)).astype(int)
        half = width // 2
        for dx in range(-half, width - half):
            for dy in range(-half, width - half):
                px, py = xs + dx, ys + dy
                keep = (px >= 0) & (px < self.width) & (py >= 0) & (py < self.height)
                self.pixels[py[keep], px[keep]] = color

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> None:
        for i, ch in enumerate(text):
            mask = np.kron(glyph(ch), np.ones((scale, scale), dtype=bool))
            gx = x + i * (GLYPH_W + 1) * scale
            region = self.pixels[y : y + mask.shape[0], gx : gx + mask.shape[1]]
            region[mask[: region.shape[0], : region.shape[1]]] = color

    def vtext(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> None:
        """Text rotated 90° counter-clockwise, reading upwards from (x, y)."""
        for i, ch in enumerate(text):
            mask = np.rot90(np.kron(glyph(ch), np.ones((scale, scale), dtype=bool)))
            gy = y - (i + 1) * (GLYPH_W + 1) * scale
            region = self.pixels[max(gy, 0) : gy + mask.shape[0], x : x + mask.shape[1]]
            region[mask[-region.shape[0] :, : region.shape[1]]] = color


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * (GLYPH_W + 1) * scale


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(target - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-2:
        return f"{value:.1e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{value:g}"


def line_chart(
    series: Sequence[Series],
    title: str,
    xlabel: str,
    ylabel: str,
    width: int = 900,
    height: int = 540,
) -> Canvas:
    canvas = Canvas(width, height)
    left, right, top, bottom = 110, 30, 60, 80
    plot_w, plot_h = width - left - right, height - top - bottom
    xs_all = [float(x) for s in series for x in s.xs]
    ys_all = [float(y) for s in series for y in s.ys]
    xticks = nice_ticks(min(xs_all, default=0.0), max(xs_all, default=1.0))
    yticks = nice_ticks(min(ys_all, default=0.0), max(ys_all, default=1.0))
    x_lo, x_hi, y_lo, y_hi = xticks[0], xticks[-1], yticks[0], yticks[-1]

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    for t in xticks:
        canvas.line(px(t), top, px(t), top + plot_h, GRID, 1)
        label = tick_label(t)
        canvas.text(int(px(t)) - text_width(label) // 2, top + plot_h + 10, label)
    for t in yticks:
        canvas.line(left, py(t), left + plot_w, py(t), GRID, 1)
        label = tick_label(t)
        canvas.text(left - 10 - text_width(label), int(py(t)) - GLYPH_H, label)
    canvas.line(left, top + plot_h, left + plot_w, top + plot_h, BLACK, 2)
    canvas.line(left, top, left, top + plot_h, BLACK, 2)

    for s in series:
        points = [(px(float(x)), py(float(y))) for x, y in zip(s.xs, s.ys, strict=True)]
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            if s.step:
                canvas.line(x0, y0, x1, y0, s.color, 3)
                canvas.line(x1, y0, x1, y1, s.color, 3)
            else:
                canvas.line(x0, y0, x1, y1, s.color, 3)
        for x, y in points:
            canvas.fill(int(x) - 3, int(y) - 3, int(x) + 4, int(y) + 4, s.color)

    canvas.text(max(10, (width - text_width(title)) // 2), 20, title)
    canvas.text(left + (plot_w - text_width(xlabel)) // 2, height - 35, xlabel)
    canvas.vtext(15, top + (plot_h + text_width(ylabel)) // 2, ylabel)
    legend_y = top + 10
    for s in series:
        canvas.fill(left + 15, legend_y + 4, left + 35, legend_y + 9, s.color)
        canvas.text(left + 45, legend_y, s.label)
        legend_y += 22
    return canvas


def encode_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 RGB array."""
    height, width, channels = pixels.shape
    if channels != 3 or pixels.dtype != np.uint8:
        raise ValueError("expected an (H, W, 3) uint8 array")

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), pixels.reshape(height, -1)], 1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


def write_png(path: Path, canvas: Canvas) -> None:
    path.write_bytes(encode_png(canvas.pixels))
