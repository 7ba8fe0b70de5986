"""`pipetune curve --html/--png`: a task's best-so-far curve as a file.

--html: an interactive plotly page with plotly's own bundle inlined from the installed
plotly package (the one the dashboard serves): no CDN, the page works offline.
--png: a matplotlib image (the optional `plot` extra: pip install 'pipetune[plot]').
A curve of simulated trials says so in its title.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

from pipetune.clients.cli.errors import CliError
from pipetune.clients.cli.paths import check_output_file
from pipetune.clients.library.labels import SIMULATED_LABEL
from pipetune.model.family import parse_any_workload
from pipetune.model.wire import Curve, TaskDoc
from pipetune.workers.datasets.files import write_atomic, write_bytes_atomic

PNG_INCHES = (9.0, 5.4)
PNG_DPI = 100  # 900 x 540 pixels
LINE_COLOR = "#1f77b4"
PLOT_EXTRA = "pip install 'pipetune[plot]'"


def curve_title(task: TaskDoc) -> str:
    try:
        label = parse_any_workload(task.workload).label()
    except ValueError:
        label = str(task.workload)
    return f"task {task.id}: {label} on {task.gpu} ({task.strategy})"


def _subtitle(simulated: bool, curve: Curve) -> str:
    if not curve.points:  # (a queued task's empty curve read "over the measured trials")
        return "no trial has finished yet"
    return SIMULATED_LABEL if simulated else "best-so-far over the measured trials"


def check_curve_outputs(png: Path | None, html: Path | None) -> None:
    """Everything about --png/--html that can be refused before the task is fetched (exit 2):
    a path that is a directory or whose folder is missing, both naming one file (the page
    written second replaced the image), a PNG without matplotlib."""
    if png is not None:
        check_output_file(png, "--png")
    if html is not None:
        check_output_file(html, "--html")
    if png is not None and html is not None and _same_file(png, html):
        raise CliError(f"--html: {html} is the file --png writes; give each its own", 2)
    if png is not None:
        require_matplotlib()


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path once resolved (links followed), or an
    existing file reached two ways (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)
    except OSError:  # (one of them does not exist yet, so they are not one file)
        return False


def write_curve_html(path: Path, task: TaskDoc, curve: Curve, simulated: bool) -> None:
    check_output_file(path, "--html")  # also here: a caller may not have checked first
    import plotly.graph_objects as go

    unit = curve.throughput_unit
    fig = go.Figure(
        go.Scatter(
            x=[p.trial + 1 for p in curve.points],
            y=[p.best_throughput for p in curve.points],
            mode="lines+markers",
            line_shape="hv",
            line_color=LINE_COLOR,
            name=f"best-so-far {unit}" + (" (simulated)" if simulated else ""),
            customdata=[p.best_latency_us for p in curve.points],
            hovertemplate=f"trial %{{x}}<br>%{{y:.1f}} {unit}<br>%{{customdata:.2f}} µs",
        )
    )
    title = f"{curve_title(task)}<br><sup>{_subtitle(simulated, curve)}</sup>"
    fig.update_layout(title=title, xaxis_title="trials", yaxis_title=unit)
    # include_plotlyjs=True inlines plotly.min.js from the installed package (no CDN).
    # Written atomically: an interrupted write never leaves half a page.
    write_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True))


def require_matplotlib() -> None:
    """Exit 2, saying how to get it, when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise CliError(f"--png: drawing a PNG needs matplotlib: {PLOT_EXTRA}", 2)


def write_curve_png(path: Path, task: TaskDoc, curve: Curve, simulated: bool) -> None:
    check_output_file(path, "--png")  # also here: a caller may not have checked first
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = [
        (p.trial + 1, p.best_throughput) for p in curve.points if p.best_throughput is not None
    ]
    # No pyplot: a Figure of its own, no global state, no display needed.
    fig = Figure(figsize=PNG_INCHES, dpi=PNG_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if points:
        xs, ys = zip(*points, strict=True)
        ax.step(xs, ys, where="post", color=LINE_COLOR, marker="o", markersize=3)
    ax.set_xlabel("trials")
    ax.set_ylabel(f"best {curve.throughput_unit}")
    ax.set_title(f"{curve_title(task)}\n{_subtitle(simulated, curve)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    # Rendered in memory, then written whole (as --html and every other output): savefig
    # straight to the path left a partial PNG where the write failed or was interrupted.
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=PNG_DPI)
    write_bytes_atomic(path, png.getvalue())
