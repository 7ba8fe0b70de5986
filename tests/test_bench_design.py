"""benchmarks/bench_design.py runs and reports the design's picks."""

from __future__ import annotations

from benchmarks import bench_design


def test_the_design_benchmark_reports_time_memory_and_picks(capsys):
    assert bench_design.main(["--configs", "3000", "--values", "40", "--picks", "6"]) == 0
    out = capsys.readouterr().out
    assert "design of 6 over 3000 configurations, features (3000, 46)" in out
    assert "first picks [" in out


def test_the_search_benchmark_reports_time_memory_and_rows(capsys):
    args = ["--configs", "3000", "--values", "40", "--search-trials", "10"]
    assert bench_design.main(args) == 0
    out = capsys.readouterr().out
    assert "auto, 10 trials in batches of 8 over 3000 configurations:" in out
    assert "first rows [" in out
