"""The T4 autotuning results format (schema 1.0.0), as Kernel Tuner and the benchmark hub
write it.

Document::

    {"metadata": {"timeunit": "miliseconds", ...},
     "results": [
        {"timestamp": "2023-12-22 09:54:05.502007+00:00",
         "configuration": {knob: value, ...},
         "times": {"compilation": ms, "framework": ms, "search_algorithm": ms,
                   "validation": ms, "runtimes": [ms, ...]},
         "invalidity": "correct" | "compile" | "runtime" | "correctness" | "timeout"
                       | "constraints",
         "correctness": 1 | 0,
         "measurements": [{"name": "time", "value": ms | "RuntimeFailedConfig", "unit": ...}],
         "objectives": ["time"]}, ...],
     "schema_version": "1.0.0"}

``configuration``, ``times``, ``invalidity`` and ``correctness`` are required by the schema.
A failed configuration has a Kernel Tuner failure marker as its time value and no runtimes.
"timeunit" is spelt "miliseconds" because the benchmark hub's files spell it so; reading
accepts that, "milliseconds" and "ms".

pipetune adds, all allowed by the schema: its provenance under ``metadata["pipetune"]``
(workload, GPU key and name, device name, runner, measurement settings) and, per result,
the measurements "status" (pipetune's trial status, finer than T4's invalidity: a launch
error and a runtime error are both "runtime" to T4), "error" (the failure message),
"spread", "registers", "spill_bytes", "smem_bytes" and "max_abs_error" when known, and
"runner" where the record's runner is not the metadata's (a task several runners measured). The time
measurement is the median of the repeats (Kernel Tuner writes the mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipetune.workers.datasets.files import dumps, parse_json, read_text, write_atomic
from pipetune.workers.datasets.pipetune import check_pipetune
from pipetune.workers.datasets.records import (
    INVALIDITIES,
    Dataset,
    DatasetError,
    Record,
    configuration_key,
    shown,
)

SCHEMA_VERSION = "1.0.0"
TIMEUNIT = "miliseconds"  # the benchmark hub's spelling, kept for byte-level compatibility
_MS_UNITS = {"miliseconds", "milliseconds", "ms"}
# Kernel Tuner's string markers for a failed configuration's objective.
FAILURE_MARKERS = {
    "compile": "CompilationFailedConfig",
    "constraints": "InvalidConfig",
}
RUNTIME_MARKER = "RuntimeFailedConfig"
TIME_UNITS = {"": 1.0, "ms": 1.0, "s": 1e3, "us": 1e-3}


def default_unit(name: str) -> str:
    """The unit a measurement of this name is written with where its record names none."""
    return "B" if name.endswith("_bytes") else ""


# --- writing -------------------------------------------------------------------------


def record_to_t4(record: Record, objectives: Sequence[str] = ("time",)) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if record.timestamp is not None:
        out["timestamp"] = record.timestamp
    out["configuration"] = dict(record.configuration)
    times: dict[str, Any] = {}
    if record.compile_ms is not None:
        times["compilation"] = record.compile_ms
    times.update(record.times)
    if record.runtimes_ms:
        times["runtimes"] = list(record.runtimes_ms)
    out["times"] = times
    out["invalidity"] = record.invalidity
    out["correctness"] = 1 if record.valid else 0
    time_value: Any = record.time_ms
    if time_value is None:
        time_value = FAILURE_MARKERS.get(record.invalidity, RUNTIME_MARKER)
    measurements = [{"name": "time", "value": time_value, "unit": "ms"}]
    if record.status is not None:
        measurements.append({"name": "status", "value": record.status, "unit": ""})
    if record.error is not None:
        measurements.append({"name": "error", "value": record.error, "unit": ""})
    for name, value in record.measurements.items():
        if isinstance(value, tuple):
            value = list(value)
        unit = record.units.get(name, default_unit(name))
        measurements.append({"name": name, "value": value, "unit": unit})
    out["measurements"] = measurements
    out["objectives"] = list(objectives)
    return out


def to_t4_document(dataset: Dataset) -> dict[str, Any]:
    metadata = {"timeunit": TIMEUNIT}
    metadata.update((k, v) for k, v in dataset.metadata.items() if k != "timeunit")
    return {
        "metadata": metadata,
        "results": [record_to_t4(r, dataset.objectives) for r in dataset.records],
        "schema_version": SCHEMA_VERSION,
    }


def write_t4(dataset: Dataset, path: str | Path) -> Path:
    """Write the dataset as a T4 file (gzipped when the name ends in .gz), atomically."""
    return write_atomic(path, dumps(to_t4_document(dataset)))


# --- reading -------------------------------------------------------------------------


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def record_from_t4(
    item: Any, where: str, pipetune_fields: bool = True
) -> tuple[Record, list[str] | None]:
    """One result object -> (Record, its objectives list or None). `pipetune_fields`: the
    measurements "status" and "error" are pipetune's trial status and failure message (a
    file pipetune wrote); else they are measurements like any other."""
    if not isinstance(item, dict):
        raise DatasetError(f"{where}: a result must be an object")
    for required in ("configuration", "times", "invalidity", "correctness"):
        if required not in item:
            raise DatasetError(f"{where}: missing required field {shown(required)}")
    configuration = item["configuration"]
    if not isinstance(configuration, dict):
        raise DatasetError(f"{where}: 'configuration' must be an object")
    invalidity = item["invalidity"]
    # isinstance first: a list or an object is unhashable and `in` a set would raise.
    if not isinstance(invalidity, str) or invalidity not in INVALIDITIES:
        raise DatasetError(f"{where}: unknown invalidity {shown(invalidity)}")
    if not _number(item["correctness"]):
        raise DatasetError(f"{where}: 'correctness' must be a number")
    times = item["times"]
    if not isinstance(times, dict):
        raise DatasetError(f"{where}: 'times' must be an object")
    compile_ms = None
    runtimes: list[float] = []
    other_times: dict[str, float] = {}
    for name, value in times.items():
        if name == "runtimes":
            if not isinstance(value, list) or not all(_number(v) for v in value):
                raise DatasetError(f"{where}: 'times.runtimes' must be a list of numbers")
            runtimes = value
        elif not _number(value):
            # The name is quoted: a key of the file may hold a newline.
            raise DatasetError(
                f"{where}: 'times' entry {shown(name)} must be a number, got {shown(value)}"
            )
        elif name == "compilation":
            compile_ms = value
        else:
            other_times[name] = value

    time_ms = None
    status = error = None
    measurements: dict[str, Any] = {}
    units: dict[str, str] = {}
    items = item.get("measurements", [])
    if not isinstance(items, list):
        raise DatasetError(f"{where}: 'measurements' must be a list")
    seen: set[str] = set()
    for m in items:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or "value" not in m:
            raise DatasetError(f"{where}: a measurement must be an object with name and value")
        name, value, unit = m["name"], m["value"], m.get("unit", "")
        if name in seen:
            raise DatasetError(f"{where}: measurement {shown(name)} appears twice")
        seen.add(name)
        if name == "time":
            if isinstance(value, str):
                continue  # a failure marker: the invalidity says which failure
            if not _number(value) or not isinstance(unit, str) or unit not in TIME_UNITS:
                raise DatasetError(
                    f"{where}: time must be a number in ms, got {shown(value)} {shown(unit)}"
                )
            # Only foreign units are scaled: ms values are kept as written (lossless).
            try:
                time_ms = value if TIME_UNITS[unit] == 1.0 else value * TIME_UNITS[unit]
            except OverflowError:  # an int beyond the float range (10**400 is valid JSON)
                raise DatasetError(f"{where}: time {shown(value)} {unit} is out of range") from None
        elif name == "status" and pipetune_fields:
            status = value
        elif name == "error" and pipetune_fields:
            error = value
        else:
            if not (_number(value) or isinstance(value, str | list)):
                raise DatasetError(
                    f"{where}: measurement {shown(name)} has a {type(value).__name__}"
                )
            measurements[name] = value
            # Kept only where it says more than the default (lossless); a unit that is not
            # a string (null) says nothing, as before.
            if isinstance(unit, str) and unit != default_unit(name):
                units[name] = unit
    objectives = item.get("objectives")
    if objectives is not None and (
        not isinstance(objectives, list) or not all(isinstance(o, str) for o in objectives)
    ):
        raise DatasetError(f"{where}: 'objectives' must be a list of names")
    try:
        record = Record(
            configuration=configuration,
            invalidity=invalidity,
            time_ms=time_ms,
            runtimes_ms=tuple(runtimes),
            compile_ms=compile_ms,
            status=status,
            error=error,
            measurements=measurements,
            times=other_times,
            timestamp=item.get("timestamp"),
            units=units,
        )
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    return record, objectives


def _same_measurement(a: Record, b: Record) -> bool:
    """Whether two results are one measurement: a search that visits a configuration again
    is answered from its cache (everything the same but when it was asked, and the compile
    and framework timings of that visit)."""
    visit = {"compile_ms": None, "times": {}, "timestamp": None}
    return replace(a, **visit) == replace(b, **visit)


def _without_revisits(records: list[Record], source: str) -> list[Record]:
    """The results with each configuration once. Kernel Tuner's T4 writer lists every
    result of a search, a configuration it visited again too (answered from its cache: the
    same times); such a repeat is the first result again and is dropped. A configuration
    with two different measurements is refused: a dataset says what a configuration
    measured, and which of the two is not for the reader to pick."""
    first: dict[tuple, int] = {}
    kept: list[Record] = []
    for i, record in enumerate(records):
        key = configuration_key(record.configuration, sorted(record.configuration))
        if key not in first:
            first[key] = i
            kept.append(record)
        elif not _same_measurement(records[first[key]], record):
            raise DatasetError(
                f"{source}: configuration {shown(dict(record.configuration))} has two "
                f"different results (results[{first[key]}] and results[{i}]): a dataset "
                "holds one measurement per configuration"
            )
    return kept


def from_t4_document(document: Any, source: str) -> Dataset:
    if not isinstance(document, dict):
        raise DatasetError(f"{source}: a T4 document must be a JSON object")
    version = document.get("schema_version")
    if not isinstance(version, str) or version.split(".")[0] != "1":
        raise DatasetError(
            f"{source}: unsupported T4 schema_version {shown(version)} (reads 1.x.y)"
        )
    results = document.get("results")
    if not isinstance(results, list):
        raise DatasetError(f"{source}: a T4 document needs a 'results' list")
    metadata = document.get("metadata", {})
    if not isinstance(metadata, dict):
        raise DatasetError(f"{source}: 'metadata' must be an object")
    metadata = dict(metadata)
    unit = metadata.pop("timeunit", TIMEUNIT)
    if not isinstance(unit, str) or unit not in _MS_UNITS:  # a list would be unhashable
        raise DatasetError(f"{source}: unsupported timeunit {shown(unit)} (reads milliseconds)")
    records = []
    named: list[str] | None = None  # the first result's objectives (written back as such)
    for i, item in enumerate(results):
        # "status" and "error" are pipetune's fields in pipetune's files only: another
        # program's T4 file may name a measurement so ("error": 0.0012 was refused as "an
        # error must be a string").
        record, objectives = record_from_t4(
            item, f"{source}: results[{i}]", pipetune_fields="pipetune" in metadata
        )
        if objectives:
            if named is None:
                named = objectives
            elif objectives[0] != named[0]:
                raise DatasetError(
                    f"{source}: results[{i}] has objective {shown(objectives[0])}, "
                    f"earlier results {shown(named[0])}"
                )
        records.append(record)
    records = _without_revisits(records, source)
    try:
        dataset = Dataset(
            records,
            objective=named[0] if named else "time",
            objectives=named,
            metadata=metadata,
            source=source,
            format="t4",
        )
    except DatasetError as exc:
        raise DatasetError(f"{source}: {exc}") from None
    if "pipetune" in metadata:
        # A pipetune sweep: its schedules and measurement records must be usable too, so
        # that a replay never meets a malformed record mid-way.
        check_pipetune(dataset)
    return dataset


def read_t4(path: str | Path) -> Dataset:
    """Read a T4 results file (gzipped or plain); DatasetError if it is not one, or if it
    carries pipetune metadata but is not a usable pipetune dataset."""
    source = str(path)
    return from_t4_document(parse_json(read_text(path), source), source)
