"""Progress into a log (stderr no terminal): rich drew no bar there, and `tune --wait` and
`tune-model` showed nothing of their tasks until they ended. ProgressLines prints a line
when they move, at most every EVERY_S, and at the end."""

from __future__ import annotations

import io

from rich.console import Console

from pipetune.clients.cli import progress_lines
from pipetune.clients.cli.progress_lines import ProgressLines


def test_a_line_when_the_tasks_move_at_most_every_so_often_and_at_the_end(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress_lines.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    lines = ProgressLines(Console(file=out, width=40), every_s=10.0)
    long = "task 1 running, 0/16 trials; " + "x" * 60  # wider than the console: one line
    lines.see(0, long, final=False)  # the first look: said
    lines.see(0, "unchanged", final=False)  # not moved: not said
    clock[0] += 3
    lines.see(2, "task 1 running, 2/16 trials", final=False)  # moved, but 3 s later
    clock[0] += 8
    lines.see(2, "task 1 running, 2/16 trials", final=False)  # 11 s after the last line
    lines.see(4, "task 1 running, 4/16 trials", final=False)  # moved, at once after
    clock[0] += 30
    lines.see(2, "task 1 running, 2/16 trials", final=False)  # what the last line said
    clock[0] += 1
    lines.see(16, "task 1 done, 16/16 trials", final=True)  # the end, whatever the time
    lines.see(16, "task 1 done, 16/16 trials", final=True)  # once
    assert out.getvalue().splitlines() == [
        long,
        "task 1 running, 2/16 trials",
        "task 1 done, 16/16 trials",
    ]
