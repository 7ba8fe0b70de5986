"""Knobs: the one declaration every kernel family's schedules are built from.

A family declares its knobs as a tuple of :class:`Knob` (name, values, ordered, what it
sets); its schedule type is a frozen dataclass of int fields in the same order
(:func:`check_schedule_type` holds the two together at import). Everything else reads the
declaration: the family's space enumeration (:func:`full_grid`), schedule documents on the
wire (:func:`check_knob_dict`), the tuner's codec and encoding (values and order), the
datasets' knob lists and the API schema's enums.

Knob values are ascending ints everywhere, so a schedule is a JSON object of ints on the
wire, in the database and in datasets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, ClassVar, Self

import numpy as np

from pipetune.model.errors import PipetuneError
from pipetune.model.hardware import GPUSpec
from pipetune.model.plain_numbers import plain_integer


class ScheduleError(PipetuneError, ValueError):
    """A schedule document with unknown knobs, missing knobs or values outside the space."""


@dataclass(frozen=True)
class Knob:
    """One knob of a family's schedules.

    ``values`` are ascending ints (the annealer's codec and the datasets rely on the order).
    ``ordered`` says whether the numeric order means something (threads, tile sizes, stage
    counts) or the values are categories (where a row is kept); ``labels`` names
    categorical values; ``doc`` says what the knob sets (the API schema's description).
    """

    name: str
    values: tuple[int, ...]
    ordered: bool
    doc: str
    labels: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if list(self.values) != sorted(set(self.values)):
            raise ValueError(f"knob {self.name}: values must be distinct and ascending")
        if any(isinstance(v, bool) or not isinstance(v, int) for v in self.values):
            raise ValueError(f"knob {self.name}: values must be ints")
        if any(v not in self.values for v in self.labels):
            raise ValueError(f"knob {self.name}: a label names a value outside the domain")

    def label(self, value: int) -> str:
        return self.labels.get(value, str(value))

    def values_said(self) -> str:
        """The domain in words: "[1, 2, 4]", or each code with its label, "0 (global),
        1 (smem), 2 (registers)", where the values are categories (docs name the labels: a
        user who sent "registers" was told only "one of [0, 1, 2]")."""
        if not self.labels:
            return str(list(self.values))
        return ", ".join(
            f"{v} ({self.labels[v]})" if v in self.labels else str(v) for v in self.values
        )


def knob_value_problems(knobs: Sequence[Knob], values: Mapping[str, Any]) -> list[str]:
    """Why knob values are outside their declared domains (empty when none is); an int only,
    never a bool."""
    problems = []
    for knob in knobs:
        value = values[knob.name]
        if isinstance(value, bool) or not isinstance(value, int) or value not in knob.values:
            problems.append(f"{knob.name} must be one of {knob.values_said()}, got {value!r}")
    return problems


def check_knob_dict(
    knobs: Sequence[Knob], data: object, error: type[Exception] = ScheduleError
) -> dict[str, int]:
    """Validate a schedule document against a knob declaration: an object with exactly the
    knobs, each an int (not a bool) of its domain. Returns the knobs in declaration order."""
    if not isinstance(data, Mapping):
        raise error("a schedule must be an object of knob values")
    names = [k.name for k in knobs]
    unknown = sorted(str(k) for k in set(data) - set(names))
    if unknown:
        raise error(f"unknown knob(s): {', '.join(unknown)}")
    missing = [n for n in names if n not in data]
    if missing:
        raise error(f"missing knob(s): {', '.join(missing)}")
    problems = knob_value_problems(knobs, data)
    if problems:
        raise error(problems[0])
    return {n: int(data[n]) for n in names}


def full_grid(knobs: Sequence[Knob]) -> dict[str, np.ndarray]:
    """Every combination of knob values (the cross product), one int64 array per knob."""
    mesh = np.meshgrid(*[np.array(k.values, dtype=np.int64) for k in knobs], indexing="ij")
    return {k.name: grid.ravel() for k, grid in zip(knobs, mesh, strict=True)}


def knob_arrays(knobs: Sequence[Knob], schedules: Iterable[Any]) -> dict[str, np.ndarray]:
    """Schedules (objects with one attribute per knob) as one int64 array per knob."""
    rows = list(schedules)
    return {
        k.name: np.array([getattr(s, k.name) for s in rows], dtype=np.int64).reshape(len(rows))
        for k in knobs
    }


def check_schedule_type(schedule_type: type, knobs: Sequence[Knob]) -> None:
    """A family's schedule dataclass must have exactly the declared knobs, in order (checked
    at import: the declaration and the type cannot drift apart)."""
    names = tuple(f.name for f in dataclasses.fields(schedule_type))
    declared = tuple(k.name for k in knobs)
    if names != declared:
        raise TypeError(
            f"{schedule_type.__name__} has fields {names}, but the knobs declared are {declared}"
        )


def valid_rows(
    grid: Mapping[str, np.ndarray], reasons: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The rows of a knob grid that no validity rule (``reasons``: a boolean array per rule,
    True where a row breaks it) excludes: how every family enumerates its space."""
    bad = np.zeros(len(next(iter(grid.values()))), dtype=bool)
    for mask in reasons.values():
        bad |= np.asarray(mask, dtype=bool)
    return {k: v[~bad] for k, v in grid.items()}


def broken_rules(reasons: Mapping[str, Any]) -> list[str]:
    """The rules one schedule breaks (``reasons`` of its one-row knob arrays)."""
    return [rule for rule, bad in reasons.items() if bool(np.asarray(bad).ravel()[0])]


@cache
def _field_names(schedule_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(schedule_type))


class KnobSchedule:
    """What every family's schedule type (a frozen dataclass of one int per knob, in the
    declaration's order) does the same way; a subclass sets ``declaration`` (a ClassVar)."""

    declaration: tuple[Knob, ...] = ()
    # What `id` writes before the knob values, joined by "-" in the declaration's order ("s-",
    # "m-"); a type whose id reads otherwise overrides `from_id` instead.
    id_prefix: ClassVar[str] = ""

    @classmethod
    def from_id(cls, text: str) -> Any | None:
        """The schedule whose `id` is `text` (what tables, exports and `pipetune tasks` show,
        which users copy); None where `text` is no id of this type; ScheduleError where it
        is one but names a value a knob does not take."""
        if not cls.id_prefix or not text.startswith(cls.id_prefix):
            return None
        values = text.removeprefix(cls.id_prefix).split("-")
        names = [knob.name for knob in cls.declaration]
        if len(values) != len(names) or not all(v.isdigit() for v in values):
            return None
        return cls.from_dict(dict(zip(names, map(int, values), strict=True)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """A schedule from a knob dict (ScheduleError names a bad or missing knob)."""
        # A NumPy integer (a value read from a knob array) is the int it holds.
        if isinstance(data, Mapping):  # (anything else: check_knob_dict says what is wrong)
            data = {name: plain_integer(value) for name, value in data.items()}
        return cls(**check_knob_dict(cls.declaration, data, ScheduleError))

    @property
    def id(self) -> str:
        """Stable, readable id: ``id_prefix`` and the knob values in the declaration's order,
        joined by "-" (what `from_id` reads back)."""
        return self.id_prefix + "-".join(str(getattr(self, knob.name)) for knob in self.declaration)

    def as_dict(self) -> dict[str, int]:
        # Not dataclasses.asdict, which deep-copies field by field (18 µs against 1 µs for a
        # GEMM schedule): the service makes a batch of these per advance.
        return {name: getattr(self, name) for name in _field_names(type(self))}

    @property
    def hash(self) -> str:
        """A content hash of the knob values (stable across processes and versions)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def knob_arrays(self) -> dict[str, np.ndarray]:
        """This schedule as one-row knob arrays (what the validity rules take)."""
        return {k: np.array([v], dtype=np.int64) for k, v in self.as_dict().items()}


class KnobArraySpace:
    """The container every family's space is: one int64 array per knob, rows are schedules.

    Subclasses set ``declaration`` (the family's knobs) and ``schedule_type`` (built from
    keyword knob values), and add their derived arrays, ``features()``, ``feature_names``
    and ``work``.
    """

    declaration: tuple[Knob, ...] = ()
    schedule_type: Any = None

    def __init__(self, workload: Any, gpu: GPUSpec, knobs: Mapping[str, np.ndarray]):
        self.workload = workload
        self.gpu = gpu
        self.knobs = {k: np.ascontiguousarray(knobs[k], dtype=np.int64) for k in self.knob_names}

    @staticmethod
    def knob_grid() -> dict[str, np.ndarray]:
        """The family's knob combinations to check (its cross product, or less)."""
        raise NotImplementedError

    @staticmethod
    def invalid_reasons(
        grid: dict[str, np.ndarray], workload: Any, gpu: GPUSpec
    ) -> dict[str, np.ndarray]:
        """The family's validity rules: per rule, True where a row breaks it."""
        raise NotImplementedError

    @classmethod
    def enumerate(cls, workload: Any, gpu: GPUSpec) -> Self:
        """Every valid schedule of a workload on a GPU: the family's knob grid less the rows
        a validity rule excludes."""
        grid = cls.knob_grid()
        return cls(workload, gpu, valid_rows(grid, cls.invalid_reasons(grid, workload, gpu)))

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.declaration)

    @property
    def ordered_knobs(self) -> tuple[bool, ...]:
        """Per knob, whether its values are ordered (the tuner's encoding one-hots the rest)."""
        return tuple(k.ordered for k in self.declaration)

    def __len__(self) -> int:
        return len(self.knobs[self.declaration[0].name])

    def __getitem__(self, i: int) -> Any:
        return self.schedule_type(**dict(zip(self.knobs, self._values[i], strict=True)))

    @cached_property
    def _values(self) -> list[tuple[int, ...]]:
        """Each row's knob values (Python ints, knob_names order): built once, because the
        service turns rows into schedules and schedules into rows on every batch."""
        return list(zip(*(v.tolist() for v in self.knobs.values()), strict=True))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def subset(self, index: np.ndarray) -> Any:
        return type(self)(self.workload, self.gpu, {k: v[index] for k, v in self.knobs.items()})

    @cached_property
    def ids(self) -> list[str]:
        return [s.id for s in self]

    @cached_property
    def _position(self) -> dict[tuple[int, ...], int]:
        # By knob values rather than by id (an id is the values in a string, so the two
        # are one-to-one): no schedule object or string is built per row.
        return {values: i for i, values in enumerate(self._values)}

    def _key(self, schedule: Any) -> tuple[int, ...]:
        return tuple(getattr(schedule, k) for k in self.knobs)

    def index(self, schedule: Any) -> int:
        """Position of a schedule in the space; KeyError if it is not a valid member (a
        schedule of another family is not one, whatever its knob values)."""
        if not isinstance(schedule, self.schedule_type):
            raise KeyError(f"not a {self.schedule_type.__name__}: {schedule!r}")
        return self._position[self._key(schedule)]

    def __contains__(self, schedule: object) -> bool:
        return isinstance(schedule, self.schedule_type) and self._key(schedule) in self._position

    @cached_property
    def cache_key(self) -> tuple:
        """Identifies the space's contents, for caches of per-space arrays: its rows, not
        only how many (two subsets of one size, two tasks' measured schedules of one shape,
        had one key, and a cost model took one's cached features for the other's)."""
        rows = hashlib.blake2b(digest_size=16)
        for name in self.knob_names:
            rows.update(self.knobs[name].tobytes())
        return (
            self.workload.workload_hash,
            self.gpu.key,
            self.gpu.profile,
            len(self),
            rows.hexdigest(),
        )


class PredictedLatencies:
    """What every family's model prediction derives from its predicted kernel times
    (``T_kernel``, seconds per schedule of the space): mixed into each prediction dataclass."""

    T_kernel: np.ndarray

    @property
    def latency_us(self) -> np.ndarray:
        return self.T_kernel * 1e6

    @cached_property
    def order(self) -> np.ndarray:
        """Schedule indices from fastest to slowest predicted (ties in space order)."""
        return np.argsort(self.T_kernel, kind="stable")
