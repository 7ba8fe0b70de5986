"""A stratified sample of a schedule space, for compile checks (CLI and tests), and the
shapes whose space is every schedule valid on a GPU.

Compiling a whole space takes minutes; a sample must still reach the corners where code
generation breaks: the largest tile (most accumulators), the most register-hungry and the
most shared-memory-hungry schedules, the smallest tile, and every pipeline depth of both
levels (smem_stages x reg_stages strata, drawn round-robin).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from pipetune.model.space import Schedule, Space
from pipetune.model.workloads import OPS, AnyWorkload, WorkloadError, parse_workload

# A shape per operator on which no shape rule of the space excludes a schedule (tiles up to
# 256x256 fit under M and N, and K holds 6 stages of the deepest BK, 128): its space is every
# schedule valid on the GPU. A kernel takes its shape (and stride, pad) as arguments, so
# these stand for "any shape" when a command is given none.
UNCONSTRAINED_SHAPES: dict[str, dict[str, int]] = {
    "gemm": {"m": 1024, "n": 1024, "k": 1024},
    "gemm_swiglu": {"m": 1024, "n": 512, "k": 1024},  # the GEMM's N is 2n: 1024
    "gemm_bias_gelu": {"m": 1024, "n": 1024, "k": 1024},
    "bmm": {"b": 4, "m": 1024, "n": 1024, "k": 1024},
    "conv2d": {"n": 8, "h": 28, "w": 28, "c": 128, "k": 256, "r": 3, "s": 3, "pad": 1},
    "conv3d": {
        "n": 2,
        "d": 8,
        "h": 28,
        "w": 28,
        "c": 64,
        "k": 256,
        "t": 3,
        "r": 3,
        "s": 3,
        "pad": 1,
    },
}
# Options that pick a different kernel: gemm's B layout, and the element type every kernel is
# written for (the rest of an operator's options, stride and pad, are arguments).
VARIANT_OPTIONS = ("b_layout", "dtype")


def _check_option(op: str, name: str, value: Any) -> None:
    """An argument-only option (a convolution's stride, pad; GELU's form) on its own: its type
    and range.
    Not with the operator's cross-field rules (pad < filter size): they need the shape the
    caller left out, and the kernel takes any such value as an argument."""
    field = OPS[op].model_fields[name]
    try:
        # (a field without constraints, a Literal such as GELU's form, has no metadata, and
        # Annotated takes at least one)
        checked = (
            Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
        )
        TypeAdapter(checked).validate_python(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise WorkloadError(name, f"{err['msg']} (got {value!r})") from None


def unconstrained_workload(op: str, **options: Any) -> AnyWorkload:
    """The operator on its UNCONSTRAINED_SHAPES shape, with the given kernel-choosing
    options (gemm's b_layout, the dtype); KeyError for an operator without one. The other
    options are checked, then left out (a bad one raises WorkloadError: dropped unchecked,
    `--dtype float32` compiled float16 kernels and `--stride 0` passed)."""
    shape = UNCONSTRAINED_SHAPES[op]
    given = {k: v for k, v in options.items() if v is not None}
    for name, value in given.items():
        if name not in VARIANT_OPTIONS:
            _check_option(op, name, value)
    chosen = {k: v for k, v in given.items() if k in VARIANT_OPTIONS}
    return parse_workload({"op": op, **shape, **chosen})


def _extremes(space: Space) -> list[int]:
    volume = space.block_m * space.block_n * space.block_k
    regs = space.est_registers
    # lexsort: the last key is the primary one.
    largest = int(np.lexsort((regs, volume))[-1])
    smallest = int(np.lexsort((-regs, volume))[0])
    hungriest = int(np.lexsort((volume, regs))[-1])
    most_smem = int(np.lexsort((regs, space.smem_bytes))[-1])
    return [largest, smallest, hungriest, most_smem]


def _strata_order(space: Space) -> list[tuple[int, int]]:
    """(smem_stages, reg_stages) strata, ordered so the first pass alternates reg_stages:
    every smem_stages value comes up before any repeats, and both reg_stages early."""
    pairs = zip(
        space.knobs["smem_stages"].tolist(), space.knobs["reg_stages"].tolist(), strict=True
    )
    present = sorted(set(pairs))
    first, second = [], []
    for i, stages in enumerate(sorted({s for s, _ in present})):
        regs = sorted(r for s, r in present if s == stages)
        if i % 2:
            regs.reverse()
        first.append((stages, regs[0]))
        second.extend((stages, r) for r in regs[1:])
    return first + second


def stratified_sample(space: Space, n: int, seed: int = 0) -> list[Schedule]:
    """min(n, len(space)) distinct schedules of the space, deterministic for a seed.

    The extremes come first (largest and smallest tile, most registers, most shared
    memory), then one random member of each (smem_stages, reg_stages) stratum in turn.
    """
    if n < 1:
        raise ValueError("the sample needs at least one schedule")
    if len(space) == 0:
        return []
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    seen: set[int] = set()

    def take(i: int) -> None:
        if i not in seen and len(chosen) < n:
            seen.add(i)
            chosen.append(i)

    for i in _extremes(space):
        take(i)
    stages = space.knobs["smem_stages"]
    reg = space.knobs["reg_stages"]
    pools = []
    for s, r in _strata_order(space):
        members = np.flatnonzero((stages == s) & (reg == r))
        pools.append(list(rng.permutation(members)))
    while len(chosen) < min(n, len(space)):
        for pool in pools:
            while pool and int(pool[-1]) in seen:
                pool.pop()
            if pool:
                take(int(pool.pop()))
    return [space[i] for i in chosen]


def stratum(schedule: Schedule) -> str:
    """The stratum a correctness check counts a schedule in: its pipeline depths."""
    return f"smem_stages={schedule.smem_stages},reg_stages={schedule.reg_stages}"


def tails(workload: AnyWorkload, schedule: Schedule) -> dict[str, bool]:
    """The axes along which the schedule's tiles leave a partial tile (a tail) on the
    workload's implicit GEMM: the predicated loads and stores a check must reach."""
    view = workload.gemm_view()
    return {
        "m": view.m % schedule.block_m != 0,
        "n": view.n % schedule.block_n != 0,
        "k": view.k % schedule.block_k != 0,
    }


def compile_sample(schedules: list[Schedule], count: int) -> list[Schedule]:
    """Up to ``count`` schedules: round-robin over (smem_stages, reg_stages) strata, each
    stratum's smallest block tile first (the quickest to compile)."""
    strata: dict[tuple[int, int], list[Schedule]] = {}
    by_size = sorted(schedules, key=lambda s: (s.block_m * s.block_n * s.block_k, s.id))
    for schedule in by_size:
        strata.setdefault((schedule.smem_stages, schedule.reg_stages), []).append(schedule)
    picked: list[Schedule] = []
    depth = 0
    while len(picked) < min(count, len(by_size)):
        for key in sorted(strata):
            if depth < len(strata[key]) and len(picked) < count:
                picked.append(strata[key][depth])
        depth += 1
    return picked
