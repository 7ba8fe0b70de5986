"""benchmarks.profile_best: which schedules and which library call go under the profiler."""

from __future__ import annotations

import pytest

from benchmarks.campaign_data import DATA_DIR
from benchmarks.profile_best import best_records, library_shape, parse_where
from pipetune.model.workloads import Bmm, Conv2d, Gemm
from pipetune.workers.datasets import load_dataset


def test_best_records_are_the_fastest_correct_schedules_in_order() -> None:
    path = DATA_DIR / "h100" / "MM_Square_4k.t4.json.gz"
    workload, best = best_records(path, 3)
    times = sorted(
        r.time_ms for r in load_dataset(path).records if r.invalidity == "correct" and r.time_ms
    )
    assert workload.model_dump()["m"] == 4096
    assert [ms for _, ms in best] == times[:3]
    assert {"smem_stages", "reg_stages", "chunk"} <= set(best[0][0])


def test_where_picks_the_fastest_of_the_schedules_with_those_knob_values() -> None:
    # MM_Square_1k's lone 4-warp 128 x 128 blocks (2,200 cycles per K step where their MMAs
    # take 844: RESULTS.md, "Model: the blocks-per-SM trend and the K chunk, probed") beside
    # the fastest schedule there: what a profiler should compare.
    path = DATA_DIR / "h200" / "MM_Square_1k.t4.json.gz"
    where = parse_where("block_row_warps=2,block_col_warps=2,warp_row_tiles=4,chunk=4")
    _, picked = best_records(path, 2, where)
    matching = sorted(
        r.time_ms
        for r in load_dataset(path).records
        if r.invalidity == "correct"
        and r.time_ms
        and all(r.configuration[k] == v for k, v in where.items())
    )
    assert [ms for _, ms in picked] == matching[:2]
    assert all(config[k] == v for config, _ in picked for k, v in where.items())
    _, fastest = best_records(path, 1)
    assert fastest[0][1] < picked[0][1]


def test_where_refuses_what_is_not_a_knob_value() -> None:
    with pytest.raises(ValueError, match="knob=integer"):
        parse_where("chunk=four")
    with pytest.raises(ValueError, match="no knob colour"):
        best_records(DATA_DIR / "h200" / "MM_Square_1k.t4.json.gz", 1, {"colour": 1})


def test_library_shape_follows_the_batch_and_b_layout() -> None:
    assert library_shape(Gemm(m=64, n=32, k=16)) == (1, 64, 32, 16, False)
    assert library_shape(Gemm(m=64, n=32, k=16, b_layout="nk")) == (1, 64, 32, 16, True)
    assert library_shape(Bmm(b=12, m=512, n=512, k=64)) == (12, 512, 512, 64, False)


def test_library_shape_has_no_gemm_for_a_convolution() -> None:
    conv = Conv2d(n=1, h=8, w=8, c=16, k=16, r=3, s=3)
    assert library_shape(conv) is None


def test_the_device_script_parses_and_profiles_this_module() -> None:
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "profile_best.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "python3 -m benchmarks.profile_best" in text
    assert "$OUT/ncu-$op-ours.txt" in text and "$OUT/ncu-$op-lib.txt" in text
    assert '--where "$WHERE" > $OUT/ncu-$op-where.txt' in text
