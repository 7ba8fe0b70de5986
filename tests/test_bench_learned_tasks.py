"""The learned-prior lookup benchmark (python -m benchmarks.bench_learned_tasks) on
PostgreSQL, on a few datasets: it imports, copies and times; no timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys

from service_support import require_pg


def test_the_benchmark_imports_copies_and_finds_the_same_tasks_each_call():
    admin = require_pg()
    args = ["--pg-url", admin, "--datasets", "4", "--copies", "2", "--calls", "2"]
    shown = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_learned_tasks", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    assert re.search(r"^4 datasets imported, 12 tasks, \d+ jobs", shown, re.M), shown
    found = re.findall(r"learned_tasks, kept summaries, call \d: \d+ ms \((\d+) tasks\)", shown)
    assert len(found) == 2 and found[0] == found[1] and int(found[0]) > 0, shown
    assert len(re.findall(r"POST /v1/tasks \d: \d+ ms \(HTTP 201", shown)) == 3, shown
