"""The correctness phase: before any timing, check that the kernels compute the right thing.

Each kernel family the campaign sweeps has its cases (shapes) and a per-case sample drawn
by the family's stratified sampler, so that together they reach every kernel variant or op,
every knob value and the tails:

- pipelined GEMMs: ``PER_CASE`` schedules of each of ``CASES`` (>= 300 in all), drawn by
  workers.codegen.sample.stratified_sample: the largest and smallest tiles, the most
  register- and shared-memory-hungry schedules, then every (smem_stages, reg_stages)
  stratum in turn, so every kernel variant meets every shared-memory stage count and both
  register stage values. The shapes leave tails in M, N and K for most tiles and cover
  conv strides 1 and 2 with padding 0 and 1. Checked against an fp32 reference with the
  fp16 tolerance of workers.runners.reference: cuBLAS (``cupy.matmul``) for GEMM and BMM,
  cuDNN through PyTorch (channels-last, fp32 math, TF32 off) for convolutions, falling back
  to im2col through cuBLAS where PyTorch is missing (each case's reference says which).
- memory-intensive ops: ``PER_MEMOPS_CASE`` schedules of each of ``MEMOPS_CASES`` (>= 300
  in all): a cover of every knob value the case's space holds (workers.codegen.memops'
  covering sample), one member of each mapping stratum it missed, then random others.
  Every kind of kernel (reduce sum and max, softmax plain and causal, layernorm, bias + GELU
  in its erf and tanh forms) on two shapes: many rows that leave tails everywhere, and long
  rows that split over up to 128 blocks; together they reach every knob value and mapping
  stratum the op's spaces allow. Checked against the fp32 reference of
  workers.runners.memops_reference with its per-op tolerance (each case's reference
  gives the formula). The counts are per op and per mapping stratum (one row per block,
  packed rows, split rows joined by a second kernel or fused; where a row is kept).

Each kernel is launched on random fp16 inputs and checked, then launched a second time on
the same inputs, its output NaN again and its workspaces as the first run left them (as the
timed runs of the sweeps find them), and checked again (``KernelRunner.verify``, the check
the timed runs get after them): a kernel right only on a clean workspace (a stream-K
arrival counter it does not reset) fails here, ``right on the first run, wrong on a second
run``, where a quarantine or the stop can act on it, not on every timed trial of the sweeps.
One launch more per kernel. Any other outcome than a verified output both times (a wrong
result, a launch or runtime error, a timeout, a compile error) counts as a failure; if more
than ``FAILURE_LIMIT`` of a family's schedules fail, the campaign stops after this phase:
sweeping wrong kernels is worthless, and a family's failures are judged against its own
schedules (a broken generator must not hide among another family's passes).

Where a family's failures are confined to one or two knob values (or one kind of kernel),
the family is *quarantined* instead of stopping the campaign: those values are left out of
its sweeps and everything else of the family goes on, provided the schedules left checked
pass on their own by the same limit and are at least half of the family's
(:func:`quarantine`). A kernel that has never run on hardware (a new tile loop, say) then
costs the call its own sweeps, not every other operator's; the mismatches stay in the
document for the debugging. Verdicts: ``pass``, ``quarantined`` (see ``quarantined``), ``stop``.

The document keeps each family's counts apart (``families``), so that a later call whose
operators need a family the first call did not check (``--have``) checks only that one and
merges it in (:func:`merge`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.model.family import family, family_of
from pipetune.model.hardware import GPUSpec
from pipetune.model.hopper.workloads import as_hopper
from pipetune.model.memops.workloads import (
    bias_gelu,
    layernorm,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm, gemm_bias_gelu, gemm_swiglu
from pipetune.workers.runners.kernel_runner import KernelRunner
from pipetune.workers.runners.reference import TOLERANCE_TEXT

PER_CASE = 36
PER_MEMOPS_CASE = 28
FAILURE_LIMIT = 0.01
# A quarantine leaves out at most this many knob values (or kinds of kernel) of a family,
# and keeps at least this share of its checked schedules: failures spread wider than that
# say the family's generator is broken, and the campaign stops as before.
QUARANTINE_MAX_VALUES = 2
QUARANTINE_MIN_KEPT = 0.5
VARIANT = "variant"  # the pseudo-knob a kind of kernel is quarantined under (kind_of)

# (what the case covers, workload). M = 997 and 333 leave a tail for every block height,
# N = 200 and 136 and K = 328 and 200 for every width and depth but 8 (multiples of 8, as
# the 16-byte loads require); the aligned cases check the path without tails.
CASES: tuple[tuple[str, Any], ...] = (
    ("gemm_kn, tails in M, N, K", gemm(997, 200, 328)),
    ("gemm_kn, aligned", gemm(512, 256, 512)),
    ("gemm_nk, tails in M, N, K", gemm(997, 200, 328, b_layout="nk")),
    ("gemm_swiglu_kn, tails in M, N, K", gemm_swiglu(997, 200, 328)),
    ("gemm_swiglu_nk, tails in M, N, K", gemm_swiglu(333, 136, 200, b_layout="nk")),
    ("gemm_bias_gelu_kn, tails in M, N, K", gemm_bias_gelu(997, 200, 328)),
    (
        "gemm_bias_gelu_nk tanh, tails in M, N, K",
        gemm_bias_gelu(333, 136, 200, b_layout="nk", approximate="tanh"),
    ),
    ("bmm, tails in M, N, K", bmm(3, 333, 136, 200)),
    ("bmm, aligned M and N", bmm(4, 256, 128, 64)),
    ("bmm_nk, tails in M, N, K", bmm(3, 333, 136, 200, b_layout="nk")),
    ("conv2d, stride 2, pad 1", conv2d(2, 15, 13, 24, 40, 3, 3, stride=2, pad=1)),
    ("conv2d, stride 1, pad 0", conv2d(3, 9, 9, 16, 24, 3, 3, stride=1, pad=0)),
    ("conv3d, stride 2, pad 1", conv3d(2, 5, 6, 7, 16, 24, 3, 3, 3, stride=2, pad=1)),
    ("conv3d, stride 1, pad 0", conv3d(1, 6, 6, 6, 8, 16, 3, 3, 3, stride=1, pad=0)),
    # bfloat16: the same kernels with other type words (the mma.sync operand type and the
    # output conversion); a loader of each B layout and both epilogues.
    ("gemm_kn bfloat16, tails in M, N, K", gemm(997, 200, 328, dtype="bfloat16")),
    (
        "gemm_swiglu_nk bfloat16, tails in M, N, K",
        gemm_swiglu(333, 136, 200, b_layout="nk", dtype="bfloat16"),
    ),
    (
        "gemm_bias_gelu_kn bfloat16, tails in M, N, K",
        gemm_bias_gelu(997, 200, 328, dtype="bfloat16"),
    ),
)

# Two shapes per kind of kernel. 997 rows (a prime) leave a last row group short for every
# rows_per_block > 1; 1032 columns are 129 vectors of 8 (3 x 43), so split segments and a
# row's lanes end short for most mappings, and enough rows reach every wave bound. 37 rows
# of 4200 columns (525 vectors of 8) are long enough to split over 128 blocks (the other
# end of the blocks_per_row knob). BERT's layernorm eps (1e-12) on the second shape.
MEMOPS_CASES: tuple[tuple[str, Any], ...] = (
    ("reduce-sum, tails in rows, segments, lanes", reduce(997, 1032)),
    ("reduce-sum, long rows (split)", reduce(37, 4200)),
    ("reduce-max, tails in rows, segments, lanes", reduce(997, 1032, "max")),
    ("reduce-max, long rows (split)", reduce(37, 4200, "max")),
    ("softmax, tails in rows, segments, lanes", softmax(997, 1032)),
    ("softmax, long rows (split)", softmax(37, 4200)),
    # Attention's softmax (its own kernels): scaled, causal over square matrices (whole
    # vectors hidden, the cut one at every offset), and 3 queries against 4200 keys (long
    # rows, split: only the last segment cut).
    ("softmax causal, scaled, tails in segments, lanes", softmax(2064, 1032, 0.125, causal=True)),
    (
        "softmax causal q=3, scaled, long rows (split)",
        softmax(36, 4200, 1 / 128**0.5, causal=True, queries=3),
    ),
    ("layernorm, tails in rows, segments, lanes", layernorm(997, 1032, 1e-5)),
    ("layernorm eps=1e-12, long rows (split)", layernorm(37, 4200, 1e-12)),
    ("rmsnorm, tails in rows, segments, lanes", rmsnorm(997, 1032, 1e-5)),
    ("rmsnorm eps=1e-6, long rows (split)", rmsnorm(37, 4200, 1e-6)),
    ("bias_gelu erf, tails in rows, segments, lanes", bias_gelu(997, 1032)),
    ("bias_gelu erf, long rows (split)", bias_gelu(37, 4200)),
    ("bias_gelu tanh, tails in rows, segments, lanes", bias_gelu(997, 1032, "tanh")),
    ("bias_gelu tanh, long rows (split)", bias_gelu(37, 4200, "tanh")),
    ("silu_mul, tails in rows, segments, lanes", silu_mul(997, 1032)),
    ("silu_mul, long rows (split)", silu_mul(37, 4200)),
    # bfloat16: the same kernels with other conversions (bf16 widened by a shift, rounded by
    # cvt.rn.bf16): a norm on the tails and a split softmax's two passes.
    (
        "rmsnorm bfloat16, tails in rows, segments, lanes",
        rmsnorm(997, 1032, 1e-5).model_copy(update={"dtype": "bfloat16"}),
    ),
    (
        "softmax bfloat16, long rows (split)",
        softmax(37, 4200).model_copy(update={"dtype": "bfloat16"}),
    ),
)


def tails(workload: Any, schedule: Any) -> dict[str, bool]:
    """Where a GEMM schedule leaves a partial tile on a workload (M, N, K)."""
    view = workload.gemm_view()
    return {
        "m": view.m % schedule.block_m != 0,
        "n": view.n % schedule.block_n != 0,
        "k": view.k % schedule.block_k != 0,
    }


def _gemm_sample(space: Any, n: int, seed: int) -> list[Any]:
    from pipetune.workers.codegen.sample import stratified_sample

    return stratified_sample(space, n, seed=seed)


def _gemm_stratum(schedule: Any) -> str:
    return f"smem_stages={schedule.smem_stages},reg_stages={schedule.reg_stages}"


def _memops_sample(space: Any, n: int, seed: int) -> list[Any]:
    """A cover of every knob value the space holds (the family's sampler's first step),
    then one member of each mapping stratum the cover missed (a value cover can leave out
    a combination, e.g. one row per block with the row kept in registers), then random
    others; deterministic for a seed."""
    from pipetune.workers.codegen.memops import covering_sample, stratum

    chosen = covering_sample(list(range(len(space))), lambda i: space[i], seed=seed)
    met = {stratum(space[i]) for i in chosen}
    order = [int(i) for i in np.random.default_rng(seed).permutation(len(space))]
    for i in order:
        if stratum(space[i]) not in met:
            met.add(stratum(space[i]))
            chosen.append(i)
    taken = set(chosen)
    chosen += [i for i in order if i not in taken][: max(0, n - len(chosen))]
    return [space[i] for i in chosen[:n]]


def _memops_stratum(schedule: Any) -> str:
    from pipetune.workers.codegen.memops import stratum

    return stratum(schedule)


def _memops_tails(workload: Any, schedule: Any) -> dict[str, bool]:
    from pipetune.workers.codegen.memops import tails as memops_tails

    return memops_tails(workload, schedule)


# The Hopper wgmma family: the GEMM and BMM tail shapes of CASES (every tile of 64 to 256
# leaves a tail in M and N, and K = 328 and 200 a partial last 64-deep K tile, which the TMA
# unit fills with zeros), and aligned ones; long enough in K that stream-K shares tiles.
HOPPER_CASES: tuple[tuple[str, Any], ...] = (
    ("hopper gemm_kn, tails in M, N, K", as_hopper(gemm(997, 200, 328))),
    ("hopper gemm_kn, aligned, long K", as_hopper(gemm(512, 256, 2048))),
    ("hopper bmm, tails in M, N, K", as_hopper(bmm(3, 333, 136, 200))),
    ("hopper bmm, aligned M and N", as_hopper(bmm(4, 256, 128, 64))),
    # B stored N x K (a PyTorch Linear weight): K-major in shared memory, one TMA box of the
    # block's rows per K tile (rows past N land as zeros), wgmma's trans-b 0.
    ("hopper gemm_nk, tails in M, N, K", as_hopper(gemm(997, 200, 328, b_layout="nk"))),
    ("hopper gemm_nk, aligned, long K", as_hopper(gemm(512, 256, 2048, b_layout="nk"))),
    # Batched (attention's Q·Kᵀ): each entry's B at its own batch coordinate or offset.
    ("hopper bmm_nk, tails in M, N, K", as_hopper(bmm(3, 333, 136, 200, b_layout="nk"))),
    # The bias + GELU epilogue (after the staged epilogue's C tile): both forms, both layouts.
    ("hopper gemm_bias_gelu_kn, tails in M, N, K", as_hopper(gemm_bias_gelu(997, 200, 328))),
    (
        "hopper gemm_bias_gelu_nk tanh, aligned, long K",
        as_hopper(gemm_bias_gelu(512, 256, 2048, b_layout="nk", approximate="tanh")),
    ),
    # The SwiGLU epilogue: gate and up interleaved, C half as wide; tails, both layouts.
    ("hopper gemm_swiglu_kn, tails in M, N, K", as_hopper(gemm_swiglu(997, 104, 328))),
    (
        "hopper gemm_swiglu_nk, aligned, long K",
        as_hopper(gemm_swiglu(512, 128, 2048, b_layout="nk")),
    ),
    # bfloat16: wgmma's .bf16 operands and BFLOAT16 tensor maps, on the tails and long K.
    (
        "hopper gemm_kn bfloat16, aligned, long K",
        as_hopper(gemm(512, 256, 2048, dtype="bfloat16")),
    ),
)
PER_HOPPER_CASE = 40


def _hopper(name: str) -> Any:
    from pipetune.workers.codegen.wgmma import family as hopper_codegen

    return getattr(hopper_codegen, name)


@dataclass(frozen=True)
class FamilyChecks:
    """How the correctness phase checks one kernel family."""

    cases: tuple[tuple[str, Any], ...]
    per_case: int
    sample: Callable[[Any, int, int], list[Any]]  # (space, n, seed) -> schedules
    stratum: Callable[[Any], str]  # the stratum a schedule is counted in
    strata_key: str  # the document's name for the strata counts
    tails: Callable[[Any, Any], dict[str, bool]]  # (workload, schedule) -> axis: has a tail
    tail_axes: tuple[str, ...]
    tolerance: str


FAMILY_CHECKS: dict[str, FamilyChecks] = {
    "tensor_gemm": FamilyChecks(
        CASES, PER_CASE, _gemm_sample, _gemm_stratum, "by_stages", tails, ("m", "n", "k"),
        TOLERANCE_TEXT,
    ),
    "memops": FamilyChecks(
        MEMOPS_CASES, PER_MEMOPS_CASE, _memops_sample, _memops_stratum, "by_mapping",
        _memops_tails, ("rows", "segment", "lanes"),
        "per op (workers/runners/memops_reference.py); each case's reference gives the formula",
    ),
    "hopper_gemm": FamilyChecks(
        HOPPER_CASES, PER_HOPPER_CASE,
        lambda space, n, seed: _hopper("stratified_sample")(space, n, seed=seed),
        lambda schedule: _hopper("stratum")(schedule), "by_tile_loop",
        lambda workload, schedule: _hopper("tails")(workload, schedule), ("m", "n", "k"),
        TOLERANCE_TEXT,
    ),
}  # fmt: skip


def kind_of(workload: Any) -> str:
    """The kind of kernel a workload needs, as the counts name it: the GEMM variant, the
    memory-intensive op (its generator's kernel_kind, as the compile-time table has it),
    with the element type where it is not float16 ("gemm_kn.bfloat16"): a bf16 kernel
    that fails is counted, and quarantined, apart from the float16 kernels the sweeps time."""
    from pipetune.workers.codegen.cuda_text import typed_key
    from pipetune.workers.runners.builds import generator_of

    kind = str(generator_of(workload).kernel_kind(workload))
    return typed_key(kind, getattr(workload, "dtype", "float16"))


def selection(
    gpu: GPUSpec, families: Iterable[str] = tuple(FAMILY_CHECKS)
) -> list[tuple[str, Any, list[Any]]]:
    """(case, workload, schedules) of every case of the families: deterministic for a GPU."""
    chosen = []
    for name in families:
        checks = FAMILY_CHECKS[name]
        fam = family(name)
        for i, (case, workload) in enumerate(checks.cases):
            space = fam.enumerate(workload, gpu)
            chosen.append((case, workload, checks.sample(space, checks.per_case, i)))
    return chosen


def stops(failed: int, total: int, limit: float = FAILURE_LIMIT) -> bool:
    """Whether the campaign stops: more than ``limit`` of the schedules failed."""
    return total == 0 or failed / total > limit


Feature = tuple[str, Any]  # (knob, value), or (VARIANT, kind of kernel)


def features_of(workload: Any, schedule: Any) -> list[Feature]:
    """What a quarantine may leave out of the sweeps that would leave out this schedule."""
    return [*schedule.as_dict().items(), (VARIANT, kind_of(workload))]


def quarantine(
    checked: list[tuple[list[Feature], bool]], limit: float = FAILURE_LIMIT
) -> list[Feature] | None:
    """The fewest knob values (or kinds of kernel) whose schedules, left out, leave the rest
    of the checked ones passing by ``limit``; None where no such set of at most
    QUARANTINE_MAX_VALUES keeps QUARANTINE_MIN_KEPT of them. ``checked``: each schedule's
    features and whether it failed.

    Greedy: first the value with the most failures beyond what the schedules without it
    fail at (its failures minus its schedules times the others' failure rate; ties: the
    higher failure rate); a value whose schedules fail no more often than the others
    explains nothing, and the search gives up. A value every remaining schedule holds
    cannot be told apart from the rest. Deterministic."""
    kept = list(checked)
    chosen: list[Feature] = []
    while kept and sum(f for _, f in kept) / len(kept) > limit:
        if len(chosen) == QUARANTINE_MAX_VALUES:
            return None
        scores = _excess_failures(kept)
        if not scores:
            return None
        feature = max(scores, key=lambda x: scores[x])
        if scores[feature][0] <= 0:
            return None
        chosen.append(feature)
        kept = [(fs, f) for fs, f in kept if feature not in fs]
    if len(kept) < QUARANTINE_MIN_KEPT * len(checked):
        return None
    return chosen


def _excess_failures(
    checked: list[tuple[list[Feature], bool]],
) -> dict[Feature, tuple[float, float, str]]:
    """Per feature some failing schedule holds (and not every schedule): its failures beyond
    the others' failure rate, its own failure rate, and its repr (a deterministic tie-break)."""
    failed_with: dict[Feature, int] = {}
    held_by: dict[Feature, int] = {}
    for features, failed in checked:
        for feature in features:
            held_by[feature] = held_by.get(feature, 0) + 1
            if failed:
                failed_with[feature] = failed_with.get(feature, 0) + 1
    failures = sum(f for _, f in checked)
    scores = {}
    for x, bad in failed_with.items():
        rest = len(checked) - held_by[x]
        if rest:
            rest_rate = (failures - bad) / rest
            scores[x] = (bad - held_by[x] * rest_rate, bad / held_by[x], repr(x))
    return scores


def excluded(features: list[Feature], quarantined: list[Feature]) -> bool:
    """Whether a schedule with these features is left out by a quarantine."""
    return any(tuple(q) in features for q in quarantined)


def family_part(
    name: str,
    checked: list[tuple[str, Any, list[Any], list[MeasureResult]]],
    references: dict[str, Any],
) -> dict[str, Any]:
    """One family's counts, cases and mismatches."""
    checks = FAMILY_CHECKS[name]
    by_variant: dict[str, Counter[str]] = {}
    strata: dict[str, Counter[str]] = {}
    tail_counts: Counter[str] = Counter()
    mismatches: list[dict[str, Any]] = []
    cases = []
    outcomes: list[tuple[list[Feature], bool]] = []
    total = failed = 0
    for case, workload, schedules, results in checked:
        variant = kind_of(workload)
        case_failed = 0
        for schedule, result in zip(schedules, results, strict=True):
            total += 1
            outcomes.append((features_of(workload, schedule), result.status != "ok"))
            by_variant.setdefault(variant, Counter())[result.status] += 1
            strata.setdefault(checks.stratum(schedule), Counter())[result.status] += 1
            has_tail = checks.tails(workload, schedule)
            tail_counts.update(axis for axis, has in has_tail.items() if has)
            if result.status != "ok":
                failed += 1
                case_failed += 1
                mismatches.append(
                    {
                        "case": case,
                        "family": name,
                        "workload": workload.canonical(),
                        "variant": variant,
                        "schedule": schedule.as_dict(),
                        "status": result.status,
                        "max_abs_error": result.max_abs_error,
                        "error": result.error,
                    }
                )
        cases.append(
            {
                "case": case,
                "family": name,
                "workload": workload.canonical(),
                "label": workload.label(),
                "variant": variant,
                "schedules": len(schedules),
                "failed": case_failed,
                "reference": references.get(case),
            }
        )
    verdict, left_out = "pass", None
    if stops(failed, total):
        left_out = quarantine(outcomes) if total else None
        verdict = "stop" if left_out is None else "quarantined"
    quarantined = []
    for knob, value in left_out or []:
        held = [f for features, f in outcomes if (knob, value) in features]
        quarantined.append(
            {"knob": knob, "value": value, "schedules": len(held), "failed": sum(held)}
        )
    kept = [f for features, f in outcomes if not excluded(features, left_out or [])]
    return {
        "schedules": total,
        "passed": total - failed,
        "failed": failed,
        "failed_fraction": failed / total if total else None,
        "verdict": verdict,
        "quarantined": quarantined,
        "kept": {"schedules": len(kept), "failed": sum(kept)},
        "by_variant": {v: dict(c) for v, c in sorted(by_variant.items())},
        "strata": {s: dict(c) for s, c in sorted(strata.items())},
        "tails": {axis: tail_counts[axis] for axis in checks.tail_axes},
        "cases": cases,
        "mismatches": mismatches,
    }


def assemble(parts: dict[str, dict[str, Any]], *, runner: str, simulated: bool) -> dict[str, Any]:
    """The correctness document of the families' parts (family_part)."""
    total = sum(p["schedules"] for p in parts.values())
    failed = sum(p["failed"] for p in parts.values())
    # Each family is held to the limit on its own schedules (so the whole is too, unless a
    # family is quarantined, whose kept schedules are).
    verdicts = {p["verdict"] for p in parts.values()}
    stop = total == 0 or "stop" in verdicts
    verdict = "stop" if stop else "quarantined" if "quarantined" in verdicts else "pass"
    strata_keys = {FAMILY_CHECKS[name].strata_key for name in FAMILY_CHECKS}
    return {
        "runner": runner,
        "simulated": simulated,
        "verified": not simulated,
        "tolerance": {name: FAMILY_CHECKS[name].tolerance for name in parts},
        "schedules": total,
        "passed": total - failed,
        "failed": failed,
        "failed_fraction": failed / total if total else None,
        "limit": FAILURE_LIMIT,
        "verdict": verdict,
        "quarantined": {
            name: p["quarantined"] for name, p in parts.items() if p.get("quarantined")
        },
        "by_variant": {v: c for p in parts.values() for v, c in p["by_variant"].items()},
        **{
            key: {
                s: c
                for name, p in parts.items()
                if FAMILY_CHECKS[name].strata_key == key
                for s, c in p["strata"].items()
            }
            for key in sorted(strata_keys)
        },
        "tails": {axis: n for p in parts.values() for axis, n in p["tails"].items()},
        "families": {
            name: {k: v for k, v in p.items() if k not in ("cases", "mismatches")}
            for name, p in parts.items()
        },
        "cases": [c for p in parts.values() for c in p["cases"]],
        "mismatches": [m for p in parts.values() for m in p["mismatches"]],
        **(
            {"note": "simulated launches: nothing was verified; the counts are the plumbing's"}
            if simulated
            else {}
        ),
    }


def summarise(
    checked: list[tuple[str, Any, list[Any], list[MeasureResult]]],
    references: dict[str, Any],
    *,
    runner: str,
    simulated: bool,
) -> dict[str, Any]:
    """The correctness document of checked cases (of any families, in any order)."""
    by_family: dict[str, list[tuple[str, Any, list[Any], list[MeasureResult]]]] = {}
    for item in checked:
        by_family.setdefault(family_of(item[1]).name, []).append(item)
    parts = {name: family_part(name, items, references) for name, items in by_family.items()}
    return assemble(parts, runner=runner, simulated=simulated)


def checked_families(document: dict[str, Any]) -> list[str]:
    """The families a correctness document checked (a document written before there were
    several families checked the GEMMs only)."""
    return list(document.get("families") or {"tensor_gemm": None})


def _parts(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if "families" not in document:  # one family, before the documents kept families apart
        return {
            "tensor_gemm": {
                **{k: document[k] for k in ("schedules", "passed", "failed", "by_variant")},
                "failed_fraction": document.get("failed_fraction"),
                "verdict": "stop" if stops(document["failed"], document["schedules"]) else "pass",
                "quarantined": [],
                "strata": document.get("by_stages", {}),
                "tails": document.get("tails", {}),
                "cases": document.get("cases", []),
                "mismatches": document.get("mismatches", []),
            }
        }
    return {
        name: {
            **counts,
            "cases": [c for c in document["cases"] if c.get("family") == name],
            "mismatches": [m for m in document["mismatches"] if m.get("family") == name],
        }
        for name, counts in document["families"].items()
    }


def merge(document: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """One document of an earlier call's and the families a later call added."""
    parts = {**_parts(document), **_parts(added)}
    merged = assemble(parts, runner=document["runner"], simulated=document["simulated"])
    merged["device_name"] = document.get("device_name")
    merged["seconds"] = round(document.get("seconds", 0.0) + added.get("seconds", 0.0), 3)
    # What a later call checked, on which device: the families were not checked together.
    merged["added_later"] = [
        *document.get("added_later", []),
        {
            "families": checked_families(added),
            "device_name": added.get("device_name"),
            "seconds": added.get("seconds"),
        },
    ]
    return merged


def stop_reason(document: dict[str, Any]) -> str | None:
    """Why the campaign stops here (None when it goes on): the families whose failures
    are over the limit, with their counts."""
    if document["verdict"] != "stop":
        return None
    parts = _parts(document)
    over = [(n, p) for n, p in parts.items() if p["verdict"] == "stop"] or [
        ("all families", {"failed": document["failed"], "schedules": document["schedules"]})
    ]
    counts = "; ".join(f"{p['failed']} of {p['schedules']} schedules failed ({n})" for n, p in over)
    return (
        f"correctness: {counts}, more than {document['limit']:.0%}; the campaign stops "
        "here, see correctness.json"
    )


def quarantined_features(document: dict[str, Any]) -> dict[str, list[Feature]]:
    """Per family, the knob values (and kinds of kernel) its sweeps leave out."""
    return {
        name: [(q["knob"], q["value"]) for q in values]
        for name, values in (document.get("quarantined") or {}).items()
    }


def skips(document: dict[str, Any] | None, workload: Any) -> bool:
    """Whether a quarantine left out the whole operator (the kind of kernel it needs)."""
    if document is None:
        return False
    left_out = quarantined_features(document).get(family_of(workload).name, [])
    return (VARIANT, kind_of(workload)) in left_out


def quarantine_note(document: dict[str, Any]) -> str | None:
    """What a quarantine leaves out, in a line (None where nothing is)."""
    parts = _parts(document)
    said = []
    for name, p in parts.items():
        for q in p.get("quarantined") or []:
            said.append(
                f"{name} {q['knob']}={q['value']} ({q['failed']} of {q['schedules']} checked "
                "failed)"
            )
    if not said:
        return None
    return (
        "correctness: quarantined " + "; ".join(said) + ": left out of the sweeps, the rest "
        "passed; see correctness.json's mismatches"
    )


# A kernel that hangs costs the trial timeout and a new child each time (15-20 s on the
# campaign's runner): a kind of kernel that deadlocks on every shape would spend most of a
# device call here. Once TIMEOUTS_BEFORE_SKIPPING schedules have timed out, a schedule that
# holds every value they all share (apart from values every schedule run so far holds) is
# not run: it counts as timed out (never as passed), so the quarantine or the stop decides
# as if it had hung. Matching the whole shared pattern, not one value of it, keeps a
# coincidence (two stream-K hangs that also both had 4 stages) from skipping good kernels.
# Schedules go to the runner VERIFY_CHUNK at a time, so that the rule acts early.
TIMEOUTS_BEFORE_SKIPPING = 2
VERIFY_CHUNK = 8


class TimeoutBreaker:
    """Verifies schedules, skipping those that look like every timeout so far."""

    def __init__(self, runner_name: str):
        self.runner_name = runner_name
        self.outcomes: list[tuple[list[Feature], bool]] = []  # run ones: (features, timed out)

    def pattern(self) -> list[Feature]:
        """The values every timed-out schedule holds and not every schedule run; empty
        while fewer than TIMEOUTS_BEFORE_SKIPPING timed out."""
        timed_out = [set(fs) for fs, t in self.outcomes if t]
        if len(timed_out) < TIMEOUTS_BEFORE_SKIPPING:
            return []
        everywhere = set.intersection(*(set(fs) for fs, _ in self.outcomes))
        shared = set.intersection(*timed_out) - everywhere
        return sorted(shared, key=repr)

    def verify(self, runner: KernelRunner, workload: Any, schedules: list[Any]) -> list[Any]:
        features = [features_of(workload, s) for s in schedules]
        results: list[MeasureResult | None] = [None] * len(schedules)
        for start in range(0, len(schedules), VERIFY_CHUNK):
            pattern = self.pattern()
            run = []
            for i in range(start, min(start + VERIFY_CHUNK, len(schedules))):
                if not pattern or not all(f in features[i] for f in pattern):
                    run.append(i)
                    continue
                said = ", ".join(f"{k}={v}" for k, v in pattern)
                timed_out = sum(t for _, t in self.outcomes)
                results[i] = MeasureResult(
                    status="timeout",
                    error=f"not run: {timed_out} schedules with {said} timed out before it",
                    runner=self.runner_name,
                )
            if not run:
                continue
            checked = runner.verify(workload, [schedules[i] for i in run])
            for i, result in zip(run, checked, strict=True):
                results[i] = result
                self.outcomes.append((features[i], result.status == "timeout"))
        return results


def run_correctness(
    runner: KernelRunner, gpu: GPUSpec, families: Iterable[str] = tuple(FAMILY_CHECKS)
) -> dict[str, Any]:
    """Verify the families' selection with the runner; the correctness document."""
    started = time.perf_counter()
    chosen = selection(gpu, families)
    for _, workload, schedules in chosen:
        runner.compile_ahead(workload, schedules)
    previous = runner.conv_reference
    runner.conv_reference = "cudnn"
    checked = []
    references: dict[str, Any] = {}
    breaker = TimeoutBreaker(runner.name)
    try:
        for case, workload, schedules in chosen:
            results = breaker.verify(runner, workload, schedules)
            references[case] = runner.last_prepare
            checked.append((case, workload, schedules, results))
    finally:
        runner.conv_reference = previous
    document = summarise(checked, references, runner=runner.name, simulated=runner.simulated_launch)
    document["device_name"] = runner.device_name
    document["seconds"] = round(time.perf_counter() - started, 3)
    return document
