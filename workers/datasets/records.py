"""A recorded search space: one record per configuration, in the T4 results vocabulary.

A :class:`Dataset` holds *generic* configurations (knob name -> value), so that it can carry
pipetune's own sweeps (the 7 schedule knobs) and spaces recorded by other tuners (Kernel
Tuner caches and T4 files, with their own knobs) alike. Times are kept in milliseconds, the
unit of the files, so that a dataset written and read back is identical bit for bit.
"""

from __future__ import annotations

import math
import operator
import reprlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from pipetune.model.errors import PipetuneError
from pipetune.model.trials import LATENCY_US_RANGE, TrialStatus

Invalidity = Literal["correct", "compile", "runtime", "correctness", "timeout", "constraints"]
INVALIDITIES: frozenset[str] = frozenset(get_args(Invalidity))
TRIAL_STATUSES: frozenset[str] = frozenset(get_args(TrialStatus))

# pipetune's trial status -> the T4 invalidity it is recorded as. A launch failure is a
# runtime failure to T4 (the kernel was built, running it failed).
INVALIDITY_OF_STATUS: dict[str, str] = {
    "ok": "correct",
    "compile_error": "compile",
    "launch_error": "runtime",
    "runtime_error": "runtime",
    "wrong_result": "correctness",
    "timeout": "timeout",
}
# The reverse, for records that do not name a pipetune status (foreign files). Kernel
# Tuner's "constraints" (InvalidConfig) is a configuration rejected before any kernel was
# built; the nearest pipetune status is compile_error.
STATUS_OF_INVALIDITY: dict[str, str] = {
    "correct": "ok",
    "compile": "compile_error",
    "runtime": "runtime_error",
    "correctness": "wrong_result",
    "timeout": "timeout",
    "constraints": "compile_error",
}

Scalar = int | float | str | bool | None


class DatasetError(PipetuneError, ValueError):
    """A dataset file that cannot be read (corrupt, truncated, wrong schema) or used."""


# A value quoted in an error message comes from the file, and a corrupt file may hold a
# megabyte-long string or deeply nested lists where a number belongs: quote it shortened,
# so that the message stays one readable line.
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxdict = 12  # a pipetune configuration (7 knobs) is quoted whole
_SHORT.maxlist = _SHORT.maxtuple = 6
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlong = 40


def shown(value: Any) -> str:
    """repr(value), shortened for an error message."""
    return _SHORT.repr(value)


def clipped(text: str, limit: int = 300) -> str:
    """Another module's error text (it may quote file content in full), on one line and
    shortened for an error message."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _finite(value: Any) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range (10**400 is valid JSON)
        return False


def _check_number(what: str | Callable[[], str], value: Any, *, positive: bool = False) -> None:
    """DatasetError naming `what` unless value is a finite number (positive, or else not
    negative). `what` may be a function giving the name: a name that quotes file content
    (reprlib) is made only for a message, not for each of a million values that pass."""
    if _finite(value) and (value > 0 if positive else value >= 0):
        return
    name = what() if callable(what) else what
    if not _finite(value):
        raise DatasetError(f"{name} must be a finite number, got {shown(value)}")
    if positive:
        raise DatasetError(f"{name} must be positive, got {shown(value)}")
    raise DatasetError(f"{name} must not be negative, got {shown(value)}")


def _freeze(value: Any) -> Any:
    """Lists become tuples so that records compare equal after a JSON round trip."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


# slots: a loaded space holds a record per configuration (a million of them for the largest
# Kernel Tuner caches read), and an instance dict per record was a third of their memory.
@dataclass(frozen=True, slots=True)
class Record:
    """One configuration's measurement.

    ``time_ms`` is the objective "time" (for pipetune sweeps the median of the repeats; for
    Kernel Tuner files their mean); ``runtimes_ms`` the individual repeats. ``status`` is
    pipetune's trial status when the record names one, else None (then it follows from
    ``invalidity``, see :attr:`trial_status`). ``measurements`` holds every other named
    measurement (spread, registers, GFLOP/s, ...), ``times`` every other timing of the T4
    ``times`` object (framework, search_algorithm, validation, ...), both in file order.
    """

    configuration: Mapping[str, Scalar]
    invalidity: Invalidity = "correct"
    time_ms: float | None = None
    runtimes_ms: tuple[float, ...] = ()
    compile_ms: float | None = None
    status: TrialStatus | None = None
    error: str | None = None
    measurements: Mapping[str, Any] = field(default_factory=dict)
    times: Mapping[str, float] = field(default_factory=dict)
    timestamp: str | None = None
    # A measurement's unit where the file gave it one other than the one a T4 writer would
    # give (t4.default_unit): a Kernel Tuner file's "GFLOP/s" or "W" was written back as "".
    units: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.configuration, Mapping) or not self.configuration:
            raise DatasetError("a configuration must be a non-empty object of knob values")
        for knob, value in self.configuration.items():
            if not isinstance(knob, str):
                raise DatasetError(f"knob names must be strings, got {shown(knob)}")
            if not (value is None or isinstance(value, str | bool | int | float)):
                raise DatasetError(
                    f"knob {shown(knob)} must have a scalar value, got {shown(value)}"
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise DatasetError(f"knob {shown(knob)} has a non-finite value {shown(value)}")
        if self.invalidity not in INVALIDITIES:
            raise DatasetError(
                f"invalidity must be one of {sorted(INVALIDITIES)}, got {shown(self.invalidity)}"
            )
        if self.time_ms is not None:
            _check_number("time", self.time_ms, positive=True)
            # The range a kernel's time can be in (a subnormal time's throughput overflowed
            # to infinity, and `bench tuner --json` printed NaN for the dataset's scores).
            low_ms, high_ms = (us / 1e3 for us in LATENCY_US_RANGE)
            if not low_ms <= self.time_ms <= high_ms:
                raise DatasetError(
                    f"time must be between {low_ms:g} and {high_ms:g} ms (a nanosecond to "
                    f"about three hours), got {shown(self.time_ms)}"
                )
        elif self.invalidity == "correct":
            raise DatasetError("a valid ('correct') record needs a time")
        for sample in self.runtimes_ms:
            _check_number("a runtime sample", sample)
        if self.compile_ms is not None:
            _check_number("compile time", self.compile_ms)
        for name, value in self.times.items():
            _check_number(lambda name=name: f"time {shown(name)}", value)
        if self.status is not None:
            if not isinstance(self.status, str) or self.status not in TRIAL_STATUSES:
                raise DatasetError(f"unknown trial status {shown(self.status)}")
            if INVALIDITY_OF_STATUS[self.status] != self.invalidity:
                raise DatasetError(
                    f"status {shown(self.status)} contradicts invalidity {shown(self.invalidity)}"
                )
        if self.error is not None and not isinstance(self.error, str):
            raise DatasetError(f"an error must be a string, got {shown(self.error)}")
        if self.timestamp is not None and not isinstance(self.timestamp, str):
            raise DatasetError(f"a timestamp must be a string, got {shown(self.timestamp)}")
        # A foreign file's measurements may be named "status" or "error" (t4.record_from_t4):
        # only where the record holds pipetune's field of that name would they collide.
        own = {"time"} | {n for n in ("status", "error") if getattr(self, n) is not None}
        reserved = own & set(self.measurements)
        if reserved:
            raise DatasetError(f"measurement(s) {sorted(reserved)} have their own fields")
        for name, value in self.measurements.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise DatasetError(f"measurement {shown(name)} is not finite: {shown(value)}")
        # Normalise containers: dicts (copied, so the caller's cannot change us) and tuples.
        object.__setattr__(self, "configuration", dict(self.configuration))
        object.__setattr__(self, "runtimes_ms", tuple(self.runtimes_ms))
        object.__setattr__(
            self, "measurements", {k: _freeze(v) for k, v in self.measurements.items()}
        )
        object.__setattr__(self, "times", dict(self.times))

    @property
    def valid(self) -> bool:
        return self.invalidity == "correct"

    @property
    def trial_status(self) -> str:
        """pipetune's status: the recorded one, else the one the T4 invalidity implies."""
        return self.status or STATUS_OF_INVALIDITY[self.invalidity]


def configuration_key(configuration: Mapping[str, Any], knobs: Sequence[str]) -> tuple:
    """What tells one configuration from another, its values in `knobs` order: by type as
    well as value (1, True and 1.0 are other configurations)."""
    return tuple((type(configuration[k]).__name__, configuration[k]) for k in knobs)


class Dataset:
    """Records of one search space (one kernel/workload on one device), one per configuration.

    ``knobs`` orders the configuration keys; every record has exactly those keys, and no
    configuration appears twice (a dataset answers "what did this configuration measure").
    ``objective`` is the file's objective name (pipetune and the benchmark hub: "time");
    whatever it is, :meth:`times_ms` and :meth:`best` rank by the recorded time.
    ``objectives``: every objective the file names, ``objective`` first (kept for writing).
    ``metadata`` is the file's metadata (pipetune's under the "pipetune" key, Kernel Tuner's
    cache header under "kernel_tuner"); ``source`` the path it was read from, if any.
    """

    def __init__(
        self,
        records: Sequence[Record],
        *,
        knobs: Sequence[str] | None = None,
        objective: str = "time",
        metadata: Mapping[str, Any] | None = None,
        source: str | None = None,
        format: str = "t4",
        objectives: Sequence[str] | None = None,
    ):
        self.records: tuple[Record, ...] = tuple(records)
        inferred = knobs is None
        if knobs is None:
            knobs = list(self.records[0].configuration) if self.records else []
        self.knobs: tuple[str, ...] = tuple(knobs)
        self.objective = objective
        self.objectives: tuple[str, ...] = tuple(objectives) if objectives else (objective,)
        if self.objectives[0] != objective:
            raise DatasetError(
                f"objectives {list(self.objectives)} must begin with the objective {objective!r}"
            )
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.source = source
        self.format = format
        expected = set(self.knobs)
        for i, record in enumerate(self.records):
            if record.configuration.keys() != expected:
                # Knobs taken from record 0 are only record 0's: name it, it may be the odd one.
                raise DatasetError(
                    f"record {i} has knobs {sorted(record.configuration)}, "
                    + ("record 0 has" if inferred else "the dataset has")
                    + f" {sorted(expected)}"
                )
        # Built on the first lookup: a benchmark of a million configurations never looks one
        # up, and the index was a fifth of their memory.
        self._index: dict[tuple, int] | None = None
        if not self._values_distinct():
            self._index = self._indexed()

    def _values_distinct(self) -> bool:
        """Whether no two configurations have equal values (hashed in bulk, in C): then none
        appears twice. Where two do (or their hashes meet), `_indexed` decides, by type as
        well as value, and names the records of a configuration given twice."""
        if not self.knobs or not self.records:
            return True
        values = operator.itemgetter(*self.knobs)
        try:
            hashes = {hash(values(r.configuration)) for r in self.records}
        except TypeError:  # (an unhashable value: not a record's)
            return False
        return len(hashes) == len(self.records)

    def _indexed(self) -> dict[tuple, int]:
        index: dict[tuple, int] = {}
        for i, record in enumerate(self.records):
            key = self._key(record.configuration)
            if key in index:
                raise DatasetError(
                    f"configuration {shown(dict(record.configuration))} appears twice "
                    f"(records {index[key]} and {i})"
                )
            index[key] = i
        return index

    def _key(self, configuration: Mapping[str, Any]) -> tuple:
        return configuration_key(configuration, self.knobs)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __getitem__(self, i: int) -> Record:
        return self.records[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return (
            self.records == other.records
            and self.knobs == other.knobs
            and self.objectives == other.objectives
            and self.metadata == other.metadata
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        where = f" from {self.source}" if self.source else ""
        return f"<Dataset {self.format} {len(self)} configurations{where}>"

    @property
    def name(self) -> str:
        return self.source or "<in-memory dataset>"

    def lookup(self, configuration: Mapping[str, Any]) -> Record | None:
        """The record of a configuration, or None if it was not recorded."""
        if set(configuration) != set(self.knobs):
            return None
        if self._index is None:
            self._index = self._indexed()
        i = self._index.get(self._key(configuration))
        return None if i is None else self.records[i]

    def configurations(self) -> list[dict[str, Scalar]]:
        return [dict(r.configuration) for r in self.records]

    def valid_mask(self) -> np.ndarray:
        return np.fromiter((r.valid for r in self.records), dtype=bool, count=len(self))

    def times_ms(self) -> np.ndarray:
        """The "time" of every record in milliseconds (NaN where the configuration failed)."""
        return np.array(
            [r.time_ms if r.valid and r.time_ms is not None else np.nan for r in self.records],
            dtype=np.float64,
        )

    def failures(self) -> dict[str, int]:
        """Failed records counted by T4 invalidity."""
        return dict(Counter(r.invalidity for r in self.records if not r.valid))

    def best(self) -> Record | None:
        """The valid record with the lowest time; None if no configuration succeeded."""
        times = self.times_ms()
        if not np.isfinite(times).any():
            return None
        return self.records[int(np.nanargmin(times))]
