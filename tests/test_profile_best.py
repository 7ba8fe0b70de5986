"""benchmarks.profile_best: which schedules and which library call go under the profiler."""

from __future__ import annotations

from benchmarks.campaign_data import DATA_DIR
from benchmarks.profile_best import best_records, library_shape
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
