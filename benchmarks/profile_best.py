"""Run a measured operator's best schedules again, once each, for a profiler to watch.

The campaign records how fast each schedule ran, not why. This runs the fastest
schedules of one recorded operator (benchmarks/data/<gpu>/<operator>.t4.json.gz) on the
cupy runner, few repeats, so that Nsight Compute can read their hardware counters, e.g.

    ncu --clock-control none --target-processes all -k regex:pipetune -c 2 \
        --section SpeedOfLight --section WarpStateStats \
        python -m benchmarks.profile_best --gpu h100 --operator MM_Square_4k --top 2

and, with --library, the vendor library's call on the same shape (cuBLAS through
torch.matmul / torch.bmm) for the same profiler to compare.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.campaign_data import DATA_DIR
from pipetune.model.family import family_of
from pipetune.workers.datasets import load_dataset
from pipetune.workers.datasets.pipetune import check_pipetune
from pipetune.workers.runners.base import MeasureSettings


def best_records(
    path: Path, top: int, where: dict[str, int] | None = None
) -> tuple[Any, list[tuple[dict[str, Any], float]]]:
    """The workload of a recorded operator and its ``top`` fastest correct schedules, each
    with its recorded time in ms, fastest first; with ``where``, only the schedules whose
    knobs have those values (e.g. a lone block the model mispredicts, to see why it ran as it
    did)."""
    dataset = load_dataset(path)
    info = check_pipetune(dataset)
    timed = [r for r in dataset.records if r.invalidity == "correct" and r.time_ms]
    if where:
        knobs = set(timed[0].configuration) if timed else set(where)
        if unknown := sorted(set(where) - knobs):
            raise ValueError(f"--where: {path.name} has no knob {', '.join(unknown)}")
        timed = [r for r in timed if all(r.configuration[k] == v for k, v in where.items())]
    timed.sort(key=lambda r: r.time_ms)
    return info.workload, [(dict(r.configuration), r.time_ms) for r in timed[:top]]


def parse_where(text: str) -> dict[str, int]:
    """``knob=value,knob=value`` (the schedule's knobs as the dataset records them)."""
    where = {}
    for item in filter(None, text.split(",")):
        knob, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"--where: {item!r} is not knob=integer")
        where[knob.strip()] = int(value)
    return where


def library_shape(workload: Any) -> tuple[int, int, int, int, bool] | None:
    """(batch, m, n, k, b given as N x K) of a GEMM or batched GEMM; None for other ops."""
    data = workload.model_dump()
    m, n, k = data.get("m"), data.get("n"), data.get("k")
    if data.get("op") not in ("gemm", "bmm") or None in (m, n, k):
        return None
    return data.get("b", 1), m, n, k, data.get("b_layout", "kn") == "nk"


def run_library(workload: Any) -> None:
    import torch

    shape = library_shape(workload)
    if shape is None:
        print(f"library: no GEMM shape in {workload.model_dump()}")
        return
    batch, m, n, k, b_nk = shape
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
    if b_nk:
        b = torch.randn(batch, n, k, device="cuda", dtype=torch.float16).transpose(1, 2)
    else:
        b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
    print(f"library: torch.bmm of {tuple(a.shape)} @ {tuple(b.shape)}")
    for _ in range(3):
        torch.bmm(a, b)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--operator", required=True)
    parser.add_argument("--top", type=int, default=1, help="0: the library call only")
    parser.add_argument("--library", action="store_true")
    parser.add_argument(
        "--where",
        default="",
        help="only schedules with these knob values, e.g. chunk=4,smem_stages=3",
    )
    args = parser.parse_args()

    from pipetune.workers.runners.cupy_runner import CupyRunner

    path = DATA_DIR / args.gpu / f"{args.operator}.t4.json.gz"
    try:
        workload, best = best_records(path, args.top, parse_where(args.where))
    except ValueError as exc:
        parser.error(str(exc))  # exit 2
    if args.top and not best:
        parser.error(f"--where: no correct schedule of {args.operator} has {args.where}")
    family = family_of(workload)
    schedules = []
    for config, recorded_ms in best:
        print(f"recorded {recorded_ms:.4f} ms: {config}")
        schedules.append(family.parse_schedule(config))
    settings = MeasureSettings(warmup=1, repeats=2)
    if not schedules:
        run_library(workload)
        return
    with CupyRunner(args.gpu, settings=settings, compile_workers=2) as runner:
        for schedule, result in zip(schedules, runner.measure(workload, schedules), strict=True):
            print(
                f"now {result.latency_us} us ({result.status}, {result.registers} registers): "
                f"{schedule.as_dict()}"
            )
    if args.library:
        run_library(workload)


if __name__ == "__main__":
    main()
