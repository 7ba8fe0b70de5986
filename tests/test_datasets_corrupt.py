"""Corrupted dataset files (issue 7): a clear DatasetError or a consistent dataset, never a
crash and never a partial import.

Every property starts from a small valid file built here (a pipetune T4 sweep, a foreign T4
file, a Kernel Tuner cache), corrupts it at the byte level (truncation, flipped, replaced,
inserted and deleted bytes; plain and gzipped) or at the structure level (deleted keys,
values of another JSON type, duplicates, non-standard tokens, deep nesting, non-UTF-8
bytes), and reads it back. The outcome must be one of:

* a DatasetError whose message is one line that starts with the file's path and says what
  is wrong; nothing else (KeyError, TypeError, RecursionError, OverflowError, zlib.error...);
* a dataset that is internally consistent: every record has the dataset's knobs, a valid
  record has a finite positive time, failures are T4 invalidities, and it can be written as
  T4 and read back unchanged (mutations that happen to leave a valid file are fine).

The commands that write an output (`pipetune dataset convert`, `pipetune db import-optimum`)
must leave no file and no database row behind when the input is refused.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import (
    HealthCheck,
    currently_in_test_context,
    event,
    example,
    given,
    settings,
)
from hypothesis import strategies as st
from shared_datasets import HUB_CACHE, HUB_T4, needs_hub
from sqlalchemy import select
from typer.testing import CliRunner

from pipetune.clients.cli.dataset_cmds import dataset_app
from pipetune.clients.cli.main import app
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import gemm
from pipetune.service.db import Database
from pipetune.service.orm import ReferenceOptimumRow
from pipetune.workers.datasets import (
    Dataset,
    DatasetError,
    Record,
    check_pipetune,
    dataset_from_results,
    load_dataset,
    read_kt_cache,
    read_t4,
    summary,
    to_t4_document,
    write_t4,
)
from pipetune.workers.datasets.records import INVALIDITIES

cli = CliRunner()
# The longest reason (after "<path>: ") a message may give: one readable line.
MAX_REASON = 500
MARKERS = {
    "InvalidConfig": "constraints",
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "runtime",
}

# --- the good files --------------------------------------------------------------------

WORKLOAD = gemm(256, 128, 64)


def _results() -> list[MeasureResult]:
    """Every status and every optional field (as tests/test_datasets.py's awkward_results)."""
    return [
        MeasureResult(
            status="ok",
            latency_us=0.1 + 0.2,
            samples_us=[0.30000000000000004, 1.0000000000000002e-3, 123456.78901234567],
            spread=1 / 3,
            registers=96,
            spill_bytes=0,
            smem_bytes=49152,
            compile_ms=812.3456789012345,
            max_abs_error=2.0**-20,
            runner="cupy",
        ),
        MeasureResult(status="compile_error", error="ptxas: too many resources\nline 2"),
        MeasureResult(status="launch_error", error="CUDA_ERROR_INVALID_VALUE", smem_bytes=1),
        MeasureResult(status="runtime_error", error="illegal address", registers=255),
        MeasureResult(status="wrong_result", max_abs_error=3.25, error="12 outputs off"),
        MeasureResult(status="ok", latency_us=42.5, samples_us=[42.0, 43.0], spread=0.02),
    ]


@cache
def _pipetune_t4() -> dict[str, Any]:
    gpu = get_gpu("h100", calibrated=False)
    space = Space.enumerate(WORKLOAD, gpu)
    dataset = dataset_from_results(
        WORKLOAD,
        gpu,
        [space[i] for i in range(6)],
        _results(),
        runner="cupy",
        device_name="NVIDIA H100 80GB HBM3",
        settings={"warmup": 3, "repeats": 30},
        timestamps="2024-01-01 00:00:00.000001+00:00",
    )
    return to_t4_document(dataset)


@cache
def _foreign_t4() -> dict[str, Any]:
    """A T4 file of another tuner's kernel (no pipetune metadata), failures of each kind."""
    records = [
        Record(
            {"bx": 32, "flag": 0},
            time_ms=1.5,
            runtimes_ms=(1.4, 1.6),
            compile_ms=10.0,
            measurements={"GFLOP/s": 12.5},
            times={"framework": 0.2, "validation": 0},
            timestamp="t0",
        ),
        Record({"bx": 64, "flag": 0}, invalidity="compile", compile_ms=9.0),
        Record({"bx": 32, "flag": 1}, invalidity="constraints"),
        Record({"bx": 64, "flag": 1}, invalidity="runtime"),
    ]
    return to_t4_document(Dataset(records, metadata={"origin": "test"}))


KT_CACHE: dict[str, Any] = {
    "device_name": "Test GPU",
    "kernel_name": "k",
    "problem_size": [64],
    "tune_params_keys": ["bx", "flag"],
    "tune_params": {"bx": [32, 64], "flag": [0, 1]},
    "objective": "time",
    "cache": {
        "32,0": {"bx": 32, "flag": 0, "time": 1.5, "times": [1.4, 1.6], "compile_time": 10.0,
                 "verification_time": 0, "benchmark_time": 3.1, "strategy_time": 0,
                 "framework_time": 0.2, "GFLOP/s": 12.5, "timestamp": "t0"},
        "64,0": {"bx": 64, "flag": 0, "time": "CompilationFailedConfig", "compile_time": 9.0,
                 "verification_time": 0, "benchmark_time": 0, "strategy_time": 0,
                 "framework_time": 0.1, "timestamp": "t1"},
        "32,1": {"bx": 32, "flag": 1, "time": "InvalidConfig"},
        "64,1": {"bx": 64, "flag": 1, "time": "RuntimeFailedConfig",
                 "GFLOP/s": "RuntimeFailedConfig", "compile_time": 8.5, "timestamp": "t3"},
    },
}  # fmt: skip


def good_document(kind: str) -> Any:
    """A fresh (mutable) copy of a good document: "pipetune", "foreign" or "kt"."""
    if kind == "kt":
        return copy.deepcopy(KT_CACHE)
    return copy.deepcopy(_pipetune_t4() if kind == "pipetune" else _foreign_t4())


KINDS = ("pipetune", "foreign", "kt")
READERS: dict[str, Callable[[Path], Dataset]] = {
    "read_t4": read_t4,
    "read_kt_cache": read_kt_cache,
    "read_kt_cache(allow_open)": partial(read_kt_cache, allow_open=True),
    "load_dataset": load_dataset,
    "load_dataset(allow_open)": partial(load_dataset, allow_open=True),
}
READERS_OF = {
    "pipetune": ("read_t4", "load_dataset"),
    "foreign": ("read_t4", "load_dataset"),
    "kt": (
        "read_kt_cache",
        "read_kt_cache(allow_open)",
        "load_dataset",
        "load_dataset(allow_open)",
    ),
}
CASES = [(kind, reader) for kind in KINDS for reader in READERS_OF[kind]]


# --- the outcome: a clear error or a consistent dataset ---------------------------------


def assert_clear(exc: DatasetError, path: Path) -> None:
    """One line that names the file first, then the problem (the field, when there is one)."""
    message = str(exc)
    assert type(exc) is DatasetError
    assert "\n" not in message and "\r" not in message, message
    prefix = f"{path}: "
    assert message.startswith(prefix), message
    reason = message[len(prefix) :]
    assert reason.strip() and reason == reason.strip(), message
    assert len(reason) <= MAX_REASON, f"{len(reason)} characters: {message[:300]}..."


def _finite(value: Any, *, positive: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond the float range: not a usable measurement
        return False
    return finite and (value > 0 if positive else value >= 0)


def assert_consistent(dataset: Dataset, path: Path) -> None:
    assert isinstance(dataset, Dataset)
    assert dataset.source == str(path) and dataset.format in ("t4", "kt-cache")
    knobs = dataset.knobs
    assert all(isinstance(k, str) for k in knobs) and len(set(knobs)) == len(knobs), knobs
    if dataset.records:
        assert knobs
    for record in dataset.records:
        assert set(record.configuration) == set(knobs)
        for value in record.configuration.values():
            assert value is None or isinstance(value, str | int) or _finite(abs(value))
        assert record.invalidity in INVALIDITIES
        if record.valid:
            assert record.time_ms is not None
        if record.time_ms is not None:
            assert _finite(record.time_ms, positive=True), record.time_ms
        assert all(_finite(s) for s in record.runtimes_ms)
        assert record.compile_ms is None or _finite(record.compile_ms)
        assert all(_finite(t) for t in record.times.values())
        assert dataset.lookup(record.configuration) is record
    mask, times = dataset.valid_mask(), dataset.times_ms()
    assert np.isfinite(times[mask]).all() and (times[mask] > 0).all()
    assert np.isnan(times[~mask]).all()
    doc = summary(dataset)
    assert doc["valid"] + doc["failed"] == len(dataset) == doc["configurations"]
    if dataset.format == "kt-cache":
        # The knob ranges the cache declares hold every configuration it records (the
        # offline tuner benchmark indexes configurations by these lists).
        tune_params = dataset.metadata["kernel_tuner"]["tune_params"]
        for record in dataset.records:
            for knob, value in record.configuration.items():
                assert value in tune_params[knob], (knob, value)
    if "pipetune" in dataset.metadata:
        check_pipetune(dataset)
    # What `pipetune dataset convert` does: write it as T4 and read it back unchanged.
    again = read_t4(write_t4(dataset, path.with_name("again.t4.json.gz")))
    assert again.records == dataset.records and again.metadata == dataset.metadata


def _count(outcome: str) -> None:
    # --hypothesis-show-statistics shows how often each branch ran.
    if currently_in_test_context():
        event(outcome)


def read_outcome(reader: str, path: Path) -> Dataset | None:
    """The dataset read (checked consistent), or None after a clear DatasetError. Any other
    exception propagates and fails the test."""
    try:
        dataset = READERS[reader](path)
    except DatasetError as exc:
        assert_clear(exc, path)
        _count("refused")
        return None
    assert_consistent(dataset, path)
    _count("read")
    return dataset


@dataclass(frozen=True)
class Raw:
    """Bytes written verbatim in place of a value: NaN, 1e400, deep nesting, non-UTF-8."""

    data: bytes


# A key duplicated in its object: written as the key again (json keeps the last).
DUP = "\x00dup\x00"


def encode(value: Any) -> bytes:
    """JSON bytes of a document that may hold Raw values and duplicated keys."""
    if isinstance(value, Raw):
        return value.data
    if isinstance(value, dict):
        members = []
        for key, item in value.items():
            name = key.split(DUP)[0] if isinstance(key, str) and DUP in key else key
            members.append(json.dumps(name).encode() + b":" + encode(item))
        return b"{" + b",".join(members) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(encode(v) for v in value) + b"]"
    return json.dumps(value).encode()


def write(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    path.write_bytes(data)
    return path


# --- byte-level corruption ----------------------------------------------------------------


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["truncate", "flip", "replace", "insert", "delete"]))
        n = len(buf)
        if op == "truncate" or n == 0:
            del buf[draw(st.integers(0, max(n - 1, 0))) :]
        elif op == "flip":
            buf[draw(st.integers(0, n - 1))] ^= draw(st.integers(1, 255))
        elif op == "replace":
            buf[draw(st.integers(0, n - 1))] = draw(st.integers(0, 255))
        elif op == "insert":
            pos = draw(st.integers(0, n))
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        else:
            pos = draw(st.integers(0, n - 1))
            del buf[pos : pos + draw(st.integers(1, 16))]
    return bytes(buf)


@st.composite
def corrupt_bytes(draw: st.DrawFn) -> tuple[str, str, str, bytes]:
    """(kind, reader, layer, file bytes): plain JSON, gzip with corrupt compressed bytes, or
    a well-formed gzip of corrupt JSON."""
    kind, reader = draw(st.sampled_from(CASES))
    plain = encode(good_document(kind))
    layer = draw(st.sampled_from(["plain", "gzip", "gzip-of-corrupt"]))
    if layer == "plain":
        data = draw(byte_mutations(plain))
    elif layer == "gzip":
        data = draw(byte_mutations(gzip.compress(plain, mtime=0)))
    else:
        data = gzip.compress(draw(byte_mutations(plain)), mtime=0)
    return kind, reader, layer, data


@settings(max_examples=200, deadline=None)
@given(case=corrupt_bytes())
def test_byte_corruption_is_a_clear_error_or_a_consistent_dataset(case):
    kind, reader, layer, data = case
    with tempfile.TemporaryDirectory() as tmp:
        read_outcome(reader, write(Path(tmp), f"{kind}.{layer}.json", data))


@settings(max_examples=150, deadline=None)
@given(
    case=st.sampled_from(CASES),
    gz=st.booleans(),
    cut=st.floats(0, 1, exclude_max=True),
)
def test_a_truncated_file_is_refused(case, gz, cut):
    kind, reader = case
    plain = encode(good_document(kind))
    data = gzip.compress(plain, mtime=0) if gz else plain
    truncated = data[: int(cut * len(data))]
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), f"{kind}.json", truncated)
        if "allow_open" in reader and not gz:
            # Kernel Tuner's repair may make a valid cache of a prefix: then a consistent one.
            read_outcome(reader, path)
            return
        with pytest.raises(DatasetError) as caught:
            READERS[reader](path)
        assert_clear(caught.value, path)
        if gz and len(truncated) >= 2:  # the gzip magic is there: the stream is cut short
            assert "gzip" in str(caught.value)


def test_the_good_files_read(tmp_path):
    """The starting points are valid: every mutation in this module starts from a file
    that reads, with failures of several kinds."""
    for kind, reader in CASES:
        for gz in (False, True):
            data = encode(good_document(kind))
            path = write(tmp_path, f"{kind}.json", gzip.compress(data) if gz else data)
            dataset = read_outcome(reader, path)
            assert dataset is not None and len(dataset) in (4, 6)
            assert dataset.failures()


# --- structure-level corruption -----------------------------------------------------------

DEEP = 100_000  # far beyond any recursion limit

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
foreign_values = st.one_of(
    json_values,
    st.sampled_from(
        [
            None,
            "",
            "x",
            -1,
            0,
            -0.5,
            10**400,
            -(10**400),
            [],
            {},
            [[]],
            {"": {}},
            *MARKERS,
            Raw(b"NaN"),
            Raw(b"Infinity"),
            Raw(b"-Infinity"),
            Raw(b"1e400"),
            Raw(b"-1e400"),
            Raw(b"1" * 5000),  # more digits than Python converts to an int
            Raw(b'"\xff\xfe"'),  # not UTF-8
            Raw(b'"caf\xe9"'),  # Latin-1
            Raw(b'"\xed\xa0\x80"'),  # an encoded surrogate: not UTF-8 either
            Raw(b'"\\ud800"'),  # a lone surrogate escape: valid JSON, odd string
            Raw(b'"\\u0000"'),
        ]
    ),
    st.integers(1, 3000).map(lambda n: Raw(b"[" * n + b"]" * n)),
    st.integers(1, 3000).map(lambda n: Raw(b'{"a":' * n + b"1" + b"}" * n)),
    st.just(Raw(b"[" * DEEP + b"]" * DEEP)),
).map(copy.deepcopy)  # a fresh copy: a later mutation may add to a drawn [] or {}


def paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every position in a document, outermost first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


def at(document: Any, path: tuple) -> Any:
    for step in path:
        document = document[step]
    return document


@st.composite
def structure_mutation(draw: st.DrawFn, kind: str) -> Any:
    """A good document of this kind with 1-3 mutations at random positions (or a Raw)."""
    document = good_document(kind)
    for _ in range(draw(st.integers(1, 3))):
        if isinstance(document, Raw):
            break
        path = draw(st.sampled_from(list(paths(document))))
        op = draw(st.sampled_from(["delete", "replace", "duplicate", "add"]))
        if not path:
            if op == "replace":
                document = draw(foreign_values)
            continue
        parent, last = at(document, path[:-1]), path[-1]
        if op == "delete":
            del parent[last]
        elif op == "replace":
            parent[last] = draw(foreign_values)
        elif op == "duplicate":
            twin = copy.deepcopy(parent[last])
            if isinstance(parent, list):
                parent.insert(last + 1, twin)
            else:
                # The same key twice; the second copy may differ (json keeps the last).
                value = twin if draw(st.booleans()) else draw(foreign_values)
                parent[f"{last}{DUP}{len(parent)}"] = value
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(foreign_values)
        else:
            parent.insert(last, draw(foreign_values))
    return document


@st.composite
def corrupt_documents(draw: st.DrawFn) -> tuple[str, str, bool, bytes]:
    kind, reader = draw(st.sampled_from(CASES))
    data = encode(draw(structure_mutation(kind)))
    gz = draw(st.booleans())
    return kind, reader, gz, gzip.compress(data, mtime=0) if gz else data


@settings(max_examples=250, deadline=None)
@given(case=corrupt_documents())
def test_structure_corruption_is_a_clear_error_or_a_consistent_dataset(case):
    kind, reader, gz, data = case
    with tempfile.TemporaryDirectory() as tmp:
        read_outcome(reader, write(Path(tmp), f"{kind}.json{'.gz' if gz else ''}", data))


def _required_paths(kind: str) -> list[tuple]:
    """Positions whose deletion must be refused."""
    document = good_document(kind)
    if kind == "kt":
        found: list[tuple] = [(k,) for k in ("tune_params_keys", "tune_params", "cache")]
        # (problem_size is optional: Kernel Tuner before 0.4 wrote none.)
        found += [("device_name",), ("kernel_name",)]
        for key in document["cache"]:
            found += [("cache", key, knob) for knob in document["tune_params_keys"]]
            found.append(("cache", key, "time"))
        return found
    found = [("schema_version",), ("results",)]
    for i, result in enumerate(document["results"]):
        found += [
            ("results", i, f) for f in ("configuration", "times", "invalidity", "correctness")
        ]
        found += [("results", i, "configuration", knob) for knob in result["configuration"]]
        if result["invalidity"] == "correct":
            found.append(("results", i, "measurements"))
    if kind == "pipetune":
        found += [("metadata", "pipetune", "workload"), ("metadata", "pipetune", "gpu")]
    return found


@pytest.mark.parametrize(
    ("kind", "path"), [(kind, path) for kind in KINDS for path in _required_paths(kind)]
)
def test_a_missing_required_field_is_refused(tmp_path, kind, path):
    document = good_document(kind)
    del at(document, path[:-1])[path[-1]]
    bad = write(tmp_path, f"{kind}.json", encode(document))
    for reader in READERS_OF[kind]:
        with pytest.raises(DatasetError) as caught:
            READERS[reader](bad)
        assert_clear(caught.value, bad)


# --- Kernel Tuner caches: failure markers, knob ranges, entries ---------------------------


@settings(max_examples=100, deadline=None)
@given(
    marked=st.dictionaries(
        st.sampled_from(sorted(KT_CACHE["cache"])), st.sampled_from(sorted(MARKERS)), min_size=1
    ),
    also_metrics=st.booleans(),
    reader=st.sampled_from(READERS_OF["kt"]),
)
def test_kernel_tuner_failure_markers_are_imported(marked, also_metrics, reader):
    """InvalidConfig, CompilationFailedConfig and RuntimeFailedConfig are legitimate failed
    configurations: imported as failures of their kind, not refused."""
    document = good_document("kt")
    for key, marker in marked.items():
        entry = document["cache"][key]
        entry["time"] = marker
        if also_metrics:  # Kernel Tuner writes the marker into other metrics as well
            entry["GFLOP/s"] = marker
            entry.pop("times", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), "kt.json", encode(document))
        dataset = read_outcome(reader, path)
        assert dataset is not None
        for record in dataset.records:
            key = ",".join(str(record.configuration[k]) for k in ("bx", "flag"))
            if key in marked:
                assert record.invalidity == MARKERS[marked[key]] and record.time_ms is None
                assert not record.valid
        assert len(dataset) == len(KT_CACHE["cache"])


@settings(max_examples=100, deadline=None)
@given(
    key=st.sampled_from(sorted(KT_CACHE["cache"])),
    knob=st.sampled_from(KT_CACHE["tune_params_keys"]),
    value=st.one_of(
        st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)
    ).filter(lambda v: v not in (32, 64, 0, 1)),
    reader=st.sampled_from(READERS_OF["kt"]),
)
@example(key="32,0", knob="bx", value=48, reader="read_kt_cache")
def test_a_knob_value_outside_the_tunable_range_is_refused(key, knob, value, reader):
    document = good_document("kt")
    document["cache"][key][knob] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), "kt.json", encode(document))
        with pytest.raises(DatasetError, match=knob) as caught:
            READERS[reader](path)
        assert_clear(caught.value, path)


@settings(max_examples=100, deadline=None)
@given(
    key=st.sampled_from(sorted(KT_CACHE["cache"])),
    entry=foreign_values.filter(lambda v: not isinstance(v, dict)),
    reader=st.sampled_from(READERS_OF["kt"]),
)
def test_a_cache_entry_that_is_not_an_object_is_refused(key, entry, reader):
    document = good_document("kt")
    document["cache"][key] = entry
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), "kt.json", encode(document))
        with pytest.raises(DatasetError) as caught:
            READERS[reader](path)
        assert_clear(caught.value, path)


@pytest.mark.parametrize("reader", READERS_OF["kt"])
def test_an_entry_under_another_configurations_key_is_refused(tmp_path, reader):
    """Kernel Tuner finds an entry by its key: two entries with their keys swapped (each
    a configuration of the space, none twice) were read by their values, so the file meant
    one thing to Kernel Tuner's simulation mode and another here."""
    document = good_document("kt")
    cache = document["cache"]
    cache["32,0"], cache["64,0"] = cache["64,0"], cache["32,0"]
    path = write(tmp_path, "kt.json", encode(document))
    with pytest.raises(DatasetError, match="configuration '64,0', not of its key") as caught:
        READERS[reader](path)
    assert_clear(caught.value, path)
    assert "cache['32,0']" in str(caught.value)


# --- regressions: each of these leaked another exception or was accepted before ----------


def _with(kind: str, path: tuple, value: Any) -> Any:
    """A good document with the value at path set (a new key where there was none)."""
    document = good_document(kind)
    at(document, path[:-1])[path[-1]] = value
    return document


def _nested_dict(depth: int) -> Any:
    return {"a": _nested_dict(depth - 1)} if depth else 1


REGRESSIONS = [
    # RecursionError from json's decoder. (Nesting just below the interpreter's limit got
    # through the decoder and raised RecursionError later, in Record's list freezing.)
    ("foreign", ("results", 0, "times", "runtimes"), Raw(b"[" * DEEP + b"]" * DEEP),
     "nested deeper than"),
    ("kt", ("cache", "32,0", "GFLOP/s"), _nested_dict(200), "nested deeper than"),
    # ValueError: an integer literal of more than 4300 digits.
    ("kt", ("problem_size",), [Raw(b"1" * 5000)], "too many digits"),
    # 1e400 parses as inf: read, then ValueError when written (`dataset convert`).
    ("foreign", ("metadata", "origin"), Raw(b"1e400"), "beyond the float range"),
    ("kt", ("cache", "32,0", "GFLOP/s"), [Raw(b"-1e400")], "beyond the float range"),
    # OverflowError: an int beyond the float range as a time, in ms and in seconds.
    ("kt", ("cache", "32,0", "time"), 10**400, "time must be a finite number"),
    ("foreign", ("results", 0, "measurements", 0), {"name": "time", "value": 10**400, "unit": "s"},
     "out of range"),
    # TypeError (unhashable) from `in` a set or dict.
    ("foreign", ("results", 0, "invalidity"), ["correct"], "unknown invalidity"),
    ("foreign", ("metadata", "timeunit"), ["ms"], "unsupported timeunit"),
    ("foreign", ("results", 0, "measurements", 0, "unit"), ["ms"], "time must be a number"),
    ("pipetune", ("metadata", "pipetune", "workload", "op"), ["gemm"], "pipetune metadata: op"),
    # Kernel Tuner caches accepted although inconsistent (`bench tuner` then failed on them).
    ("kt", ("cache", "32,0", "bx"), 48, "knob 'bx' = 48 is not one of"),
    ("kt", ("tune_params", "flag"), 1, "'tune_params' must give a list"),
    ("kt", ("tune_params_keys",), ["bx", "flag", "flag"], "names a knob twice"),
    # Messages: a value quoted in full (2000 characters), a key's newline in the message.
    ("foreign", ("results", 0, "invalidity"), "x" * 2000, "unknown invalidity 'xxx"),
    ("foreign", ("results", 0, "times", "\n"), "x", "'times' entry '\\n' must be a number"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "path", "value", "reason"),
    REGRESSIONS,
    ids=[f"{kind}:{'.'.join(map(repr, path))}" for kind, path, _, _ in REGRESSIONS],
)
def test_regressions(tmp_path, kind, path, value, reason):
    bad = write(tmp_path, f"{kind}.json", encode(_with(kind, path, value)))
    for reader in READERS_OF[kind]:
        with pytest.raises(DatasetError) as caught:
            READERS[reader](bad)
        assert_clear(caught.value, bad)
        assert reason in str(caught.value)
    # The command that writes refuses it too, and writes nothing.
    target = tmp_path / "out" / "converted.t4.json.gz"
    result = cli.invoke(dataset_app, ["convert", str(bad), str(target)])
    assert result.exit_code == 2, result.output
    _one_line_error(result.stderr, bad)
    assert not target.parent.exists()


# --- commands that write: all or nothing --------------------------------------------------

any_corruption = st.one_of(
    corrupt_bytes().map(lambda c: (c[0], c[1], c[3])),
    corrupt_documents().map(lambda c: (c[0], c[1], c[3])),
)


def _one_line_error(stderr: str, path: Path) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), stderr


@settings(max_examples=80, deadline=None)
@given(case=any_corruption)
def test_convert_writes_the_whole_file_or_nothing(case):
    kind, reader, data = case
    with tempfile.TemporaryDirectory() as tmp:
        source = write(Path(tmp), f"{kind}.json", data)
        out = Path(tmp) / "out"
        target = out / "converted.t4.json.gz"
        allow_open = ["--allow-open"] if "allow_open" in reader else []
        result = cli.invoke(dataset_app, ["convert", str(source), str(target), *allow_open])
        if result.exit_code == 0:
            assert [p.name for p in out.iterdir()] == [target.name]
            read = load_dataset(source, allow_open=bool(allow_open))
            assert read_t4(target).records == read.records
        else:
            assert result.exit_code == 2, result.output
            _one_line_error(result.stderr, source)
            assert not out.exists() or list(out.iterdir()) == []


@pytest.fixture(scope="module")
def optimum_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'optimum.db'}"
    assert cli.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    return url


def _optimum_rows(url: str) -> list[tuple]:
    database = Database(url)
    try:
        with database.read() as session:
            rows = session.scalars(select(ReferenceOptimumRow)).all()
            return [(r.workload_id, r.gpu, r.best_latency_us, r.source) for r in rows]
    finally:
        database.dispose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    corrupt=st.one_of(
        st.sampled_from(["pipetune"]).flatmap(
            lambda k: byte_mutations(gzip.compress(encode(good_document(k)), mtime=0))
        ),
        structure_mutation("pipetune").map(encode),
    )
)
def test_import_optimum_adds_no_row_for_a_refused_file(optimum_db, corrupt):
    before = _optimum_rows(optimum_db)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), "sweep.t4.json.gz", corrupt)
        result = cli.invoke(app, ["db", "import-optimum", str(path), "--db", optimum_db])
        after = _optimum_rows(optimum_db)
        if result.exit_code == 0:
            assert any(row[3] == str(path) for row in after)
        else:
            assert result.exit_code == 2, result.output
            _one_line_error(result.stderr, path)
            assert after == before


# --- the benchmark hub's real files -------------------------------------------------------


@needs_hub
@pytest.mark.parametrize("hub", [HUB_T4, HUB_CACHE], ids=["t4", "kt-cache"])
def test_the_real_files_truncated_or_flipped(tmp_path, hub):
    data = hub.read_bytes()
    plain = gzip.decompress(data)
    for name, bad in [
        ("gz-cut", data[: len(data) // 3]),
        ("gz-flip", data[:1000] + bytes([data[1000] ^ 0x55]) + data[1001:]),
        ("json-cut", plain[: len(plain) // 2]),
        ("json-flip", plain[:5000] + b"\xff" + plain[5001:]),
    ]:
        path = write(tmp_path, f"{name}.json", bad)
        with pytest.raises(DatasetError) as caught:
            load_dataset(path)
        assert_clear(caught.value, path)
