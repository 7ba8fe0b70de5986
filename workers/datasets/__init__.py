"""Recorded search spaces: T4 results files and Kernel Tuner caches (read), T4 (write).

>>> ds = load_dataset("convolution_A100.t4.json.gz")      # or a .kt-cache.json.gz
>>> ds.configurations()[0], ds.times_ms()[0], ds.valid_mask()[0]
>>> write_t4(ds, "copy.t4.json.gz")

A pipetune sweep's dataset (:func:`dataset_from_results`) maps schedules to measurements
and carries the workload, GPU and runner; :func:`check_pipetune` validates one that was read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pipetune.workers.datasets.files import parse_json, read_text
from pipetune.workers.datasets.kt_cache import (
    close_open_cache,
    dataset_of_own_document,
    parse_maybe_open,
    read_kt_cache,
)
from pipetune.workers.datasets.pipetune import (
    PipetuneInfo,
    check_pipetune,
    dataset_from_results,
    now_timestamp,
    record_from_result,
    record_revision,
    record_runner,
    result_from_record,
    schedules_outside_space,
)
from pipetune.workers.datasets.records import (
    INVALIDITY_OF_STATUS,
    STATUS_OF_INVALIDITY,
    Dataset,
    DatasetError,
    Invalidity,
    Record,
)
from pipetune.workers.datasets.t4 import from_t4_document, read_t4, to_t4_document, write_t4

__all__ = [
    "INVALIDITY_OF_STATUS",
    "STATUS_OF_INVALIDITY",
    "Dataset",
    "DatasetError",
    "Invalidity",
    "PipetuneInfo",
    "Record",
    "check_pipetune",
    "dataset_from_results",
    "load_dataset",
    "now_timestamp",
    "read_kt_cache",
    "read_t4",
    "record_from_result",
    "record_revision",
    "record_runner",
    "result_from_record",
    "summary",
    "to_t4_document",
    "write_t4",
]


def load_dataset(path: str | Path, *, allow_open: bool = False) -> Dataset:
    """Read a T4 file or a Kernel Tuner cache, whichever the content is (a T4 file with
    pipetune metadata is checked as a pipetune dataset as well, see read_t4)."""
    source = str(path)
    document = _document(read_text(path), source, allow_open)
    if isinstance(document, dict) and "results" in document and "schema_version" in document:
        return from_t4_document(document, source)
    if isinstance(document, dict) and "cache" in document and "tune_params_keys" in document:
        # (The document is no one else's: its entries are let go of as they are read.)
        return dataset_of_own_document(document, source)
    raise DatasetError(f"{source}: neither a T4 results file nor a Kernel Tuner cache")


def _document(text: str, source: str, allow_open: bool) -> Any:
    """The parsed file (its text is let go of when this returns: a large cache's text was
    held while its records were made)."""
    try:
        return parse_maybe_open(text, source) if allow_open else parse_json(text, source)
    except DatasetError as exc:
        if allow_open or not _open_cache(text):
            raise
        raise DatasetError(
            f"{exc} -- a Kernel Tuner cache left open by an interrupted session? "
            "allow_open reads it; on the command line only `pipetune dataset info` and "
            "`dataset convert` take --allow-open: `pipetune dataset convert --allow-open FILE "
            "OUT.t4.json` writes a file every command reads"
        ) from None


def _open_cache(text: str) -> bool:
    """Whether unparsable text reads as a Kernel Tuner cache once closed as Kernel Tuner
    closes one (the hint is given only where --allow-open would have read the file)."""
    try:
        document = parse_json(close_open_cache(text), "")
    except DatasetError:
        return False
    return isinstance(document, dict) and "cache" in document


def summary(dataset: Dataset) -> dict[str, Any]:
    """What `pipetune dataset info` prints: counts, best configuration, provenance."""
    best = dataset.best()
    valid = int(dataset.valid_mask().sum())
    doc: dict[str, Any] = {
        "path": dataset.source,
        "format": dataset.format,
        "objective": dataset.objective,
        "knobs": list(dataset.knobs),
        "configurations": len(dataset),
        "valid": valid,
        "failed": len(dataset) - valid,
        "failures": dataset.failures(),
        "best": None if best is None else dict(best.configuration),
        "best_time_ms": None if best is None else best.time_ms,
    }
    meta = dataset.metadata.get("pipetune")
    if isinstance(meta, dict):
        info = PipetuneInfo(dataset)
        doc.update(
            workload=info.workload.canonical(),
            workload_label=info.workload.label(),
            gpu=info.gpu,
            gpu_name=info.gpu_name,
            device_name=info.device_name,
            runner=info.runner,
            # Which generator made the kernels, and how many records each revision of it
            # measured (a file mixing revisions describes two kernels of one schedule).
            generator=info.generator.line,
            generator_revisions=dict(
                sorted(Counter(record_revision(r) for r in dataset.records).items())
            ),
            # Records of a schedule the GPU's valid space does not hold (a sweep of another
            # board, or a file labelled with another GPU): however they were timed, that GPU
            # cannot run them, and `pipetune db import-dataset` refuses the file.
            outside_space=len(
                schedules_outside_space(
                    info,
                    [info.family.parse_schedule(dict(r.configuration)) for r in dataset.records],
                )
            ),
        )
    kt = dataset.metadata.get("kernel_tuner")
    if isinstance(kt, dict):
        doc.update(
            device_name=kt.get("device_name"),
            kernel_name=kt.get("kernel_name"),
            problem_size=kt.get("problem_size"),
        )
    return doc
