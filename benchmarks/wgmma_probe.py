"""How close a warpgroup-MMA GEMM comes to cuBLAS on Hopper (issue 15): the probe kernels of
workers/codegen/wgmma/ on the campaign's GEMM and BMM operators, checked and timed as the
campaign checks and times (the same inputs, flush and timing loop, cuBLAS through the
campaign's own baseline code).

On the GPU machine (the GPU kit carried, `make gpu-kit`):

    bash benchmarks/wgmma_probe.sh          # writes $OUT/wgmma-probe.json as it goes

    python -m benchmarks.wgmma_probe run --out F.json [--operators A,B] [--configs ID,...]
                                         [--seconds S]
    python -m benchmarks.wgmma_probe shapes [--loader tma] [--epilogue staged] [--[no-]split]
    python -m benchmarks.wgmma_probe report F.json [--gpu h100] [--write]

``run`` first checks every shape on one small GEMM with tails in M, N and K, each in a child
process of its own (a kernel that faults takes its CUDA context with it), both readings of
the B descriptor; then times the shapes that passed on every operator, one child per shape,
each operator checked against an fp32 product before it is timed. The file is rewritten
after every child (whole or not at all: a kill mid-write leaves the previous file), so a call
cut short still brings back what it measured. ``--seconds`` is the time the call gives the
probe (wgmma_probe.sh passes PROBE_SECONDS): a child that hangs is given up after a share of
what is left of it (child_timeout), so the shapes after it still run. ``report`` sets
the best probe shape per operator beside cuBLAS and beside the best mma.sync schedule of the
committed campaign (benchmarks/data/<gpu>/), on this CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from pipetune.tuner.metrics import geomean
from pipetune.workers.codegen.wgmma import EPILOGUES, LOADERS
from pipetune.workers.runners.base import summarise
from pipetune.workers.runners.tensor_maps import encode_tensor_map  # tests replace it here

# A small GEMM with tails in M, N and K (not multiples of any block shape): the check every
# shape must pass before it is timed.
CHECK_SHAPE = {"op": "gemm", "m": 200, "n": 328, "k": 200, "b_layout": "kn"}
TOLERANCE = 1e-2  # max |C - fp32 product| over max |fp32 product|: fp16 output rounding is ~5e-4
# A child (one shape, checked or timed on every operator) takes about 9 s on an H100. One
# that hangs is given up after CHILD_SHARE of the probe's time left, between CHILD_FLOOR_S
# and CHILD_TIMEOUT_S (CHILD_TIMEOUT_S where no time was given): a hang then costs the
# shapes after it at most that share, never the whole call (PROBE_SECONDS is 150 on an H100).
CHILD_TIMEOUT_S = 60.0
CHILD_FLOOR_S = 30.0
CHILD_SHARE = 0.25


def child_timeout(seconds_left: float | None) -> float:
    """How long one child may take, given the probe's time left (None: no limit given)."""
    if seconds_left is None:
        return CHILD_TIMEOUT_S
    return max(CHILD_FLOOR_S, min(CHILD_TIMEOUT_S, CHILD_SHARE * seconds_left))


def _configs(ids: list[str] | None, reading: str = "canonical"):
    """The probe shapes with the B descriptor read one way (or those named)."""
    from dataclasses import replace

    from pipetune.workers.codegen.wgmma import B_DESCRIPTORS, PROBE_CONFIGS

    every = [replace(c, b_descriptor=r) for r in B_DESCRIPTORS for c in PROBE_CONFIGS]
    if ids:
        known = {c.id: c for c in every}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise SystemExit(f"error: unknown probe shapes {unknown}; known: {sorted(known)}")
        return [known[i] for i in ids]
    return [c for c in every if c.b_descriptor == reading]


def shape_ids(
    loader: str | None = None,
    epilogue: str | None = None,
    split: bool | None = None,
    persistent: bool | None = None,
    stream_k: bool | None = None,
) -> list[str]:
    """The ids of the probe shapes (canonical reading) with this loader and epilogue, with
    split-K or without, persistent or not, stream-K or not (None: either)."""
    return [
        c.id
        for c in _configs(None)
        if loader in (None, c.loader)
        and epilogue in (None, c.epilogue)
        and split in (None, c.splits > 1)
        and persistent in (None, c.persistent)
        and stream_k in (None, c.stream_k)
    ]


def _operators(names: list[str] | None) -> dict[str, Any]:
    from pipetune.model.operators import ALCOP

    chosen = {n: w for n, w in ALCOP.items() if w.op in ("gemm", "bmm")}
    if names:
        unknown = [n for n in names if n not in chosen]
        if unknown:
            raise SystemExit(f"error: not GEMM or BMM operators of the suite: {unknown}")
        chosen = {n: chosen[n] for n in names}
    return chosen


# ---- the child: one shape, several workloads ------------------------------------------------


def _child(config_fields: dict[str, Any], workloads: list[dict[str, Any]], timed: bool, queue):
    try:
        queue.put(("ok", _measure(config_fields, workloads, timed)))
    except BaseException as exc:  # reported, not raised: the parent records it per shape
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def pattern_inputs(pattern: str, m: int, n: int, k: int):
    """Operands whose product shows where each element went: one operand the identity, the
    other its row or column index (small integers, exact in fp16). Expected C: the index."""
    import numpy as np

    rows_k, cols_n = np.indices((k, n))
    rows_m, cols_k = np.indices((m, k))
    if pattern in ("b_rows", "b_cols"):
        a = np.eye(m, k, dtype=np.float16)
        b = (rows_k if pattern == "b_rows" else cols_n).astype(np.float16)
    elif pattern in ("a_rows", "a_cols"):
        a = (rows_m if pattern == "a_rows" else cols_k).astype(np.float16)
        b = np.eye(k, n, dtype=np.float16)
    else:
        raise ValueError(f"unknown pattern {pattern!r}")
    return a, b


PATTERNS = ("b_rows", "b_cols", "a_rows", "a_cols")


def pattern_agreement(answer: dict[str, Any]) -> float:
    """The share of C's elements that hold the index the pattern predicts (its row for
    *_rows, its column for *_cols): 1.0 when every element landed where it should."""
    import numpy as np

    c = np.asarray(answer["c"], dtype=np.float64)
    rows, cols = np.indices(c.shape)
    expected = rows if answer["pattern"].endswith("_rows") else cols
    return float((c == expected).mean())


DIAGNOSIS_SHAPE = {"op": "gemm", "m": 128, "n": 128, "k": 128, "b_layout": "kn"}


def _device_address(array) -> int:
    return int(array.data.ptr)


def tensor_maps(cupy, config, workload, a, b) -> tuple:
    """The TMA loader's tensor maps of A and B, in device memory, for the kernel's arguments
    after the scalars; () for the cp.async loader."""
    import numpy as np

    from pipetune.workers.codegen import wgmma
    from pipetune.workers.codegen.variants import b_layout_of, variant_of

    if config.loader != "tma":
        return ()
    view = workload.gemm_view()
    b_layout = b_layout_of(variant_of(workload))
    specs = wgmma.tensor_map_specs(view.m, view.n, view.k, view.batch, config, b_layout=b_layout)
    return tuple(
        cupy.asarray(np.frombuffer(encode_tensor_map(spec, _device_address(x)), dtype=np.uint8))
        for spec, x in zip(specs, (a, b), strict=True)
    )


def _measure(config_fields: dict[str, Any], workloads: list[dict[str, Any]], timed: bool):
    """Check (and time) one shape on each workload. A workload with a "pattern" key is run on
    pattern_inputs instead of the campaign's, and its C comes back whole."""
    import cupy
    import numpy as np

    from pipetune.model.family import parse_any_workload
    from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS
    from pipetune.workers.codegen import wgmma
    from pipetune.workers.compile import compile_source
    from pipetune.workers.runners.cupy_child import MIN_FLUSH_BYTES, CupyClock
    from pipetune.workers.runners.reference import make_inputs, operand_shapes
    from pipetune.workers.runners.timing import RepeatPolicy, time_launches

    config = wgmma.WgmmaConfig(**config_fields)
    properties = cupy.cuda.runtime.getDeviceProperties(0)
    l2 = int(properties["l2CacheSize"])
    flush_buffer = cupy.empty(max(2 * l2, MIN_FLUSH_BYTES), dtype=cupy.uint8)
    policy = RepeatPolicy.of(CAMPAIGN_SETTINGS)
    sms = int(properties["multiProcessorCount"])  # a persistent grid's size
    modules: dict[str, Any] = {}
    answers = []
    for canonical in workloads:
        canonical = dict(canonical)
        pattern = canonical.pop("pattern", None)
        workload = parse_any_workload(canonical)
        kernel = wgmma.generate(workload, config)
        if kernel.variant not in modules:
            built = compile_source(kernel.code, "sm_90a", entry=kernel.name)
            path = Path(f"/tmp/{kernel.name}.cubin")
            path.write_bytes(built.cubin)
            module = cupy.RawModule(path=str(path))
            function = module.get_function(kernel.name)
            function.max_dynamic_shared_size_bytes = kernel.smem_bytes
            reduce = None
            if config.splits > 1:
                reduce = module.get_function(wgmma.reduce_kernel_name(kernel.variant, config))
            modules[kernel.variant] = (function, reduce, built.registers)
        function, reduce, registers = modules[kernel.variant]
        grid, scalars = wgmma.launch(kernel, workload, sms)
        if pattern is None:
            a_host, b_host = make_inputs(workload, CAMPAIGN_SETTINGS.seed)
        else:
            view = workload.gemm_view()
            a_host, b_host = pattern_inputs(pattern, view.m, view.n, view.k)
        a, b = cupy.asarray(a_host), cupy.asarray(b_host)
        c = cupy.full(operand_shapes(workload)[2], cupy.nan, dtype=cupy.float16)
        maps = tensor_maps(cupy, config, workload, a, b)
        # Split-K's f32 partial sums, one C per slice (timed with the reduction: both kernels).
        workspace = (cupy.empty(config.splits * c.size, dtype=cupy.float32),) if reduce else ()
        if config.stream_k:  # two partial tiles per block, an arrival counter per tile (zero)
            floats, counters = wgmma.stream_k_buffers(config, grid[0], scalars[-1])
            workspace = (
                cupy.empty(floats, dtype=cupy.float32),
                cupy.zeros(counters, dtype=cupy.uint32),
            )
        args = (a, b, c, *(np.int32(s) for s in scalars), *maps, *workspace)

        reduction = None
        if reduce is not None:
            blocks = -(-c.size // 2 // wgmma.REDUCE_THREADS)
            reduction = (
                (blocks, 1, 1),
                (wgmma.REDUCE_THREADS, 1, 1),
                (workspace[0], c, np.int32(c.size)),
            )

        def launch(
            function=function, grid=grid, kernel=kernel, args=args, reduce=reduce, then=reduction
        ) -> None:
            function(grid, (kernel.threads, 1, 1), args, shared_mem=kernel.smem_bytes)
            if reduce is not None:
                reduce(*then)

        launch()
        cupy.cuda.Device().synchronize()
        exact = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
        scale = float(cupy.abs(exact).max())
        got = c.astype(cupy.float32)
        unwritten = bool(cupy.isnan(got).any())  # C starts as NaN: a tile never stored
        error = math.inf if unwritten else float(cupy.abs(got - exact).max())
        answer: dict[str, Any] = {
            "workload": canonical,
            "registers": registers,
            "error": error / scale if scale else error,
        }
        answer["correct"] = bool(answer["error"] <= TOLERANCE)
        if pattern is not None:
            answer["pattern"] = pattern
            answer["c"] = cupy.asnumpy(got).round(2).tolist()
        if timed and answer["correct"]:
            answer["samples_ms"] = time_launches(
                launch, lambda: flush_buffer.fill(0), CupyClock(cupy), policy
            )
        answers.append(answer)
        del a, b, c, exact
        cupy.get_default_memory_pool().free_all_blocks()
    return answers


def _in_child(
    config, workloads: list[dict[str, Any]], timed: bool, timeout_s: float = CHILD_TIMEOUT_S
) -> tuple[str, Any]:
    """_measure in a fresh process: ("ok", answers), or ("error", why) for one that raised,
    died without an answer, or took longer than ``timeout_s`` (killed at once then)."""
    from dataclasses import asdict
    from queue import Empty

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(asdict(config), workloads, timed, queue))
    process.start()
    deadline = time.monotonic() + timeout_s
    answered = False
    try:
        while time.monotonic() < deadline:
            try:
                answer = queue.get(timeout=0.5)
                answered = True
                return answer
            except Empty:
                if not process.is_alive():  # (an answer is flushed before the child exits)
                    return "error", f"the child exited with code {process.exitcode} and no answer"
        return "error", f"no answer within {timeout_s:.0f} s"
    finally:
        if answered:  # it is exiting: let it, briefly
            process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


def _vendor(workloads: dict[str, Any]) -> dict[str, Any]:
    """cuBLAS on every operator, as the campaign's baselines phase times it."""
    from pipetune.workers.campaign import cuda_side
    from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS
    from pipetune.workers.runners.timing import RepeatPolicy

    policy = RepeatPolicy.of(CAMPAIGN_SETTINGS)  # (run() initialised cuda_side)
    out = {}
    for name, workload in workloads.items():
        try:
            out[name] = cuda_side.vendor_time(workload.canonical(), CAMPAIGN_SETTINGS.seed, policy)
        except Exception as exc:  # recorded; the probe goes on
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def save(out: Path, document: dict[str, Any]) -> None:
    """The probe file, whole: written beside ``out`` and renamed over it, so that a kill
    mid-write (``timeout`` ends the probe with SIGTERM) leaves the previous file, not a
    truncated one that `best` and `report` cannot read."""
    from pipetune.workers.datasets.files import write_atomic

    write_atomic(out, json.dumps(document, indent=1))


def run(
    out: Path,
    operator_names: list[str] | None,
    config_ids: list[str] | None,
    seconds: float | None = None,
) -> dict:
    """Check, diagnose and time the shapes (the module doc); ``seconds``: the time the
    call gives the probe, from now (None: no limit)."""
    from pipetune.workers.campaign import cuda_side

    ends = None if seconds is None else time.monotonic() + seconds

    def in_child(config, workloads: list[dict[str, Any]], timed: bool) -> tuple[str, Any]:
        left = None if ends is None else ends - time.monotonic()
        return _in_child(config, workloads, timed, child_timeout(left))

    operators = _operators(operator_names)
    cuda_side.init(0)
    document: dict[str, Any] = {
        "device": cuda_side.describe(),
        "started": time.time(),
        "tolerance": TOLERANCE,
        "checks": {},
        "runs": {},
    }

    def check(configs) -> list:
        for config in configs:
            status, value = in_child(config, [CHECK_SHAPE], timed=False)
            document["checks"][config.id] = value[0] if status == "ok" else {"fault": value}
            print(f"check {config.id}: {document['checks'][config.id]}", flush=True)
            save(out, document)
        return [c for c in configs if document["checks"][c.id].get("correct")]

    def diagnose() -> None:
        """Where the elements of a failing shape went: the first failing shape of each
        reading of the B descriptor, on the four patterns (pattern_inputs)."""
        failing = {}
        for cid, answer in document["checks"].items():
            if not answer.get("correct") and "fault" not in answer:
                failing.setdefault(cid.endswith("_bswap"), cid)
        known = {c.id: c for c in _configs(list(failing.values()))} if failing else {}
        for cid in failing.values():
            jobs = [{**DIAGNOSIS_SHAPE, "pattern": p} for p in PATTERNS]
            status, value = in_child(known[cid], jobs, timed=False)
            document.setdefault("diagnosis", {})[cid] = (
                value if status == "ok" else {"fault": value}
            )
            save(out, document)

    save(out, document)
    passed = check(_configs(config_ids))
    if not passed and not config_ids:
        # Every shape failed as the ISA's table reads the B descriptor: try the other reading.
        passed = check(_configs(None, "swapped"))
    diagnose()
    document["vendor"] = _vendor(operators)
    save(out, document)
    canonicals = [w.canonical() for w in operators.values()]
    for config in passed:
        status, value = in_child(config, canonicals, timed=True)
        if status == "ok":
            document["runs"][config.id] = dict(zip(operators, value, strict=True))
        else:
            document["runs"][config.id] = {"fault": value}
        print(f"timed {config.id}: {status}", flush=True)
        save(out, document)
    document["finished"] = time.time()
    save(out, document)
    return document


# ---- the report (CPU) -------------------------------------------------------------------------


def _median_us(samples_ms: list[float]) -> float:
    return summarise(samples_ms)[0] * 1e3


def loader_of(config_id: str) -> str:
    """The loader a probe shape's id names (wgmma.WgmmaConfig.id)."""
    return "tma" if "_tma" in config_id else "cp.async"


def fastest_shape(
    document: dict[str, Any], operator: str, loader: str | None = None
) -> tuple[str, float] | None:
    """(id, median µs) of the shape that ran ``operator`` fastest (of those with ``loader``,
    if given), or None."""
    timings = {
        cid: _median_us(run[operator]["samples_ms"])
        for cid, run in document.get("runs", {}).items()
        if operator in run and run[operator].get("samples_ms") and loader in (None, loader_of(cid))
    }
    if not timings:
        return None
    best = min(timings, key=timings.__getitem__)
    return best, timings[best]


def summary(document: dict[str, Any], mma_sync_best_us: dict[str, float]) -> list[dict[str, Any]]:
    """Per operator: the best probe shape and its time, cuBLAS's, the best mma.sync
    schedule's (measured by the campaign), and the ratios (library time over ours)."""
    from pipetune.model.operators import ALCOP

    rows = []
    for name in ALCOP:
        vendor = document.get("vendor", {}).get(name)
        found = fastest_shape(document, name)
        if found is None or not vendor or "samples_ms" not in vendor:
            continue
        best_id, wgmma_us = found
        library_us = _median_us(vendor["samples_ms"])
        row = {
            "operator": name,
            "best_shape": best_id,
            "wgmma_us": wgmma_us,
            "library_us": library_us,
            "wgmma_vs_library": library_us / wgmma_us,
        }
        for loader in LOADERS:
            by_loader = fastest_shape(document, name, loader)
            if by_loader is not None:
                row[f"{loader}_us"] = by_loader[1]
        if name in mma_sync_best_us:
            row["mma_sync_us"] = mma_sync_best_us[name]
            row["mma_sync_vs_library"] = library_us / mma_sync_best_us[name]
        rows.append(row)
    return rows


def best_of_calls(rows_per_file: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per operator, the row of the call whose best shape came closest to the library.

    Each call is ranked by its own ratio, since cuBLAS is timed in the same call and a fresh
    machine's clocks differ from the last one's; a time from one call is never divided by
    another call's. The row says which file it came from (``file``)."""
    best: dict[str, dict[str, Any]] = {}
    for source, rows in rows_per_file:
        for row in rows:
            held = best.get(row["operator"])
            if held is None or row["wgmma_vs_library"] > held["wgmma_vs_library"]:
                best[row["operator"]] = {**row, "file": source}
    order = [row["operator"] for _, rows in rows_per_file for row in rows]
    return [best[name] for name in dict.fromkeys(order)]


def render(documents: list[tuple[str, dict[str, Any]]], rows: list[dict[str, Any]]) -> str:
    """The shapes' checks of each probe file, then one row per operator (from the file
    named in the row, where the rows come from several)."""
    lines: list[str] = []
    for source, document in documents:
        lines += _render_checks(source, document)
    return "\n".join(lines + _render_rows(rows, several=len(documents) > 1)) + "\n"


def _render_checks(source: str, document: dict[str, Any]) -> list[str]:
    device = document.get("device", {})
    checks = document.get("checks", {})
    lines = [
        f"Device: {device.get('name', device)}; probe file {source}.",
        "",
        "| shape | check (max error / max value) | registers |",
        "|---|---|---:|",
    ]
    for cid, check in checks.items():
        if "fault" in check:
            lines.append(f"| {cid} | fault: {check['fault'][:120]} | |")
        else:
            verdict = "pass" if check["correct"] else "FAIL"
            lines.append(f"| {cid} | {verdict} ({check['error']:.2e}) | {check['registers']} |")
    for cid, answers in document.get("diagnosis", {}).items():
        if isinstance(answers, dict):  # the child faulted
            lines.append(f"\nDiagnosis of {cid}: fault: {answers['fault'][:120]}")
            continue
        shares = ", ".join(f"{a['pattern']} {pattern_agreement(a):.3f}" for a in answers)
        lines.append(f"\nDiagnosis of {cid} (share of elements where they belong): {shares}.")
    return [*lines, ""]


def _render_rows(rows: list[dict[str, Any]], several: bool) -> list[str]:
    lines = [
        "| operator | best shape | wgmma µs | wgmma cp.async µs | wgmma TMA µs | mma.sync µs "
        "| cuBLAS µs | wgmma / library | mma.sync / library |"
        + (" probe file |" if several else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if several else ""),
    ]

    def us(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.1f}" if key in row else "–"

    for r in rows:
        mma_ratio = f"{r['mma_sync_vs_library']:.2f}" if "mma_sync_vs_library" in r else "–"
        lines.append(
            f"| {r['operator']} | {r['best_shape']} | {r['wgmma_us']:.1f} | "
            f"{us(r, 'cp.async_us')} | {us(r, 'tma_us')} | {us(r, 'mma_sync_us')} | "
            f"{r['library_us']:.1f} | {r['wgmma_vs_library']:.2f} | {mma_ratio} |"
            + (f" {Path(r['file']).name} |" if several else "")
        )
    if rows:
        both = [r["mma_sync_vs_library"] for r in rows if "mma_sync_vs_library" in r]
        lines += [
            "",
            f"Geomean over {len(rows)} operators: wgmma "
            f"{geomean([r['wgmma_vs_library'] for r in rows]):.2f}x of the library"
            + (f", mma.sync {geomean(both):.2f}x" if both else "")
            + ".",
        ]
    return lines


def _mma_sync_best(gpu: str) -> dict[str, float]:
    from benchmarks.campaign_data import DATA_DIR, campaign

    best = {}
    for op in campaign(gpu, DATA_DIR).operators():
        if op.workload.op in ("gemm", "bmm") and op.best is not None:
            best[op.name] = op.best[0]
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="on the GPU: check and time the probe shapes")
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("--operators", type=lambda s: s.split(","), default=None)
    p_run.add_argument("--configs", type=lambda s: s.split(","), default=None)
    p_run.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the time the call gives the probe (PROBE_SECONDS): a hung child gets a share",
    )
    p_shapes = sub.add_parser("shapes", help="the probe shapes' ids, comma-separated (CONFIGS=)")
    p_shapes.add_argument("--loader", choices=LOADERS, default=None)
    p_shapes.add_argument("--epilogue", choices=EPILOGUES, default=None)
    p_shapes.add_argument(
        "--split", action=argparse.BooleanOptionalAction, default=None, help="split-K or not"
    )
    p_shapes.add_argument(
        "--persistent",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one block per SM walking the tiles, or not",
    )
    p_shapes.add_argument(
        "--stream-k",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="persistent blocks sharing out the K steps of all tiles, or not",
    )
    p_best = sub.add_parser("best", help="the fastest shape of a probe file on one operator")
    p_best.add_argument("file", type=Path)
    p_best.add_argument("--operator", required=True)
    p_launch = sub.add_parser("launch", help="on the GPU: one shape, one operator, one launch")
    p_launch.add_argument("--config", required=True)
    p_launch.add_argument("--operator", required=True)
    p_rep = sub.add_parser("report", help="on the CPU: the probe beside cuBLAS and mma.sync")
    p_rep.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="file",
        help="probe files of one GPU; with several, each operator's best call",
    )
    p_rep.add_argument("--gpu", default="h100", help="the campaign to compare with")
    p_rep.add_argument("--write", action="store_true", help="record in benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.operators, args.configs, args.seconds)
        return 0
    if args.command == "shapes":
        ids = shape_ids(args.loader, args.epilogue, args.split, args.persistent, args.stream_k)
        print(",".join(ids))
        return 0
    if args.command == "launch":  # for a profiler to watch (benchmarks/wgmma_probe.sh)
        from dataclasses import asdict

        (config,) = _configs([args.config])
        workload = _operators([args.operator])[args.operator]
        answer = _measure(asdict(config), [workload.canonical()], timed=False)[0]
        print(f"{config.id} on {args.operator}: error {answer['error']:.2e}")
        return 0 if answer["correct"] else 1
    files = args.files if args.command == "report" else [args.file]
    for path in files:
        if not path.exists():
            parser.error(f"no such probe file: {path}")
    documents = [(str(path), json.loads(path.read_text())) for path in files]
    if args.command == "best":
        found = fastest_shape(documents[0][1], args.operator)
        if found is None:
            print(f"error: no timed shape on {args.operator} in {args.file}", file=sys.stderr)
            return 1
        print(found[0])
        return 0
    mma_sync = _mma_sync_best(args.gpu)
    rows = best_of_calls([(source, summary(doc, mma_sync)) for source, doc in documents])
    text = render(documents, rows)
    print(text)
    if args.write:
        from benchmarks.results import write_section

        names = " ".join(str(path) for path in files)
        command = f"`python -m benchmarks.wgmma_probe report {names} --gpu {args.gpu} --write`"
        write_section(
            f"wgmma-probe-{args.gpu}",
            f"wgmma probe on {args.gpu.upper()} against cuBLAS and the mma.sync family (issue 15)",
            text + f"\nCommand: {command}.\n",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
