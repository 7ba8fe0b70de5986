"""The in-process library's refusals name their argument (`pipetune.InvalidArgumentError`'s
`.argument`) and leave a file that is not pipetune's database as they found it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import pipetune
from pipetune.model.errors import InvalidArgumentTypeError
from pipetune.model.hardware import HardwareError
from pipetune.workers.datasets import DatasetError

FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    return f"sqlite:///{tmp_path / 'pipetune.db'}"


@pytest.mark.parametrize("gpu", ["v100", None, 5])
def test_a_gpu_that_is_none_is_an_invalid_argument_named_gpu(db, gpu):
    """A HardwareError alone: `except pipetune.InvalidArgumentError` let it through, and it
    had no `.argument`, where every other refused argument has."""
    for call in (
        lambda: pipetune.tune(FC, gpu, budget=1, runner="simulated", db=db),
        lambda: pipetune.best_schedule(FC, gpu),
        lambda: pipetune.kernel(FC, gpu),
    ):
        with pytest.raises(pipetune.InvalidArgumentError) as info:
            call()
        assert info.value.argument == "gpu" and str(info.value).startswith("gpu: ")
        assert isinstance(info.value, HardwareError)  # (as it was)


@pytest.mark.parametrize(
    ("dataset", "error", "words"),
    [
        # Bare TypeErrors from the file layer ("expected str, bytes or os.PathLike object").
        (5, InvalidArgumentTypeError, "expected a dataset file's path"),
        (["x.t4.json.gz"], InvalidArgumentTypeError, "got list"),
        (b"x.t4.json.gz", InvalidArgumentTypeError, "got bytes"),
        # Read as the current folder: ".: cannot read (Is a directory)".
        ("", pipetune.InvalidArgumentError, "empty: give the recorded dataset's file"),
        # The file layer's DatasetError, which named the file but not the argument.
        ("nowhere.t4.json.gz", pipetune.InvalidArgumentError, "nowhere.t4.json.gz"),
    ],
)
def test_a_replay_dataset_that_cannot_be_one_is_refused_naming_dataset(db, dataset, error, words):
    with pytest.raises(error) as info:
        pipetune.tune(FC, "h100", budget=1, runner="replay", dataset=dataset, db=db)
    assert info.value.argument == "dataset" and words in str(info.value), info.value
    assert isinstance(info.value, pipetune.PipetuneError)


def test_a_dataset_that_does_not_read_is_still_a_dataset_error(db, tmp_path):
    garbage = tmp_path / "garbage.t4.json.gz"
    garbage.write_bytes(b"not gzip")
    with pytest.raises(DatasetError) as info:
        pipetune.tune(FC, "h100", budget=1, runner="replay", dataset=garbage, db=db)
    assert isinstance(info.value, pipetune.InvalidArgumentError)
    assert info.value.argument == "dataset"


def test_a_lookup_leaves_another_programs_database_as_it_was(tmp_path):
    """Every connection put the file in WAL mode before the schema was checked: a lookup
    refused another program's database after switching it to WAL (its header changed), and
    made an empty file a 4 KiB database."""
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE x (a)")
    before = foreign.read_bytes()
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (foreign, empty):
        for lookup in (pipetune.best_schedule, pipetune.kernel):
            with pytest.raises(pipetune.PipetuneError):
                lookup(FC, "h100", db=f"sqlite:///{path}")
    assert foreign.read_bytes() == before and empty.stat().st_size == 0
    with sqlite3.connect(foreign) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
