"""The GPU measurements committed under benchmarks/data/ are the ground truth: each is a
readable pipetune dataset measured by the cupy runner (never simulated), exhaustive over
today's valid space of its workload on its GPU (so a change to the space or the validity
rules that would drop or add measured schedules shows here), and the replay runner serves
them exactly as they were recorded."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.operators import SUITES
from pipetune.workers.datasets import check_pipetune, load_dataset
from pipetune.workers.runners import make_runner

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
# Each GPU's campaign, second sweeps of some of its operators (benchmarks/bench_repeat.py),
# and the Hopper wgmma family's campaigns in a folder of their own (hopper/<gpu>/).
MEASURED = (
    sorted(DATA.glob("h*00/*.t4.json.gz"))
    + sorted(DATA.glob("*/repeat-*/sweeps/*.t4.json.gz"))
    + sorted(DATA.glob("hopper/*/*.t4.json.gz"))
)


def _gpu_of(path: Path) -> str:
    parts = path.relative_to(DATA).parts
    return parts[1] if parts[0] == "hopper" else parts[0]


@pytest.mark.parametrize(("gpu", "operators"), [("h200", 59), ("h100", 59)])
def test_there_are_measurements(gpu: str, operators: int):
    # The campaigns of 2026-11-26: both GPUs' whole suites (59 operators each). Fewer files
    # means data went missing.
    assert len(sorted((DATA / gpu).glob("*.t4.json.gz"))) == operators


def test_the_h200_holds_the_hopper_family_s_campaign():
    # The wgmma family's campaign of 2026-11-30: the 15 ALCOP GEMMs and BMMs as WG_ operators.
    from pipetune.model.operators import SUITES

    names = {p.name.split(".")[0] for p in (DATA / "hopper" / "h200").glob("*.t4.json.gz")}
    assert names == set(SUITES["hopper"])


def test_the_h100_repeat_holds_ten_operators_of_the_campaign():
    repeat = sorted((DATA / "h100" / "repeat-2026-11-26" / "sweeps").glob("*.t4.json.gz"))
    assert len(repeat) == 10
    assert all((DATA / "h100" / p.name).exists() for p in repeat)


@pytest.mark.parametrize("path", MEASURED, ids=[str(p.relative_to(DATA)) for p in MEASURED])
def test_a_committed_dataset_is_an_exhaustive_real_measurement(path: Path):
    ds = load_dataset(path)
    info = check_pipetune(ds)
    assert info.runner == "cupy" and info.gpu == _gpu_of(path)
    operator = path.name.split(".")[0]
    suite = next(s for s in SUITES.values() if operator in s)
    assert suite[operator].workload_hash == info.workload.workload_hash
    space = info.family.enumerate(info.workload, get_gpu(info.gpu))
    measured = {info.family.parse_schedule(dict(r.configuration)).id for r in ds.records}
    assert measured == set(space.ids), "the valid space and the measured schedules differ"
    assert np.isfinite(ds.times_ms()[ds.valid_mask()]).all()


def test_the_replay_runner_serves_the_measurements_as_recorded():
    path = DATA / "h200" / "MM_RN50_FC.t4.json.gz"
    ds = load_dataset(path)
    info = check_pipetune(ds)
    best = ds.best()
    assert best is not None
    schedule = info.family.parse_schedule(dict(best.configuration))
    with make_runner("replay", dataset=path, workload=info.workload, gpu="h200") as runner:
        (result,) = runner.measure(info.workload, [schedule])
    assert result.status == "ok" and result.runner == "replay:cupy"
    assert result.latency_us == pytest.approx(best.time_ms * 1e3)


@pytest.mark.parametrize(("gpu", "floor"), [("h200", 0.95), ("h100", 0.94)])
def test_the_model_ranks_the_measured_gemms_with_the_k_step_cost(gpu: str, floor: float):
    # The model's 10 best-ranked schedules hold 0.954 of each operator's measured optimum (geomean
    # over the ALCOP suite on the H200, its convolutions measured with the loader that multiplies,
    # 2026-11-30; 0.959 with the one that divided), 0.946 on the H100 (where the K-step cost, chosen
    # on the H200's sweeps, was held out). Before the readings of model/analytical.py that follow
    # how our kernels run: 0.795 / 0.748 (Table 1 alone), 0.878 / 0.844 with the K-step cost, 0.890
    # / 0.867 with a stage refilled per step and the first tile loaded once; 0.939 / 0.929 before a
    # lone block's exposed fragment loads (reading 10). A model change that loses this ground fails
    # here.
    from benchmarks.bench_campaign import best_in_top_k, geomean

    top10 = geomean(best_in_top_k(op, op.predicted_us, 10) for op in _alcop_ops(gpu))
    assert top10 >= floor


@functools.cache  # read and evaluated once per GPU: the model tests below share them
def _alcop_ops(gpu: str) -> tuple:
    from benchmarks.campaign_data import campaign, load_operator
    from pipetune.model.operators import ALCOP

    # Only the ALCOP operators' files: Campaign.operators reads every swept operator, and the
    # memory-bound ones' 36 files (a third of the reading) would be thrown away here.
    run = campaign(gpu, DATA)
    paths = {p.name.split(".")[0]: p for p in run.dataset_paths()}
    ops = [load_operator(paths[name], run.baselines) for name in ALCOP if name in paths]
    assert len(ops) == len(ALCOP)
    return tuple(ops)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_two_stage_pipelines_are_predicted_as_fast_as_they_measured(gpu: str):
    # Table 1 lets a stage refill the moment its use ends: after each operator's scale, it
    # predicted the two-stage schedules 0.88-0.89 of their measured time on both GPUs (the
    # report's "by pipelining class" table), the only class below the deeper ones. Per K
    # step, as the kernels synchronise, each load has S-1 steps to land: 1.00-1.01.
    errors = []
    for op in _alcop_ops(gpu):
        ok = op.ok & np.isfinite(op.predicted_us)
        error = np.log(op.predicted_us / op.measured_us)
        error -= np.median(error[ok])
        errors.extend(error[ok & (op.space.knobs["smem_stages"] == 2)].tolist())
    assert abs(np.exp(np.median(errors)) - 1) < 0.05


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_a_second_stage_is_predicted_against_one_schedule_by_schedule(gpu: str):
    # Schedules that differ only in one shared-memory stage against two, at equal occupancy
    # (7,153 pairs per GPU): a second stage measured almost no faster in the median (0.994 /
    # 0.995 of the one-stage time, H100 / H200), where Table 1, its one-stage blocks
    # streaming the whole wave's bytes at every load, predicted 0.87 / 0.86, the ratios'
    # median error 0.14 / 0.16 (log) and their rank correlation 0.25; with a one-stage block
    # contending only with the blocks loading with it (reading 9), 0.93 / 0.92, 0.10 / 0.11
    # and 0.39 / 0.40.
    from scipy.stats import spearmanr

    measured, predicted = [], []
    for op, one, two in _stage_pairs(gpu, "smem_stages"):
        measured.append(np.log(op.measured_us[two] / op.measured_us[one]))
        predicted.append(np.log(op.predicted_us[two] / op.predicted_us[one]))
    measured_ratio, predicted_ratio = np.array(measured), np.array(predicted)
    assert len(measured_ratio) > 5000
    # With the latency's spread that a multistage load waits out (reading 12): 0.087 / 0.086
    # and 0.42 / 0.48; with the next tile's copies leaving part by part through the step
    # (reading 14), 0.078 / 0.070 and 0.53 / 0.52.
    assert np.median(np.abs(predicted_ratio - measured_ratio)) < 0.085
    assert spearmanr(measured_ratio, predicted_ratio)[0] > 0.33


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_the_widest_warp_tiles_are_not_a_class_apart(gpu: str):
    # log(measured / predicted), each operator's median removed: the 4x4 warp tiles (a K step
    # mostly MMAs) measured 0.50 / 0.43 (H200 / H100) slower, relative to the 1x1 ones (mostly
    # other instructions), than the model said, while it took the longer of the MMAs and the
    # issue; adding them (reading 13), 0.34 / 0.29: less, not gone.
    wide, narrow = [], []
    for op in _alcop_ops(gpu):
        ok = np.isfinite(op.measured_us) & np.isfinite(op.predicted_us)
        residual = np.log(op.measured_us / op.predicted_us)
        residual = residual - np.median(residual[ok])
        rows, cols = op.space.knobs["warp_row_tiles"], op.space.knobs["warp_col_tiles"]
        wide.append(residual[ok & (rows == 4) & (cols == 4)])
        narrow.append(residual[ok & (rows == 1) & (cols == 1)])
    gap = np.median(np.concatenate(wide)) - np.median(np.concatenate(narrow))
    assert 0.0 < gap < 0.40


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_two_stages_against_three_are_predicted_schedule_by_schedule(gpu: str):
    # Twins equal but for two shared-memory stages against three, at equal occupancy (5,067
    # pairs per GPU): the two-stage one measured 0.14 / 0.15 (log, median; H100 / H200)
    # slower. With loads at their mean time (reading 4) the pairs' ratios were predicted
    # with a median error of 0.121 / 0.130 and ranked at 0.51 / 0.48; with the latency's
    # spread (reading 12), 0.110 / 0.111 and 0.56 / 0.52; with the MMAs and the other
    # instructions adding up (reading 13), 0.105 / 0.106 and 0.47 / 0.46. Reading 13 makes the
    # MMA-heavy schedules' use step longer, and the model lets a longer step hide more of a
    # load in flight (the slack of reading 12), so it predicts a smaller penalty for their
    # second stage; measured, the penalty does not fall with the step's length (Spearman
    # -0.03 within each operator). The slack, not the step, misranks these twins: open. With
    # the next tile's copies leaving part by part through the step (reading 14), less of the
    # step is slack: 0.097 / 0.098 and 0.51 / 0.50. With one warp's instructions issuing
    # under another's MMAs (reading 17) the many-warp schedules' steps are shorter and leave
    # their loads less slack: 0.101 / 0.103 and 0.54 / 0.50.
    from scipy.stats import spearmanr

    measured, predicted = [], []
    for op, two, three in _stage_pairs(gpu, "smem_stages", (2, 3)):
        measured.append(np.log(op.measured_us[two] / op.measured_us[three]))
        predicted.append(np.log(op.predicted_us[two] / op.predicted_us[three]))
    measured_ratio, predicted_ratio = np.array(measured), np.array(predicted)
    assert len(measured_ratio) > 5000
    assert np.median(measured_ratio) > 0.1  # what the data say: the third stage pays
    assert np.median(np.abs(predicted_ratio - measured_ratio)) < 0.105
    assert spearmanr(measured_ratio, predicted_ratio)[0] > 0.48


def _stage_pairs(
    gpu: str, knob: str, stages: tuple[int, int] = (1, 2)
) -> Iterator[tuple[Any, int, int]]:
    """(operator, row with the fewer stages, row with the more) for every pair of schedules
    that differ only in `knob` (`stages`: 1 against 2 unless said), at equal occupancy, both
    measured (benchmarks/bench_model_groups.py pairs them)."""
    from benchmarks.bench_model_groups import stage_twins

    for fewer, more, op in stage_twins(list(_alcop_ops(gpu)), *stages, knob=knob):
        yield op, fewer, more


def _register_stage_pairs(gpu: str) -> list[tuple[int, float, float]]:
    """The register-stage pairs with a shared-memory pipeline (smem_stages >= 2): (blocks per
    SM, measured two-stage / one-stage time, modelled)."""
    return [
        (
            int(op.space.blocks_per_sm[one]),
            float(op.measured_us[two] / op.measured_us[one]),
            float(op.predicted_us[two] / op.predicted_us[one]),
        )
        for op, one, two in _stage_pairs(gpu, "reg_stages")
        if op.space.knobs["smem_stages"][one] >= 2
    ]


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_a_second_register_stage_is_predicted_where_a_block_is_alone(gpu: str):
    # A lone block's warps load their fragments together, so with one register stage each
    # k16 step waits out the shared-memory latency; co-resident blocks fill that wait. Over
    # the schedules that differ only in the register stages (4,312 pairs of lone blocks per
    # GPU) the second stage measured 0.918 / 0.916 of the one-stage time (H100 / H200) in
    # the median and 0.99 from five blocks per SM on, where the model's register pipeline,
    # the block's warps hiding each other's loads, predicted 1.000 for every pair; with the
    # exposed latency (reading 10), 0.922 / 0.896 for lone blocks, 0.997 / 0.958 from five;
    # with reading 13, 0.932 / 0.925 and 0.993 / 0.947 (the H200's crowded blocks further
    # from the measured 0.988).
    pairs = _register_stage_pairs(gpu)
    lone = np.array([(measured, model) for blocks, measured, model in pairs if blocks == 1])
    crowded = np.array([(measured, model) for blocks, measured, model in pairs if blocks >= 5])
    assert len(lone) > 4000 and len(crowded) > 3000
    lone_measured, lone_model = np.median(lone, axis=0)
    crowded_measured, crowded_model = np.median(crowded, axis=0)
    assert lone_measured < 0.95 and crowded_measured > 0.98  # what the data say
    assert abs(lone_model - lone_measured) < 0.03
    assert crowded_model > lone_model + 0.015  # the wait fades as blocks share the SM


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_crowded_blocks_fill_the_register_level_wait(gpu: str):
    # Where Table 1's register level is load-bound (one register stage, few warps a block),
    # what it adds over the warps' tensor time is the fragments' latency, which co-resident
    # blocks fill (reading 16). From five blocks per SM on, a second register stage measured
    # 0.012 / 0.012 faster (log, median; H100 / H200); the model, multiplying the wait by the
    # blocks on the SM, predicted 0.006 / 0.054 faster (median error 0.031 / 0.057), and
    # with the wait shared 0.000 / 0.002 (0.025 / 0.030).
    rows = np.log(
        [(measured, model) for blocks, measured, model in _register_stage_pairs(gpu) if blocks >= 5]
    )
    measured, predicted = rows.T
    assert len(measured) > 3000
    assert -0.03 < np.median(measured) < 0.0  # what the data say: the second stage buys little
    assert abs(np.median(predicted) - np.median(measured)) < 0.02
    assert np.median(np.abs(predicted - measured)) < 0.035


def _warp_pairs(gpu: str, fewer: int, more: int) -> np.ndarray:
    """(measured, predicted) log time ratio of every pair of schedules with the same block
    tile, K step, stages and blocks per SM, one with `more` warps (narrower warp tiles) and
    one with `fewer`, both measured."""
    rows = []
    for op in _alcop_ops(gpu):
        space, ok = op.space, op.ok
        key = np.stack(
            [
                space.block_m,
                space.block_n,
                space.block_k,
                space.knobs["smem_stages"],
                space.knobs["reg_stages"],
                space.blocks_per_sm,
            ],
            axis=1,
        )
        groups: dict[tuple, dict[int, list[int]]] = {}
        for i in np.flatnonzero(ok & np.isin(space.warps, (fewer, more))):
            groups.setdefault(tuple(key[i]), {}).setdefault(int(space.warps[i]), []).append(i)
        for by_warps in groups.values():
            for a in by_warps.get(fewer, []):
                for b in by_warps.get(more, []):
                    rows.append(
                        (
                            np.log(op.measured_us[b] / op.measured_us[a]),
                            np.log(op.predicted_us[b] / op.predicted_us[a]),
                        )
                    )
    return np.array(rows)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_more_warps_on_a_sub_partition_overlap_their_instructions(gpu: str):
    # The same block tile split over eight warps instead of four, at equal occupancy (6,301
    # pairs per GPU): the narrower warp tiles issue more instructions per MMA (ldmatrix,
    # addresses), yet measured +0.007 / -0.003 (log, median; H100 / H200), where the model,
    # adding every warp's other instructions to its MMAs (reading 13), predicted +0.14 /
    # +0.16. With two warps on a sub-partition one issues under the other's MMAs part of the
    # time (reading 17): +0.06 / +0.09.
    pairs = _warp_pairs(gpu, 4, 8)
    assert len(pairs) > 6000
    measured, predicted = np.median(pairs, axis=0)
    assert abs(measured) < 0.03  # what the data say: the extra instructions hide
    assert predicted - measured < 0.10


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_a_second_register_stage_buys_nothing_where_a_k_step_is_one_slice(gpu: str):
    # With BK 16 a K step is one k16 slice: the generated loop loads the next step's fragments
    # after the step's barrier, into the second buffer, and copies them into the first, a copy
    # that waits for them as one stage's MMAs do (reading 15). Over the register-stage twins
    # at BK 16 (843 per GPU) the second stage measured 0.047 / 0.049 (log, median; H100 /
    # H200) slower; the model, hiding the fragment wait there, predicted it 0.024 / 0.034
    # faster (median error 0.090 / 0.113); with the wait, 0.000 (0.066 / 0.084); with the
    # copy's instructions counted too (model/issue.py), 0.041 / 0.073 slower (0.038 / 0.049).
    rows = [
        (
            np.log(op.measured_us[two] / op.measured_us[one]),
            np.log(op.predicted_us[two] / op.predicted_us[one]),
        )
        for op, one, two in _stage_pairs(gpu, "reg_stages")
        if op.space.knobs["smem_stages"][one] >= 2 and op.space.block_k[one] == 16
    ]
    measured, predicted = np.array(rows).T
    assert len(measured) > 800
    assert np.median(measured) > 0.03  # what the data say: the second stage costs
    assert np.median(predicted) > 0.02
    assert np.median(np.abs(predicted - measured)) < 0.06


SHORT_K = (
    "MM_RN50_Conv1x1_1",
    "MM_RN50_Conv1x1_2",
    "MM_RN50_Conv1x1_3",
    "BMM_BERT_QK",
    "BMM_GPT2_QK",
)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_the_short_k_operators_are_ranked_with_their_co_resident_blocks_overlapping(gpu: str):
    # K <= 256: one to four K steps, the prologue and the epilogue most of the kernel. With
    # a wave's blocks in lockstep (Table 1) the model ranked them at a mean Spearman of
    # 0.11 (H100) / 0.17 (H200), below zero on the QK^T BMMs; with co-resident blocks
    # overlapping each other's prologue and epilogue, 0.44 / 0.49.
    from benchmarks.bench_campaign import spearman

    ops = [op for op in _alcop_ops(gpu) if op.name in SHORT_K]
    assert len(ops) == len(SHORT_K)
    assert np.mean([spearman(op, op.predicted_us) for op in ops]) > 0.35


@pytest.mark.parametrize(
    ("name", "floor"),
    [("MM_72x12288x4096", 0.88), ("MM_4096x72x4096", 0.84)],
)
def test_the_model_picks_well_on_measured_skinny_gemms(name: str, floor: float):
    # Two GEMMs with tiles past the matrix edge, every valid schedule swept on the H200
    # (2026-12-04). The model's pick, as a fraction of the optimum, by what its L2 stream
    # counts of a tile's copies past the edge: the whole tile 0.902 / 0.739; A's rows and B's
    # columns clipped 0.790 / 0.859; only B's clipped 0.902 / 0.859 (with the lone-block floor
    # of reading 11 in every case but the first, which had none: 0.902 / 0.739 there too).
    from benchmarks.bench_campaign import best_in_top_k
    from benchmarks.campaign_data import load_operator

    path = DATA / "h200" / "shapes" / f"{name}.t4.json.gz"
    info = check_pipetune(load_dataset(path))
    assert info.runner == "cupy" and info.gpu == "h200"
    op = load_operator(path, {})
    assert np.isfinite(op.measured_us).all() and len(op.measured_us) == len(op.space) == 2648
    assert best_in_top_k(op, op.predicted_us, 1) >= floor


# Shapes the model was never adjusted to, swept whole on the H200 (2026-12-04 16:30-16:45
# UTC, commit 5f42815): skinny, ragged, short-K, long-K, square, a transposed weight (nk)
# and two batched GEMMs. The model's top-10 held 0.938 of the optimum in the geomean.
HELD_OUT = (
    "MM_200x12288x4096", "MM_4096x200x4096", "MM_2112x4096x4096", "MM_2120x4096x4096",
    "MM_1000x1000x8192", "MM_128x4096x12288", "MM_3000x3000x3000", "MM_8192x8192x1024",
    "MM_4096x1024x512", "MM_320x20000x2048", "MM_640x1536x65536", "MM_1536x1536x1536",
    "MM_4096x4096x4096_nk", "MM_72x12288x4096_nk", "BMM_b48x384x384x64",
    "BMM_b16x1000x1000x128",
)  # fmt: skip


def test_the_model_ranks_held_out_shapes_measured_on_the_h200():
    from benchmarks.bench_campaign import best_in_top_k
    from benchmarks.campaign_data import load_operator

    top10 = []
    for name in HELD_OUT:
        path = DATA / "h200" / "shapes" / f"{name}.t4.json.gz"
        info = check_pipetune(load_dataset(path))
        assert info.runner == "cupy" and info.gpu == "h200", name
        op = load_operator(path, {})
        # Every valid schedule of today's space measured, verified and timed.
        assert len(op.measured_us) == len(op.space) and np.isfinite(op.measured_us).all(), name
        top10.append(best_in_top_k(op, op.predicted_us, 10))
    assert float(np.exp(np.mean(np.log(top10)))) >= 0.92
    assert min(top10) >= 0.70  # MM_128x4096x12288: 0.731, its fewest-blocks picks
