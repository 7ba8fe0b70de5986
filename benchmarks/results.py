"""Write a benchmark's section of benchmarks/RESULTS.md, stamped with date, machine, commit.

Each benchmark owns one section between marker comments; re-running it replaces only that
section, so results of other benchmarks (and of GPU runs made elsewhere) stay.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# pipetune benchmark results\n\nEach section says when, where and at which commit it was measured.\n"


def provenance() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        commit += " (+ uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpu = platform.processor() or platform.machine()
    machine = (
        f"{platform.node()} ({cpu}, {os.cpu_count()} cores, Python {platform.python_version()})"
    )
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"*Measured {today} on {machine}, commit {commit}.*"


def write_section(name: str, title: str, body: str) -> None:
    start, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
    block = f"{start}\n## {title}\n\n{provenance()}\n\n{body.strip()}\n{end}"
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)
