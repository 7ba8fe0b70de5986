"""The recorded space kept outside the development set (benchmarks/heldout/): unedited, read
whole, and the development set's convolution kernel on another GPU."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
from shared_datasets import SHARED, needs_hub

from pipetune.clients.cli.bench_cmds import recorded_dataset
from pipetune.workers.datasets import load_dataset

HELDOUT = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout"
FILE = HELDOUT / "convolution_RTX_2080_Ti.kt-cache.json.gz"
# The JSON as the autotuning-methodology 1.1.0 sdist ships it (benchmarks/heldout/README.md).
SOURCE_SHA256 = "fc2e58f8a9e65e4cb1799621c091dbcd89e4c827ed12d112edc5881d4a149939"


def test_the_held_out_file_is_the_one_its_readme_names():
    assert hashlib.sha256(gzip.decompress(FILE.read_bytes())).hexdigest() == SOURCE_SHA256
    assert SOURCE_SHA256 in (HELDOUT / "README.md").read_text(encoding="utf-8")
    licence = (HELDOUT / "LICENSE.autotuning_methodology").read_text(encoding="utf-8")
    assert licence.startswith("MIT License")


def test_the_held_out_space_reads_whole_with_its_failures():
    assert load_dataset(FILE).metadata["device_name"] == "NVIDIA GeForce RTX 2080 Ti"
    configs = recorded_dataset(FILE).configs
    failed = ~np.isfinite(configs.objective_ms)
    # (README: 6,768 configurations, 1,426 + 86 failed; each failure is a trial that failed)
    assert (len(configs.configs), int(failed.sum())) == (6768, 1512)


@needs_hub
def test_the_held_out_space_is_the_development_sets_convolution_kernel():
    held = recorded_dataset(FILE).configs
    titan = recorded_dataset(SHARED / "convolution_RTX_Titan.kt-cache.json.gz").configs
    assert held.tune_params == titan.tune_params
    assert sorted(map(str, held.configs)) == sorted(map(str, titan.configs))
    # Measured apart: no two timings alike, which a copy of the TITAN RTX file would have.
    assert not np.array_equal(np.sort(held.objective_ms), np.sort(titan.objective_ms))
