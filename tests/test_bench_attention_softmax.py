"""benchmarks/bench_attention_softmax.py: the attention softmax, scaled and causal, against
the plain softmax of its shape, at the model's best schedule; and the mask's registers."""

from __future__ import annotations

from benchmarks import bench_attention_softmax as bench


def test_every_shape_on_every_gpu_has_a_plain_and_a_causal_time():
    for gpu in bench.GPUS:
        rows = bench.model_rows(gpu)
        assert [(r[0], r[1]) for r in rows] == [
            (name, seq) for name in bench.NETWORKS for seq in bench.SEQS
        ]
        for _, _, plain, causal, ratio in rows:
            # The masked kernels read about half the keys and write every output.
            assert 0 < causal < plain and ratio == plain / causal and ratio < 4 / 3 + 0.01


def test_the_model_table_says_what_each_column_is():
    text = bench.model_table("h100")
    assert text.startswith("**H100** (calibrated profile; batch 1, prefill)")
    assert "| network | seq | plain softmax µs | scaled causal µs | plain / causal |" in text
    assert text.count("\n| LLaMA-2 7B |") == len(bench.SEQS)
