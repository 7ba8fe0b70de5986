"""The compile benchmark behind the campaign's time plan counts and compiles both families."""

from __future__ import annotations

from benchmarks.bench_compile import SAMPLED, measure, render, suite_counts
from pipetune.model.operators import SUITES


def test_kernel_counts_per_kind_of_each_suite():
    trials, kernels = suite_counts("memops")
    assert set(kernels) == set(SAMPLED["memops"])
    assert trials == 26072 and sum(kernels.values()) == 4484
    alcop_trials, alcop = suite_counts("alcop")
    assert set(alcop) == set(SAMPLED["alcop"]) and alcop_trials == 51971
    assert sum(alcop.values()) == 10758


def test_every_sampled_operator_compiles_and_is_reported():
    assert all(op in SUITES[s] for s, kinds in SAMPLED.items() for op in kinds.values())
    rows = measure("memops", sample=1)
    assert [r["variant"] for r in rows] == list(SAMPLED["memops"])
    assert all(r["cpu_mean_s"] > 0 and r["pool_cpu_s_per_kernel"] > 0 for r in rows)
    trials, kernels = suite_counts("memops")
    text = render([("memops", rows, trials, kernels)], 1, (0.0, 0.0))
    assert "| memops | softmax | Softmax_BERT_b32_s1024 |" in text
    assert "memops suite on H100: 26,072 trials" in text
