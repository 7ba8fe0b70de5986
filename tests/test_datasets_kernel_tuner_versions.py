"""Files that Kernel Tuner's own versions write, read as it reads them: a cache of a version
before problem_size existed, whose failures are "time": 1e20; a cache of a numpy float32
knob (its key "0.1", its value the float64 0.10000000149011612); a T4 file of a search that
visited configurations again (each visit listed, answered from its cache). And a benchmark
given one space in both formats from one folder names the two apart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipetune.clients.cli.bench_cmds import dataset_names
from pipetune.clients.cli.errors import CliError
from pipetune.workers.datasets import DatasetError, load_dataset

FAILED_TIME_MS = 1e20  # Kernel Tuner before 1.0: a configuration that failed


def _cache(entries: dict, tune_params: dict, **header) -> dict:
    return {
        "device_name": "NVIDIA GeForce RTX 3090",
        "kernel_name": "pnpoly_kernel",
        "tune_params_keys": list(tune_params),
        "tune_params": tune_params,
        "cache": entries,
        **header,
    }


def _write(tmp_path: Path, name: str, document: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_an_old_cache_without_problem_size_reads_its_1e20_times_as_failures(tmp_path):
    """Kernel Tuner before 0.4 wrote no problem_size and stored a configuration that failed
    to compile or run as "time": 1e20; both files were refused ("not a Kernel Tuner cache
    (missing problem_size)", then "time must be between ... got 1e+20")."""
    entries = {
        "32,1": {"block_size_x": 32, "tile_size": 1, "time": 2.5},
        "64,1": {"block_size_x": 64, "tile_size": 1, "time": FAILED_TIME_MS},
        "32,2": {"block_size_x": 32, "tile_size": 2, "time": 1.5},
        "64,2": {"block_size_x": 64, "tile_size": 2, "time": 3.0},
    }
    old = _cache(entries, {"block_size_x": [32, 64], "tile_size": [1, 2]})
    dataset = load_dataset(_write(tmp_path, "old.json", old))
    failed = dataset.lookup({"block_size_x": 64, "tile_size": 1})
    assert failed is not None and (failed.invalidity, failed.time_ms) == ("runtime", None)
    assert len(dataset) == 4 and dataset.best().configuration == {
        "block_size_x": 32,
        "tile_size": 2,
    }
    # A time only close to the sentinel is a time, and out of range as before.
    entries["64,1"]["time"] = 1e19
    with pytest.raises(DatasetError, match="time must be between"):
        load_dataset(_write(tmp_path, "near.json", old))


def test_a_float32_knobs_entries_are_read_under_the_keys_kernel_tuner_files_them(tmp_path):
    alphas = np.array([0.1, 0.5, 2.25], dtype=np.float32)
    values = [float(a) for a in alphas]  # json writes the float64 each widens to
    # (Keyed by str() of the float32: its short text, as Kernel Tuner keys it.)
    entries = {
        f"{bx},{a!s}": {"block_size_x": bx, "alpha": v, "time": 1.0 + bx / 64 + v}
        for bx in (32, 64)
        for a, v in zip(alphas, values, strict=True)
    }
    assert "32,0.1" in entries and values[0] == 0.10000000149011612
    path = _write(
        tmp_path, "f32.json", _cache(entries, {"block_size_x": [32, 64], "alpha": values})
    )
    dataset = load_dataset(path)
    assert len(dataset) == 6
    assert dataset.best().configuration == {"block_size_x": 32, "alpha": values[0]}
    # Another configuration's key is still refused: the values are not the key's.
    moved = dict(entries)
    moved["32,0.5"] = entries["32,0.1"]
    moved.pop("32,0.1")
    bad = _write(tmp_path, "moved.json", _cache(moved, {"block_size_x": [32, 64], "alpha": values}))
    with pytest.raises(DatasetError, match="not of its key"):
        load_dataset(bad)


def _t4_result(configuration: dict, time_ms: float, compile_ms: float) -> dict:
    return {
        "timestamp": "2026-01-01 00:00:00+00:00",
        "configuration": configuration,
        "times": {"compilation": compile_ms, "runtimes": [time_ms, time_ms]},
        "invalidity": "correct",
        "correctness": 1,
        "measurements": [{"name": "time", "value": time_ms, "unit": "ms"}],
        "objectives": ["time"],
    }


def test_a_t4_search_traces_revisits_are_read_once_and_differing_repeats_refused(tmp_path):
    """Kernel Tuner's T4 writer lists every result of a search, a configuration visited
    again too (from its cache: the same times, no compile): such a file was refused as
    "configuration ... appears twice"."""
    a, b = {"block_size_x": 32}, {"block_size_x": 64}
    results = [_t4_result(a, 2.0, 30.0), _t4_result(b, 1.0, 31.0), _t4_result(a, 2.0, 0.0)]
    document = {"schema_version": "1.0.0", "metadata": {"timeunit": "ms"}, "results": results}
    dataset = load_dataset(_write(tmp_path, "trace.t4.json", document))
    assert len(dataset) == 2 and dataset.lookup(a).time_ms == 2.0
    assert dataset.lookup(a).compile_ms == 30.0  # the first visit, which compiled it
    results.append(_t4_result(b, 1.5, 0.0))  # measured again, with another time
    with pytest.raises(
        DatasetError, match=r"two different results \(results\[1\] and results\[3\]\)"
    ):
        load_dataset(_write(tmp_path, "remeasured.t4.json", document))


def test_one_space_in_two_formats_in_one_folder_gets_two_names(tmp_path):
    """The development folder holds convolution_A100 as a T4 file and as a cache: the glob
    of the folder was refused as "given twice" (both named by folder and stem)."""
    folder = tmp_path / "datasets"
    folder.mkdir()
    t4 = folder / "convolution_A100.t4.json.gz"
    cache = folder / "convolution_A100.kt-cache.json.gz"
    other = folder / "gemm_RTX_3090.kt-cache.json.gz"
    assert dataset_names([t4, cache, other]) == [
        "convolution_A100.t4",
        "convolution_A100.kt-cache",
        "gemm_RTX_3090",
    ]
    elsewhere = tmp_path / "h200" / "convolution_A100.t4.json.gz"
    assert dataset_names([t4, elsewhere]) == ["datasets/convolution_A100", "h200/convolution_A100"]
    with pytest.raises(CliError, match="given twice"):
        dataset_names([t4, cache, folder / ".." / "datasets" / t4.name])
