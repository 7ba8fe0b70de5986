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

The tuner, the cost model, the service, datasets and the dashboard should need nothing
else: a space (:class:`FamilySpace`), its features, its model's predictions
(:class:`FamilyPrediction`) and schedules as knob dicts (:class:`FamilySchedule`).

Families register by name in one registry, loaded lazily (a family module imports this one
for the interface, so this module cannot import them at load time). Each op name belongs to
exactly one family; :func:`family_for_op` and :func:`parse_any_workload` dispatch on it.
"""

from __future__ import annotations

import importlib
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pipetune.model.hardware import GPUSpec
from pipetune.model.workloads import WorkloadError


@dataclass(frozen=True)
class Knob:
    """One knob of a family's schedules.

    ``values`` are ascending ints (the annealer's codec and the datasets rely on the order).
    ``ordered`` says whether the numeric order means something (threads, tile sizes) or the
    values are categories (where a row is kept); ``labels`` names categorical values.
    """

    name: str
    values: tuple[int, ...]
    ordered: bool
    doc: str
    labels: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if list(self.values) != sorted(set(self.values)):
            raise ValueError(f"knob {self.name}: values must be distinct and ascending")
        if any(v not in self.values for v in self.labels):
            raise ValueError(f"knob {self.name}: a label names a value outside the domain")

    def label(self, value: int) -> str:
        return self.labels.get(value, str(value))


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

    def index(self, schedule: Any) -> int: ...

    def subset(self, index: np.ndarray) -> FamilySpace: ...

    @property
    def ids(self) -> list[str]: ...

    @property
    def cache_key(self) -> tuple: ...

    @property
    def feature_names(self) -> tuple[str, ...]: ...

    @property
    def work(self) -> float: ...

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


class KernelFamily(ABC):
    """The interface every kernel family implements (see the module docstring)."""

    name: str  # registry key, e.g. "tensor_gemm", "memops"
    title: str  # one line for people
    work_unit: str  # what space.work counts: "flop" or "byte"
    throughput_unit: str  # how throughput is shown: "TFLOP/s" or "GB/s"
    codegen_module: str  # under pipetune.workers: generate(workload, schedule), launch...
    reference_module: str  # under pipetune.workers: make_inputs, reference, check

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

    @abstractmethod
    def parse_workload(self, data: dict[str, Any]) -> Any:
        """A workload of this family from a plain dict (WorkloadError names a bad field)."""

    @abstractmethod
    def parse_schedule(self, data: dict[str, Any]) -> FamilySchedule:
        """A schedule from a knob dict (ScheduleError names a bad or missing knob)."""

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

    def throughput(self, space: Any, latency_s: Any) -> np.ndarray:
        """Work per second in the family's throughput unit (TFLOP/s or GB/s)."""
        scale = 1e12 if self.work_unit == "flop" else 1e9
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


class KnobArraySpace:
    """A reusable container for a family's space: one int64 array per knob, rows are
    schedules. Subclasses set ``knob_names`` and ``schedule_type`` (built from keyword
    knob values) and add their derived arrays, ``features()``, ``feature_names`` and ``work``.
    """

    knob_names: tuple[str, ...] = ()
    schedule_type: Any = None

    def __init__(self, workload: Any, gpu: GPUSpec, knobs: Mapping[str, np.ndarray]):
        self.workload = workload
        self.gpu = gpu
        self.knobs = {k: np.ascontiguousarray(knobs[k], dtype=np.int64) for k in self.knob_names}

    def __len__(self) -> int:
        return len(self.knobs[self.knob_names[0]])

    def __getitem__(self, i: int) -> Any:
        return self.schedule_type(**{k: int(self.knobs[k][i]) for k in self.knob_names})

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def subset(self, index: np.ndarray) -> Any:
        return type(self)(self.workload, self.gpu, {k: v[index] for k, v in self.knobs.items()})

    @cached_property
    def ids(self) -> list[str]:
        return [s.id for s in self]

    @cached_property
    def _position(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.ids)}

    def index(self, schedule: Any) -> int:
        """Position of a schedule in the space; KeyError if it is not a valid member."""
        return self._position[schedule.id]

    def __contains__(self, schedule: object) -> bool:
        return isinstance(schedule, self.schedule_type) and schedule.id in self._position

    @property
    def cache_key(self) -> tuple:
        """Identifies the space's contents, for caches of per-space arrays."""
        return (self.workload.workload_hash, self.gpu.key, self.gpu.profile, len(self))


def full_grid(knobs: Sequence[Knob]) -> dict[str, np.ndarray]:
    """Every combination of knob values (the cross product), one array per knob."""
    mesh = np.meshgrid(*[np.array(k.values, dtype=np.int64) for k in knobs], indexing="ij")
    return {k.name: grid.ravel() for k, grid in zip(knobs, mesh, strict=True)}


class FamilyError(KeyError):
    """An unknown family name."""


# name -> "module:attribute" of the family instance. Loaded on first use.
_REGISTERED: dict[str, str] = {
    "tensor_gemm": "pipetune.model.gemm_family:TENSOR_GEMM",
    "memops": "pipetune.model.memops.family:MEMORY_OPS",
}
_LOADED: dict[str, KernelFamily] = {}


def register(name: str, target: str) -> None:
    """Register a family instance by "module:attribute" (a third family adds one line)."""
    if name in _REGISTERED and _REGISTERED[name] != target:
        raise ValueError(f"family {name!r} is already registered as {_REGISTERED[name]}")
    _REGISTERED[name] = target
    _LOADED.pop(name, None)


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


def op_families() -> dict[str, KernelFamily]:
    """Every op name with its family; an op claimed by two families is an error."""
    owner: dict[str, KernelFamily] = {}
    for fam in families():
        for op in fam.ops:
            if op in owner:
                raise ValueError(f"op {op!r} belongs to both {owner[op].name} and {fam.name}")
            owner[op] = fam
    return owner


def all_ops() -> tuple[str, ...]:
    return tuple(op_families())


def family_for_op(op: object) -> KernelFamily:
    """The family that owns an op name; WorkloadError('op') for anything else."""
    owners = op_families()
    # isinstance first: a list or dict is unhashable, and `in` on the mapping would raise.
    if not isinstance(op, str) or op not in owners:
        shown = reprlib.repr(op)
        raise WorkloadError("op", f"unknown operator {shown}; known: {', '.join(owners)}")
    return owners[op]


def family_of(workload: Any) -> KernelFamily:
    """The family of a parsed workload (by its op)."""
    return family_for_op(getattr(workload, "op", None))


def parse_any_workload(data: dict[str, Any]) -> Any:
    """A workload of any family from a plain dict, dispatched on its "op"."""
    if not isinstance(data, dict):
        raise WorkloadError("workload", "must be an object with an 'op' field")
    return family_for_op(data.get("op")).parse_workload(data)


def check_knob_dict(knobs: Sequence[Knob], data: object, error: type[Exception]) -> dict[str, int]:
    """Validate a schedule document against a knob declaration (shared by the families):
    an object with exactly the knobs, each an int (not a bool) of its domain."""
    if not isinstance(data, dict):
        raise error("a schedule must be an object of knob values")
    names = [k.name for k in knobs]
    unknown = sorted(str(k) for k in set(data) - set(names))
    if unknown:
        raise error(f"unknown knob(s): {', '.join(unknown)}")
    missing = [n for n in names if n not in data]
    if missing:
        raise error(f"missing knob(s): {', '.join(missing)}")
    for knob in knobs:
        value = data[knob.name]
        if isinstance(value, bool) or not isinstance(value, int) or value not in knob.values:
            raise error(f"{knob.name} must be one of {list(knob.values)}, got {value!r}")
    return {n: int(data[n]) for n in names}
