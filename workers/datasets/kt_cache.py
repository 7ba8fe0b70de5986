"""Kernel Tuner cache files (``.json`` or ``.json.gz``) as datasets.

Document::

    {"device_name": ..., "kernel_name": ..., "problem_size": [...],
     "tune_params_keys": [knob, ...], "tune_params": {knob: [values]}, "objective": "time",
     "cache": {"v1,v2,...": {knob: value, ..., "time": ms | "RuntimeFailedConfig",
                             "times": [ms, ...], "compile_time": ms, "verification_time": ms,
                             "benchmark_time": ms, "strategy_time": ms, "framework_time": ms,
                             "timestamp": "...", "GFLOP/s": ...}, ...}}

Every entry's knob values must be among the header's ``tune_params`` lists, and its key
must be the one Kernel Tuner files those values under (`cache_key`): an entry outside them,
or under another configuration's key, is refused (the file is inconsistent). A failed
configuration has an error marker string as its objective: InvalidConfig (restrictions),
CompilationFailedConfig or RuntimeFailedConfig; such entries are imported as failures. The
timings are renamed as Kernel Tuner's own T4 writer renames them (compile_time ->
compilation, strategy_time -> search_algorithm, ...), so a cache converted to T4 here matches
a T4 file Kernel Tuner wrote.

Kernel Tuner 1.x writes ``"objective"`` as a list (one name per objective; a one-objective
run lists one) and marks a failure with an ``"__error__"`` entry holding the marker (older
versions put the marker into the objective): both are read. pipetune ranks configurations
by ``time`` whatever the objective (it tunes latency); the objective is kept as metadata.

Kernel Tuner before 0.4 wrote no ``problem_size`` (it is metadata here: optional) and
recorded a configuration that failed to compile or run as ``"time": 1e20`` (FAILED_TIME_MS),
read as a failure; its knob values are filed under ``str(value)`` as Python writes them, and
a numpy float32 knob's under numpy's shorter text ("0.1") while the value is written as the
float64 it widens to (0.10000000149011612): both keys are the configuration's.

Kernel Tuner appends to a cache while it tunes and leaves it "open" (no closing brackets,
a trailing comma) if the session ends early; ``allow_open=True`` reads such a file the way
Kernel Tuner does. By default an open cache is an error, like any other truncated file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipetune.workers.datasets.files import parse_json, read_text
from pipetune.workers.datasets.records import Dataset, DatasetError, Record, shown

MARKERS = {
    "InvalidConfig": "constraints",
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "runtime",
}
TIMINGS = {
    "benchmark_time": "benchmark",
    "framework_time": "framework",
    "strategy_time": "search_algorithm",
    "verification_time": "validation",
}
# What a cache must hold (problem_size, which Kernel Tuner 0.4 added, is optional metadata).
HEADER = ("device_name", "kernel_name", "tune_params_keys", "tune_params")
ERROR_KEY = "__error__"
# Kernel Tuner before 1.0 stored a configuration that failed to compile or to run with this
# time (runners/sequential.py: `params.update({"time": 1e20})`), without saying which.
FAILED_TIME_MS = 1e20
FAILED_TIME_INVALIDITY = "runtime"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def close_open_cache(text: str) -> str:
    """Kernel Tuner's repair of a cache left open by an interrupted session."""
    text = text.strip()
    if text and text[-3:] not in ("}\n}", "}}}"):
        if text.endswith(","):
            text = text[:-1]
        text += "}\n}"
    return text


def parse_maybe_open(text: str, source: str) -> Any:
    """The document of a file that may be a cache left open (allow_open): as it is where it
    parses, else closed as Kernel Tuner closes one. Closed whatever it held, a complete file
    that does not end as Kernel Tuner ends a cache (any T4 file, the benchmark hub's
    included) had brackets added to it and was refused as "not valid JSON (Extra data)"."""
    try:
        return parse_json(text, source)
    except DatasetError:
        return parse_json(close_open_cache(text), source)


def cache_key(configuration: dict[str, Any], knobs: list[str]) -> str:
    """The key Kernel Tuner files a configuration under: its values in knob order, as
    Python writes them, joined by commas."""
    return ",".join(str(configuration[k]) for k in knobs)


def _float32_text(value: Any) -> str:
    """A value as numpy writes it where it is a float32 (the shortest text that reads back
    as the same float32); any other value as Python writes it."""
    if isinstance(value, float) and math.isfinite(value):
        single = np.float32(value)
        if float(single) == value:  # (a float32 widened to float64: exactly one)
            return str(single)
    return str(value)


def is_key_of(key: str, configuration: dict[str, Any], knobs: list[str]) -> bool:
    """Whether Kernel Tuner files the configuration under `key`: its cache_key, or the key
    of the same values where float ones were numpy float32s (Kernel Tuner writes the key
    with str() of the float32, "0.1", and the value as the float64 it widens to)."""
    if key == cache_key(configuration, knobs):
        return True
    return key == ",".join(_float32_text(configuration[k]) for k in knobs)


def _entry_record(
    key: str,
    entry: Any,
    knobs: list[str],
    tune_params: dict[str, list],
    objective: str,
    where: str,
) -> Record:
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: an entry must be an object")
    missing = [k for k in knobs if k not in entry]
    if missing:
        raise DatasetError(f"{where}: missing knob(s) {shown(missing)}")
    # Kernel Tuner 1.x: a failed configuration's marker is its "__error__" (the objective
    # itself may then be absent).
    error = entry.get(ERROR_KEY)
    if error is not None and not (isinstance(error, str) and error in MARKERS):
        raise DatasetError(f"{where}: {ERROR_KEY} {shown(error)} is not a failure marker")
    if objective not in entry and error is None:
        raise DatasetError(f"{where}: missing objective {shown(objective)}")
    configuration = {k: entry[k] for k in knobs}
    for knob, value in configuration.items():
        # A configuration outside the declared ranges is a corrupt entry: the offline
        # benchmark indexes configurations by these value lists.
        if value not in tune_params[knob]:
            raise DatasetError(
                f"{where}: knob {shown(knob)} = {shown(value)} is not one of its "
                f"tune_params values {shown(tune_params[knob])}"
            )
    # Kernel Tuner looks an entry up by its key (its simulation mode answers a configuration
    # with the entry under that configuration's key): an entry whose values name another
    # configuration would mean one thing there and another here.
    if not is_key_of(key, configuration, knobs):
        raise DatasetError(
            f"{where}: the entry's knob values are those of configuration "
            f"{shown(cache_key(configuration, knobs))}, not of its key"
        )
    invalidity = MARKERS[error] if error is not None else "correct"
    time_ms = None
    compile_ms = None
    runtimes: list[float] = []
    times: dict[str, float] = {}
    measurements: dict[str, Any] = {}
    for name, value in entry.items():
        if name in configuration or name in ("timestamp", ERROR_KEY):
            continue
        if isinstance(value, str) and value in MARKERS:
            # Kernel Tuner writes the marker into the objective (and sometimes into other
            # metrics of the same failed run); the objective's marker decides the failure.
            if name == objective and error is None:
                invalidity = MARKERS[value]
            continue
        if name == "time":
            if not _number(value):
                raise DatasetError(f"{where}: time must be a number or a failure marker")
            if value == FAILED_TIME_MS and objective == "time" and error is None:
                invalidity = FAILED_TIME_INVALIDITY  # (an old Kernel Tuner's failure)
                continue
            time_ms = value
        elif name == "times":
            if not isinstance(value, list) or not all(_number(v) for v in value):
                raise DatasetError(f"{where}: 'times' must be a list of numbers")
            runtimes = value
        elif name == "compile_time":
            if not _number(value):
                raise DatasetError(f"{where}: 'compile_time' must be a number")
            compile_ms = value
        elif name in TIMINGS:
            if not _number(value):
                raise DatasetError(f"{where}: {shown(name)} must be a number")
            times[TIMINGS[name]] = value
        elif _number(value) or isinstance(value, list):
            measurements[name] = value
        else:
            raise DatasetError(f"{where}: {shown(name)} has an unexpected value {shown(value)}")
    if invalidity == "correct" and objective != "time" and not _number(entry[objective]):
        raise DatasetError(f"{where}: objective {shown(objective)} is not a number")
    try:
        return Record(
            configuration=configuration,
            invalidity=invalidity,  # type: ignore[arg-type]
            time_ms=time_ms,
            runtimes_ms=tuple(runtimes),
            compile_ms=compile_ms,
            measurements=measurements,
            times=times,
            timestamp=entry.get("timestamp"),
        )
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from None


def _records(
    items: list[tuple[str, Any] | None],
    knobs: list[str],
    tune_params: dict[str, list],
    objective: str,
    source: str,
) -> list[Record]:
    """Each entry's record in file order, the first bad entry refused with its message. Each
    item is dropped from `items` once read (a caller that passes its own list keeps only
    records): a large cache was held as entries and records at once."""
    records = []
    for i, item in enumerate(items):
        assert item is not None
        items[i] = None
        key, entry = item
        try:
            record = _entry_record(key, entry, knobs, tune_params, objective, "")
        except DatasetError:
            # Read again to be refused with where it is: the entry's key quoted (reprlib)
            # only for a message, not for each of a million entries that pass.
            where = f"{source}: cache[{shown(key)}]"
            _entry_record(key, entry, knobs, tune_params, objective, where)
            raise
        records.append(record)
    return records


def from_kt_cache_document(document: Any, source: str) -> Dataset:
    """The dataset of a parsed cache (the document is left as it is)."""
    return _dataset_of_document(document, source, consume=False)


def dataset_of_own_document(document: Any, source: str) -> Dataset:
    """The dataset of a cache document its caller parsed for this and keeps no use of: its
    entries are taken out of it as they are read, so that a large cache is not held twice
    (entries and records) at once."""
    return _dataset_of_document(document, source, consume=True)


def _dataset_of_document(document: Any, source: str, *, consume: bool) -> Dataset:
    if not isinstance(document, dict):
        raise DatasetError(f"{source}: a Kernel Tuner cache must be a JSON object")
    missing = [k for k in (*HEADER, "cache") if k not in document]
    if missing:
        raise DatasetError(f"{source}: not a Kernel Tuner cache (missing {', '.join(missing)})")
    knobs = document["tune_params_keys"]
    if not isinstance(knobs, list) or not knobs or not all(isinstance(k, str) for k in knobs):
        raise DatasetError(f"{source}: 'tune_params_keys' must be a non-empty list of names")
    if len(set(knobs)) != len(knobs):  # a dataset's knobs are distinct names
        raise DatasetError(f"{source}: 'tune_params_keys' names a knob twice")
    tune_params = document["tune_params"]
    if not isinstance(tune_params, dict) or not all(
        isinstance(tune_params.get(k), list) for k in knobs
    ):
        raise DatasetError(f"{source}: 'tune_params' must give a list of values for every knob")
    objective = document.get("objective", "time")
    # Kernel Tuner 1.x lists its objectives ("objective": ["time"]); the first is the one a
    # failure's marker replaces, as a single name was. All are kept for a T4 file to name
    # (its "objectives" said ["time"] of a cache of ["time", "energy"]).
    objectives = None
    if isinstance(objective, list) and objective and all(isinstance(o, str) for o in objective):
        objective, objectives = objective[0], list(dict.fromkeys(objective))
    if not isinstance(objective, str):
        raise DatasetError(f"{source}: 'objective' must be a name or a list of names")
    cache = document["cache"]
    if not isinstance(cache, dict):
        raise DatasetError(f"{source}: 'cache' must be an object")
    items: list[tuple[str, Any] | None] = list(cache.items())
    if consume:
        cache.clear()
    records = _records(items, knobs, tune_params, objective, source)
    del items
    header = {k: document[k] for k in document if k != "cache"}
    metadata = {"device_name": document["device_name"], "kernel_tuner": header}
    try:
        return Dataset(
            records,
            knobs=knobs,
            objective=objective,
            objectives=objectives,
            metadata=metadata,
            source=source,
            format="kt-cache",
        )
    except DatasetError as exc:
        raise DatasetError(f"{source}: {exc}") from None


def read_kt_cache(path: str | Path, *, allow_open: bool = False) -> Dataset:
    """Read a Kernel Tuner cache file; DatasetError if it is not one (or is truncated)."""
    source = str(path)
    text = read_text(path)
    document = parse_maybe_open(text, source) if allow_open else parse_json(text, source)
    del text  # (the document is read, its text is not needed while the records are made)
    return dataset_of_own_document(document, source)
