"""benchmarks/bench_bias_gelu_fusion.py: FC1 with bias + GELU fused against the unfused pair,
each at its model's best schedule."""

from __future__ import annotations

from benchmarks import bench_bias_gelu_fusion as bench


def test_every_shape_on_every_gpu_has_a_fused_and_an_unfused_time():
    for gpu in bench.GPUS:
        rows = bench.rows(gpu)
        assert [(r[0], r[1]) for r in rows] == [
            (name, tokens) for name in bench.NETWORKS for tokens in bench.TOKENS
        ]
        for _, _, fused, plain, act, gain in rows:
            # The fused kernel is priced as the GEMM (the README says what that leaves out):
            # the pair pays the bias_gelu kernel on top.
            assert 0 < fused == plain and act > 0
            assert gain == (plain + act) / fused and gain > 1


def test_the_table_says_what_each_column_is():
    text = bench.table("h200")
    assert text.startswith("**H200** (calibrated profile)")
    assert "| network | tokens | fused µs | GEMM µs | bias_gelu µs | unfused / fused |" in text
    assert text.count("\n| GPT-2 |") == len(bench.TOKENS)
