"""benchmarks/bench_bf16_kernels.py: each kind's sample compiled in both element types and
compared pair by pair (one schedule per kind here; the benchmark takes 24)."""

from __future__ import annotations

import json

from benchmarks import bench_bf16_kernels as bench


def test_every_kind_is_compiled_in_both_types_and_summarised(capsys):
    bench.main(["--per-kind", "1", "--arch", "sm_90", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["arch"] == "sm_90"
    kinds = [*bench.WORKLOADS, *bench.HOPPER_WORKLOADS]  # the Hopper family's on sm_90
    assert [p["kind"] for p in doc["pairs"]] == kinds
    for pair in doc["pairs"]:
        fp16, bf16 = pair["registers"]
        assert fp16 > 0 and bf16 > 0 and all(ms > 0 for ms in pair["compile_ms"])
    rows = {r["kind"]: r for r in doc["summary"]}
    assert list(rows) == kinds and all(r["schedules"] == 1 for r in rows.values())
    for pair in doc["pairs"]:
        row = rows[pair["kind"]]
        assert row["register_delta_min"] == pair["registers"][1] - pair["registers"][0]
    table = bench.table(doc["summary"])
    assert table.count("\n") == len(kinds) + 1


def test_the_hopper_family_is_compiled_on_sm_90_only():
    assert set(bench.workloads("sm_90")) == {*bench.WORKLOADS, *bench.HOPPER_WORKLOADS}
    assert set(bench.workloads("sm_80")) == set(bench.WORKLOADS)


def test_the_sample_is_spread_over_the_space():
    workload = bench.WORKLOADS["gemm_kn"]
    chosen = bench.sample(workload, 8, seed=0)
    assert len(chosen) == 8 and len({s.id for s in chosen}) == 8
    assert {s.smem_stages for s in chosen} != {chosen[0].smem_stages}  # not one corner
