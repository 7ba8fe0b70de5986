"""benchmarks/bench_swiglu_fusion.py: the fused GEMM + SwiGLU against the unfused pair, each
at its model's best schedule."""

from __future__ import annotations

from benchmarks import bench_swiglu_fusion as bench


def test_every_shape_on_every_gpu_has_a_fused_and_an_unfused_time():
    for gpu in bench.GPUS:
        rows = bench.rows(gpu)
        assert [(r[0], r[1]) for r in rows] == [
            (size, tokens) for size in bench.MODELS for tokens in bench.TOKENS
        ]
        for _, _, fused, plain, gate, gain in rows:
            # The fused kernel is the GEMM with half the stores: never slower than the plain
            # GEMM alone, and the pair pays the silu_mul kernel on top.
            assert 0 < fused <= plain and gate > 0
            assert gain == (plain + gate) / fused and gain > 1


def test_the_table_says_what_each_column_is():
    text = bench.table("h100")
    assert text.startswith("**H100** (calibrated profile)")
    assert "| model | tokens | fused µs | GEMM µs | silu_mul µs | unfused / fused |" in text
    assert text.count("\n| 7B |") == len(bench.TOKENS)
