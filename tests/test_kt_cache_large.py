"""Large Kernel Tuner caches: the limit on a dataset file's text (refused with exit 2 by every
command that reads one), and the reader, which makes the records it made before (same
datasets, same error messages) without formatting an error text for each value that
passes."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from shared_datasets import SHARED
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.workers.datasets import Dataset, DatasetError, files, load_dataset, records
from pipetune.workers.datasets.kt_cache import _entry_record

runner = CliRunner()
KNOBS = {"x": [1, 2, 4], "y": ["a", "b"]}


def _entry(x: Any, y: Any, **extra: Any) -> dict[str, Any]:
    return {
        "x": x,
        "y": y,
        "time": 1.5,
        "times": [1.4, 1.6],
        "compile_time": 10.0,
        "benchmark_time": 3.0,
        "timestamp": "2025-01-01 00:00:00+00:00",
        **extra,
    }


def _cache(entries: list[tuple[str, Any]], **header: Any) -> dict[str, Any]:
    return {
        "device_name": "d",
        "kernel_name": "k",
        "problem_size": [1],
        "tune_params_keys": list(KNOBS),
        "tune_params": KNOBS,
        "objective": "time",
        **header,
        "cache": dict(entries),
    }


def _write(path: Path, document: dict[str, Any]) -> Path:
    text = json.dumps(document).encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


# --- the limit ---------------------------------------------------------------------------


@pytest.fixture
def past_the_limit(tmp_path, monkeypatch) -> Path:
    """A valid cache whose text is past the limit (the limit lowered to 1 MiB for it)."""
    monkeypatch.setattr(files, "MAX_TEXT_BYTES", 2**20)
    entries = [
        (f"{x},{y}", _entry(x, y, padding=list(range(40_000))))
        for x in KNOBS["x"]
        for y in KNOBS["y"]
    ]
    path = _write(tmp_path / "big.kt-cache.json.gz", _cache(entries))
    assert len(gzip.decompress(path.read_bytes())) > 2**20
    return path


def _refusal_says_file_size_and_limit(output: str, path: Path) -> None:
    text = " ".join(output.split())
    assert f"{path}: more than 1 MiB of text: not a dataset file" in text
    on_disk = path.stat().st_size / 2**10
    assert f"{on_disk:,.1f} KiB on disk, gzip'd" in text
    assert "holds at most 1 MiB of text gunzipped" in text
    assert "Traceback" not in output


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "tuner", "--strategies", "random", "--budgets", "5", "--seeds", "1", "--dataset"],
        ["dataset", "info"],
        ["dataset", "convert", "--allow-open"],
    ],
    ids=["bench-tuner", "dataset-info", "dataset-convert"],
)
def test_a_cache_past_the_limit_is_refused_naming_file_size_and_limit(
    past_the_limit, tmp_path, command
):
    args = [*command, str(past_the_limit)]
    if command[1] == "convert":
        args.append(str(tmp_path / "out.t4.json"))
    result = runner.invoke(app, args, terminal_width=400)
    assert result.exit_code == 2, result.output
    _refusal_says_file_size_and_limit(result.output, past_the_limit)
    assert not (tmp_path / "out.t4.json").exists()


def test_import_dataset_refuses_it_before_opening_the_database(past_the_limit, tmp_path):
    database = tmp_path / "never.db"
    result = runner.invoke(
        app,
        ["db", "import-dataset", str(past_the_limit), "--db", f"sqlite:///{database}"],
        terminal_width=400,
    )
    assert result.exit_code == 2, result.output
    _refusal_says_file_size_and_limit(result.output, past_the_limit)
    assert not database.exists()


def test_a_gzip_stream_from_a_pipe_that_hands_over_one_byte_first_is_gunzipped(tmp_path):
    """A pipe (`<(curl ...)`) may give its first byte alone: a peek at the gzip magic then
    saw one byte and read the stream as text ("not UTF-8 text")."""
    fifo = tmp_path / "cache.kt-cache.json.gz"
    os.mkfifo(fifo)
    text = json.dumps(_cache([("1,a", _entry(1, "a"))]))
    packed = gzip.compress(text.encode())

    def write_one_byte_then_the_rest() -> None:
        with open(fifo, "wb", buffering=0) as pipe:  # (waits for the reader to open it)
            pipe.write(packed[:1])
            time.sleep(1.0)  # the reader meets the one byte first (on a loaded machine too)
            pipe.write(packed[1:])

    writer = threading.Thread(target=write_one_byte_then_the_rest)
    writer.start()
    try:
        assert files.read_text(fifo) == text
    finally:
        writer.join(timeout=60)


def test_a_plain_file_past_the_limit_names_its_size(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_TEXT_BYTES", 2**20)
    path = tmp_path / "big.kt-cache.json"
    path.write_bytes(b" " * (3 * 2**20))
    with pytest.raises(DatasetError) as refused:
        load_dataset(path)
    assert str(refused.value).startswith(f"{path}: more than 1 MiB of text: not a dataset file")
    assert "(3.0 MiB on disk; a dataset file holds at most 1 MiB of text," in str(refused.value)


def test_a_cache_at_the_limit_is_read(tmp_path, monkeypatch):
    path = _write(tmp_path / "fits.kt-cache.json.gz", _cache([("1,a", _entry(1, "a"))]))
    monkeypatch.setattr(files, "MAX_TEXT_BYTES", len(gzip.decompress(path.read_bytes())))
    monkeypatch.setattr(files, "CHUNK_BYTES", 7)  # (read in many pieces)
    assert len(load_dataset(path)) == 1


# --- the common path: the same datasets -------------------------------------------------

# Digests of the development set's files as the reader made them before its common path
# (every entry through _entry_record and Record's own checks), by `_digest` below.
DIGESTS = {
    "convolution_A100.kt-cache.json.gz": (4362, "07fb699c0560d46d"),
    "convolution_A100.t4.json.gz": (4362, "a99f1746615f93fc"),
    "convolution_RTX_3090.kt-cache.json.gz": (6768, "b041f01b97e9da16"),
    "convolution_RTX_Titan.kt-cache.json.gz": (6768, "2ff32bb84bb1ce43"),
    "gemm_RTX_3090.kt-cache.json.gz": (17956, "127aa5c22ff4b57d"),
    "gemm_RTX_Titan.kt-cache.json.gz": (17956, "f3fac41a7aaa026a"),
    "pnpoly_RTX_3090.kt-cache.json.gz": (4092, "9ff2d6e8edd89a13"),
    "pnpoly_RTX_Titan.kt-cache.json.gz": (4092, "2f421b155b572fa5"),
}


def _digest(ds: Dataset) -> str:
    """Every record's repr (its values' types show: 100 and 100.0 differ), the knobs' types,
    the arrays the benchmark reads, and the header."""
    h = hashlib.sha256()
    header = [list(ds.knobs), list(ds.objectives), ds.metadata, ds.format]
    h.update(json.dumps(header, sort_keys=True, default=repr).encode())
    h.update(ds.times_ms().tobytes())
    h.update(ds.valid_mask().tobytes())
    for r in ds.records:
        h.update(repr(r).encode())
        h.update(repr([type(v).__name__ for v in r.configuration.values()]).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_the_development_files_load_as_before(name):
    path = SHARED / name
    if not path.exists():
        pytest.skip("shared datasets are not next to this checkout")
    ds = load_dataset(path)
    assert (len(ds), _digest(ds)) == DIGESTS[name]


def test_odd_but_valid_entries_make_the_records_of_the_per_entry_reader(tmp_path):
    """Failures of every kind, a numpy float32 knob's key, int timings, list measurements,
    no timestamp, a second objective: each entry's record, in file order as the entries are
    let go of, and found by the lookup index built on first use (True and 1 apart)."""
    f32 = 0.10000000149011612  # (np.float32(0.1) widened: Kernel Tuner keys it "0.1")
    knobs = {"x": [1, 2, 4, f32], "y": ["a", "b", True]}
    entries = [
        ("1,a", _entry(1, "a", time=2, compile_time=7, framework_time=0, GFLOP_s=3.5)),
        ("2,a", _entry(2, "a", time="RuntimeFailedConfig", energy="RuntimeFailedConfig")),
        ("4,a", _entry(4, "a", __error__="CompilationFailedConfig")),
        ("1,b", {"x": 1, "y": "b", "time": 1e20}),
        ("0.1,a", _entry(f32, "a", power=[1, [2.5, 3]], registers=-4)),
        ("2,True", _entry(2, True, times=[], time=1e-6, timestamp=None)),
        ("4,b", {"x": 4, "y": "b", "time": "InvalidConfig", "times": "InvalidConfig"}),
    ]
    document = _cache(entries, tune_params=knobs, objective=["time", "energy"])
    ds = load_dataset(_write(tmp_path / "odd.kt-cache.json", document))
    expected = [
        _entry_record(key, entry, list(knobs), knobs, "time", "where") for key, entry in entries
    ]
    assert [repr(r) for r in ds.records] == [repr(r) for r in expected]
    assert ds.records == tuple(expected)
    assert ds.lookup({"x": f32, "y": "a"}) == expected[4]
    assert ds.lookup({"x": 2, "y": True}) == expected[5]
    assert ds.lookup({"x": 2, "y": 1}) is None  # (True and 1 are other configurations)


def test_loading_a_valid_cache_formats_no_error_text(tmp_path, monkeypatch):
    """A cache of 200,000 entries made a million reprlib texts (a timing's name for each
    timing, an entry's key for each entry) that no message used: 30 s of a 46 s load."""
    quoted: list[Any] = []
    monkeypatch.setattr(records._SHORT, "repr", lambda value: quoted.append(value) or "")
    entries = [(f"{x},{y}", _entry(x, y, strategy_time=0)) for x in KNOBS["x"] for y in "ab"]
    ds = load_dataset(_write(tmp_path / "good.kt-cache.json.gz", _cache(entries)))
    assert len(ds) == 6 and ds.records[0].times == {"benchmark": 3.0, "search_algorithm": 0}
    assert quoted == []


# --- the common path: the same error messages --------------------------------------------

# What the per-entry reader said of each (the entry after a good one), pinned.
REFUSALS = {
    "not_an_object": ("2,a", [1, 2], "an entry must be an object"),
    "missing_knob": ("2,a", {"x": 2, "time": 1.0}, "missing knob(s) ['y']"),
    "bad_error_marker": (
        "2,a",
        _entry(2, "a", __error__="Oops"),
        "__error__ 'Oops' is not a failure marker",
    ),
    "missing_objective": (
        "2,a",
        {k: v for k, v in _entry(2, "a").items() if k != "time"},
        "missing objective 'time'",
    ),
    "knob_outside": (
        "3,a",
        _entry(3, "a"),
        "knob 'x' = 3 is not one of its tune_params values [1, 2, 4]",
    ),
    "key_of_another": (
        "2,b",
        _entry(2, "a"),
        "the entry's knob values are those of configuration '2,a', not of its key",
    ),
    "time_text": ("2,a", _entry(2, "a", time="fast"), "time must be a number or a failure marker"),
    "bool_time": ("2,a", _entry(2, "a", time=True), "time must be a number or a failure marker"),
    "times_not_numbers": (
        "2,a",
        _entry(2, "a", times=[1.0, "x"]),
        "'times' must be a list of numbers",
    ),
    "compile_time_text": (
        "2,a",
        _entry(2, "a", compile_time="slow"),
        "'compile_time' must be a number",
    ),
    "timing_text": (
        "2,a",
        _entry(2, "a", benchmark_time="x" * 200),
        "'benchmark_time' must be a number",
    ),
    "unexpected_value": (
        "2,a",
        _entry(2, "a", power=None),
        "'power' has an unexpected value None",
    ),
    "time_below_range": (
        "2,a",
        _entry(2, "a", time=1e-9),
        "time must be between 1e-06 and 1e+07 ms (a nanosecond to about three hours), got 1e-09",
    ),
    "negative_timing": (
        "2,a",
        _entry(2, "a", framework_time=-1.0),
        "time 'framework' must not be negative, got -1.0",
    ),
    "negative_sample": (
        "2,a",
        _entry(2, "a", times=[1.0, -2.0]),
        "a runtime sample must not be negative, got -2.0",
    ),
    "negative_compile": (
        "2,a",
        _entry(2, "a", compile_time=-3),
        "compile time must not be negative, got -3",
    ),
    "huge_int_timing": (
        "2,a",
        _entry(2, "a", strategy_time=10**400),
        "time 'search_algorithm' must be a finite number, got "
        "100000000000000000...0000000000000000000",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_bad_entry_is_refused_with_the_message_it_always_had(tmp_path, case):
    key, bad, reason = REFUSALS[case]
    path = _write(tmp_path / "bad.kt-cache.json", _cache([("1,a", _entry(1, "a")), (key, bad)]))
    with pytest.raises(DatasetError) as refused:
        load_dataset(path)
    assert str(refused.value) == f"{path}: cache[{key!r}]: {reason}"


def test_the_first_bad_entry_is_the_one_named(tmp_path):
    entries = [
        ("1,a", _entry(1, "a")),
        ("2,a", _entry(2, "a", time=1e-9)),  # (refused by the record's own checks)
        ("4,a", [4, "a"]),  # (refused before a record is made)
    ]
    path = _write(tmp_path / "two.kt-cache.json", _cache(entries))
    with pytest.raises(DatasetError, match=r"cache\['2,a'\]: time must be between"):
        load_dataset(path)


def test_a_configuration_under_two_keys_is_refused_as_before(tmp_path):
    """Its float32 key ("0.1") and its float64 one: distinct keys, one configuration."""
    f32 = 0.10000000149011612
    entries = [
        ("2,a", _entry(2, "a")),
        ("0.1,a", _entry(f32, "a")),
        (f"{f32},a", _entry(f32, "a", time=2.5)),
    ]
    path = _write(
        tmp_path / "twice.kt-cache.json", _cache(entries, tune_params={**KNOBS, "x": [2, f32]})
    )
    with pytest.raises(DatasetError) as refused:
        load_dataset(path)
    assert str(refused.value) == (
        f"{path}: configuration {{'x': 0.10000000149011612, 'y': 'a'}} appears twice "
        "(records 1 and 2)"
    )
