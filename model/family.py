"""Kernel families: the unit the rest of pipetune is generic over (docs/architecture.md,
"Kernel families").

A family is everything pipetune knows about one kind of kernel:

- its **workload types** (pydantic models, one per op name) and a parser that raises
  :class:`~pipetune.model.workloads.WorkloadError` naming the bad field;
- its **knobs**: names, value domains (ascending ints, so a schedule is a JSON object of
  ints everywhere: the wire, the database, datasets), which knobs are ordered and what
  the values of the categorical ones mean;
- a **space builder** that enumerates the schedules valid for one workload on one GPU,
  vectorised (one numpy array per knob), with the rules that exclude the rest;
- **features** for the cost model (``space.features()``, named by ``space.feature_names``)
  and ``space.work`` (what one run does: FLOPs for GEMMs, compulsory bytes for
  memory-bound kernels; throughput = work / latency);
- its **analytical model**, evaluated over a whole space at once;
- the **names** of its code generator and reference check under ``pipetune.workers``,
  which workers resolve (``pipetune.workers.families``); model/ never imports workers/.

The tuner, the cost model, the service, the runners, datasets and the dashboard need
nothing else: a space (:class:`FamilySpace`), its features, its model's predictions
(:class:`FamilyPrediction`) and schedules as knob dicts (:class:`FamilySchedule`).

Families register by name in one registry, loaded lazily (a family module imports this one
for the interface, so this module cannot import them at load time). Each op name belongs to
exactly one family; :func:`family_for_op` and :func:`parse_any_workload` dispatch on it.
"""

from __future__ import annotations

import importlib
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pipetune.model.errors import PipetuneError
from pipetune.model.hardware import GPUSpec
from pipetune.model.knobs import (  # the knob vocabulary, re-exported for the families
    Knob,
    KnobArraySpace,
    ScheduleError,
    check_knob_dict,
    full_grid,
    knob_arrays,
)
from pipetune.model.workloads import WorkloadError

__all__ = [
    "FIRST_REVISION",
    "FamilyError",
    "FamilyPrediction",
    "FamilySchedule",
    "FamilySpace",
    "GeneratorRevision",
    "KernelFamily",
    "Knob",
    "KnobArraySpace",
    "Ranked",
    "ScheduleError",
    "all_ops",
    "check_knob_dict",
    "families",
    "family",
    "family_for_knobs",
    "family_for_op",
    "family_names",
    "family_of",
    "full_grid",
    "generator_revision_of",
    "op_families",
    "parse_any_workload",
    "register",
]


@runtime_checkable
class FamilySchedule(Protocol):
    """A schedule: one int per knob, a stable readable id and a content hash."""

    @property
    def id(self) -> str: ...

    @property
    def hash(self) -> str: ...

    def as_dict(self) -> dict[str, int]: ...


@runtime_checkable
class FamilySpace(Protocol):
    """The valid schedules of one workload on one GPU, as one int64 array per knob."""

    workload: Any
    gpu: GPUSpec
    knobs: dict[str, np.ndarray]

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __contains__(self, schedule: object) -> bool: ...

    def index(self, schedule: Any) -> int:
        """The schedule's row; KeyError where it is not a member (`in` is False)."""
        ...

    def subset(self, index: np.ndarray) -> FamilySpace: ...

    @property
    def ids(self) -> list[str]: ...

    @property
    def cache_key(self) -> tuple: ...

    @property
    def feature_names(self) -> tuple[str, ...]: ...

    @property
    def work(self) -> float: ...

    @property
    def knob_names(self) -> tuple[str, ...]: ...

    @property
    def ordered_knobs(self) -> tuple[bool, ...]: ...

    @property
    def smem_bytes(self) -> np.ndarray: ...

    def features(self) -> np.ndarray: ...


@runtime_checkable
class FamilyPrediction(Protocol):
    """The analytical model's view of every schedule of a space (arrays aligned with it)."""

    @property
    def T_kernel(self) -> np.ndarray: ...

    @property
    def latency_us(self) -> np.ndarray: ...

    @property
    def order(self) -> np.ndarray: ...

    def terms(self, i: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Ranked:
    """One schedule of a ranking: its position in the space, knobs, id and model terms."""

    index: int
    schedule: dict[str, int]
    schedule_id: str
    terms: dict[str, Any]


@dataclass(frozen=True)
class GeneratorRevision:
    """Which code generator made a kernel, and which revision of it: measurements describe
    the kernels their generator's revision made, and a change of the generated code that
    changes how fast its schedules run makes the older measurements describe kernels that no
    longer exist (the convolution loader of 2026-11-28 made every convolution schedule 0.80x
    its old time on an H200). A learned prior (tuner/learned_prior.py) for a space reads only
    the newest revision of that space's own line that it has measurements of.

    `line`: the generator, e.g. "tensor_gemm.conv" (a family's kernels that share code and
    change together); `revision`: 1, 2, ... bumped when a change of that line's generated
    code moves its schedules' times beyond a repeated sweep's spread (a few percent;
    tests/test_generator_fingerprints.py fails on any change of a line's generated sources
    until its revision is bumped or the change is judged not to move times).
    Measurements that record none were made by revision 1 of their line (revisions were
    first recorded on 2026-12-01; the one committed exception, the H200's convolutions swept
    on 2026-11-30 by revision 2, says so in its files)."""

    line: str
    revision: int


# Measurements made before revisions were recorded: revision 1 of their generator.
FIRST_REVISION = 1


# What a family's work counts, and how its throughput is shown (work per second, scaled).
THROUGHPUT_UNITS: dict[str, tuple[str, float]] = {"flop": ("TFLOP/s", 1e12), "byte": ("GB/s", 1e9)}


class KernelFamily(ABC):
    """The interface every kernel family implements (see the module docstring)."""

    name: str  # registry key, e.g. "tensor_gemm", "memops"
    title: str  # one line for people
    label: str  # a few words for tables and reports ("tensor-core GEMM")
    work_unit: str  # what work() counts: "flop" or "byte" (a key of THROUGHPUT_UNITS)
    # What `schedule_label` shows, as a table's heading ("thread mapping").
    schedule_heading: str = "schedule"
    codegen_module: str  # under pipetune.workers: generate, launch_plan, build_key, ...
    reference_module: str  # under pipetune.workers: input_buffers, compute_reference, check
    # Whether a task of this family learns its prior from the measured tasks of other shapes
    # unless told otherwise (a task's learned_prior left null): where that was measured to
    # rank better than the analytical model alone (tuner/learned_prior.py).
    learns_by_default: bool = False

    @property
    def throughput_unit(self) -> str:
        """How throughput is shown: "TFLOP/s" (flop) or "GB/s" (byte)."""
        return THROUGHPUT_UNITS[self.work_unit][0]

    @property
    @abstractmethod
    def ops(self) -> Mapping[str, type]:
        """Workload model per op name (the op names are unique across families)."""

    @property
    @abstractmethod
    def knobs(self) -> tuple[Knob, ...]:
        """The knob declaration, in schedule-id order."""

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    @property
    def knob_domains(self) -> dict[str, tuple[int, ...]]:
        return {k.name: k.values for k in self.knobs}

    @property
    def ordered_knobs(self) -> tuple[bool, ...]:
        return tuple(k.ordered for k in self.knobs)

    def knob_arrays(self, schedules: Iterable[Any]) -> dict[str, np.ndarray]:
        """Schedules as one int64 array per knob (for ``space_of``, ``invalid_reasons``)."""
        return knob_arrays(self.knobs, schedules)

    @abstractmethod
    def work(self, workload: Any) -> float:
        """What one run does, in ``work_unit``s: FLOPs for GEMMs, compulsory DRAM bytes for
        memory-bound kernels (``space.work`` of every space of the workload)."""

    def throughput_of(self, workload: Any, latency_us: float) -> float:
        """One run's throughput in the family's unit, from its latency in µs."""
        return self.rate(self.work(workload), latency_us)

    def rate(self, work: float, latency_us: float) -> float:
        """``work`` (in work units) done in ``latency_us``, in the family's throughput unit."""
        return work / (latency_us * 1e-6) / THROUGHPUT_UNITS[self.work_unit][1]

    @abstractmethod
    def schedule_label(self, schedule: Mapping[str, int], workload: Any = None) -> str:
        """A schedule's knobs in one short cell for tables (a tile, a thread mapping); with
        the workload, knobs that do not matter for it are left out."""

    @abstractmethod
    def space_of(self, workload: Any, gpu: GPUSpec, knobs: Mapping[str, np.ndarray]) -> Any:
        """A space holding exactly the given schedules (knob arrays), valid or not: the
        runners evaluate the model on what they are asked to measure."""

    @abstractmethod
    def invalid_reasons(
        self, knobs: Mapping[str, np.ndarray], workload: Any, gpu: GPUSpec
    ) -> dict[str, np.ndarray]:
        """Boolean arrays, one per validity rule, True where a schedule breaks it."""

    def op_generator_revision(self, op: str) -> GeneratorRevision:
        """The generator that makes the kernels of the family's op `op`, at the revision this
        code has (see GeneratorRevision; a family whose kernels change apart overrides this).
        A line is chosen by the op alone, never by a shape: the service selects a line's
        tasks by their workloads' ops (line_ops)."""
        return GeneratorRevision(self.name, FIRST_REVISION)

    def generator_revision(self, workload: Any) -> GeneratorRevision:
        """The generator that makes the workload's kernels, at the revision this code has."""
        return self.op_generator_revision(workload.op)

    def line_ops(self, line: str) -> frozenset[str]:
        """The family's ops whose kernels generator line `line` makes."""
        return frozenset(op for op in self.ops if self.op_generator_revision(op).line == line)

    @abstractmethod
    def parse_workload(self, data: dict[str, Any]) -> Any:
        """A workload of this family from a plain dict (WorkloadError names a bad field)."""

    @abstractmethod
    def parse_schedule(self, data: dict[str, Any]) -> FamilySchedule:
        """A schedule from a knob dict (ScheduleError names a bad or missing knob)."""

    @abstractmethod
    def parse_schedule_id(self, text: str) -> FamilySchedule | None:
        """The schedule whose `id` is `text` (what tables and exports show); None where
        `text` is no id of this family's (ScheduleError where it is one with a value a knob
        does not take)."""

    @abstractmethod
    def enumerate(self, workload: Any, gpu: GPUSpec) -> FamilySpace:
        """Every schedule valid for the workload on the GPU."""

    @abstractmethod
    def schedule_problems(self, schedule: Any, workload: Any, gpu: GPUSpec) -> list[str]:
        """Why one schedule is outside the valid space (empty when it is valid)."""

    @abstractmethod
    def evaluate(self, space: Any) -> FamilyPrediction:
        """The analytical model over a whole space."""

    @abstractmethod
    def model_features(self, space: Any) -> tuple[tuple[str, ...], np.ndarray]:
        """The analytical model's terms as cost-model features (names, one row per
        schedule): what "analytical+xgb" adds to ``space.features()``."""

    @abstractmethod
    def baseline(self, space: Any) -> tuple[str, np.ndarray]:
        """(label, mask) of the fixed mapping the family's gain is reported against: the
        non-pipelined schedules for GEMMs, one row per block for memory-bound kernels."""

    def no_schedule_reason(self, workload: Any, gpu: GPUSpec) -> str:
        """Why no schedule of this family is valid for the workload on the GPU, for an error
        message: the rules that every knob combination breaks (a Hopper kernel on an A100),
        else that each combination breaks one rule or another."""
        grid = full_grid(self.knobs)
        rules = [
            rule
            for rule, bad in self.invalid_reasons(grid, workload, gpu).items()
            if bool(np.all(bad))
        ]
        why = "; ".join(rules) if rules else "every schedule breaks one of the family's rules"
        return f"no schedule of the {self.label} family is valid on {gpu.key}: {why}"

    def throughput(self, space: Any, latency_s: Any) -> np.ndarray:
        """Work per second in the family's throughput unit (TFLOP/s or GB/s)."""
        scale = THROUGHPUT_UNITS[self.work_unit][1]
        return space.work / np.asarray(latency_s, dtype=np.float64) / scale

    def rank(
        self, workload: Any, gpu: GPUSpec, top: int | None = None
    ) -> tuple[FamilySpace, FamilyPrediction, list[Ranked]]:
        """The space, the model's prediction and its top schedules, fastest first."""
        space = self.enumerate(workload, gpu)
        prediction = self.evaluate(space)
        order = prediction.order if top is None else prediction.order[:top]
        ranked = []
        for i in order.tolist():
            schedule = space[i]
            ranked.append(Ranked(i, schedule.as_dict(), schedule.id, prediction.terms(i)))
        return space, prediction, ranked


class FamilyError(PipetuneError, KeyError):
    """An unknown family name."""


# name -> "module:attribute" of the family instance. Loaded on first use.
_REGISTERED: dict[str, str] = {
    "tensor_gemm": "pipetune.model.gemm_family:TENSOR_GEMM",
    "memops": "pipetune.model.memops.family:MEMORY_OPS",
    "hopper_gemm": "pipetune.model.hopper.family:HOPPER_GEMM",
}
_LOADED: dict[str, KernelFamily] = {}


def register(name: str, target: str) -> None:
    """Register a family instance by "module:attribute" (a third family adds one line)."""
    if name in _REGISTERED and _REGISTERED[name] != target:
        raise ValueError(f"family {name!r} is already registered as {_REGISTERED[name]}")
    _REGISTERED[name] = target
    _LOADED.pop(name, None)
    _OP_OWNERS.clear()
    _KNOB_OWNERS.clear()


def family_names() -> tuple[str, ...]:
    return tuple(_REGISTERED)


def family(name: str) -> KernelFamily:
    """The family registered under ``name``."""
    if name not in _LOADED:
        if name not in _REGISTERED:
            known = ", ".join(_REGISTERED)
            raise FamilyError(f"unknown kernel family {reprlib.repr(name)}; known: {known}")
        module_name, attribute = _REGISTERED[name].split(":")
        instance = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(instance, KernelFamily) or instance.name != name:
            raise TypeError(f"{_REGISTERED[name]} is not the KernelFamily {name!r}")
        _LOADED[name] = instance
    return _LOADED[name]


def families() -> list[KernelFamily]:
    return [family(name) for name in _REGISTERED]


def schedule_of_id(text: str) -> FamilySchedule | None:
    """The schedule of whichever family whose `id` is `text` ("s-2-2-1-1-8-6-2", "m-...",
    "wg128x256s3_p"); None where it is no family's (the families' ids do not overlap)."""
    for fam in families():
        schedule = fam.parse_schedule_id(text)
        if schedule is not None:
            return schedule
    return None


_OP_OWNERS: dict[str, KernelFamily] = {}


def _claims(
    names_of: Callable[[KernelFamily], Iterable[str]], what: str
) -> dict[str, KernelFamily]:
    """Name -> the family that claims it (an op, a knob); a name two families claim is an
    error: dispatch by it must be unambiguous."""
    owner: dict[str, KernelFamily] = {}
    for fam in families():
        for name in names_of(fam):
            if name in owner:
                raise ValueError(
                    f"{what} {name!r} belongs to both {owner[name].name} and {fam.name}"
                )
            owner[name] = fam
    return owner


# The longest op name a family may declare: the service stores it in a column this wide
# (service/orm.py's WorkloadRow.op), and PostgreSQL refuses a longer value where SQLite
# would keep it, so the limit is checked here, for every registry, not at the first insert.
OP_MAX_CHARS = 32


def op_families() -> dict[str, KernelFamily]:
    """Every op name with its family; an op claimed by two families, or longer than
    OP_MAX_CHARS, is an error."""
    if not _OP_OWNERS:  # computed once per registry (register() clears it)
        owners = _claims(lambda fam: fam.ops, "op")
        for name, fam in owners.items():
            if len(name) > OP_MAX_CHARS:
                raise ValueError(
                    f"op {name!r} of {fam.name} is longer than {OP_MAX_CHARS} characters"
                )
        _OP_OWNERS.update(owners)
    return dict(_OP_OWNERS)


def all_ops() -> tuple[str, ...]:
    return tuple(op_families())


def family_for_op(op: object) -> KernelFamily:
    """The family that owns an op name; WorkloadError('op') for anything else."""
    owners = _OP_OWNERS or op_families()
    # isinstance first: a list or dict is unhashable, and `in` on the mapping would raise.
    if not isinstance(op, str) or op not in owners:
        shown = reprlib.repr(op)
        raise WorkloadError("op", f"unknown operator {shown}; known: {', '.join(owners)}")
    return owners[op]


def family_of(workload: Any) -> KernelFamily:
    """The family of a parsed workload (by its op)."""
    return family_for_op(getattr(workload, "op", None))


def generator_revision_of(workload: Any) -> GeneratorRevision:
    """The generator line that makes the workload's kernels, at this code's revision."""
    return family_of(workload).generator_revision(workload)


def parse_any_workload(data: dict[str, Any]) -> Any:
    """A workload of any family from a plain dict, dispatched on its "op"."""
    if not isinstance(data, dict):
        raise WorkloadError("workload", "must be an object with an 'op' field")
    return family_for_op(data.get("op")).parse_workload(data)


_KNOB_OWNERS: dict[str, KernelFamily] = {}


def _knob_owners() -> dict[str, KernelFamily]:
    """Knob name -> its family (computed once per registry; a knob of two is an error)."""
    if not _KNOB_OWNERS:
        _KNOB_OWNERS.update(_claims(lambda fam: fam.knob_names, "knob"))
    return _KNOB_OWNERS


def family_for_knobs(names: Iterable[object]) -> KernelFamily:
    """The family whose knobs a schedule document names (knob names are unique across
    families). The one sharing the most names is chosen, so a document with a knob missing
    or one too many is then refused by that family's own check, which names the knob;
    ScheduleError when no family knows any of them."""
    given = {n for n in names if isinstance(n, str)}
    owners = _knob_owners()
    first = next((owners[n] for n in given if n in owners), None)
    if first is not None and given == set(first.knob_names):
        return first  # the usual case: exactly one family's knobs
    best = max(families(), key=lambda f: len(given & set(f.knob_names)))
    if not given & set(best.knob_names):
        known = "; ".join(f"{f.name}: {', '.join(f.knob_names)}" for f in families())
        raise ScheduleError(f"no kernel family has these knobs ({known})")
    return best
