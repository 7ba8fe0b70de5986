"""`pipetune dataset info|convert` on the benchmark hub's real files and on bad files."""

from __future__ import annotations

import json

import pytest
from shared_datasets import HUB_CACHE, HUB_T4, needs_hub
from typer.testing import CliRunner

from pipetune.clients.cli.dataset_cmds import dataset_app
from pipetune.workers.datasets import load_dataset

cli = CliRunner()
BEST = {
    "block_size_x": 32,
    "block_size_y": 4,
    "tile_size_x": 1,
    "tile_size_y": 3,
    "read_only": 1,
    "use_padding": 0,
    "use_shmem": 1,
    "use_cmem": 1,
    "filter_height": 15,
    "filter_width": 15,
}


@needs_hub
@pytest.mark.parametrize(("path", "fmt"), [(HUB_T4, "t4"), (HUB_CACHE, "kt-cache")])
def test_info_json_on_the_hub_files(path, fmt):
    result = cli.invoke(dataset_app, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == fmt
    assert (doc["configurations"], doc["valid"], doc["failed"]) == (4362, 4201, 161)
    assert doc["best"] == BEST
    assert doc["best_time_ms"] == pytest.approx(0.5536, abs=1e-4)


@needs_hub
def test_info_table_names_the_device():
    result = cli.invoke(dataset_app, ["info", str(HUB_CACHE)])
    assert result.exit_code == 0, result.output
    assert "NVIDIA A100-PCIE-40GB" in result.stdout and "4362" in result.stdout


@needs_hub
def test_convert_a_cache_to_t4(tmp_path):
    target = tmp_path / "conv.t4.json.gz"
    result = cli.invoke(dataset_app, ["convert", str(HUB_CACHE), str(target)])
    assert result.exit_code == 0, result.output
    converted = load_dataset(target)
    assert converted.format == "t4" and len(converted) == 4362
    assert converted.best().configuration == BEST


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x1f\x8b\x08\x00garbage", "gzip"),
        (b'{"schema_version": "1.0.0", "results": [{"configuration": {}}', "not valid JSON"),
        (b'{"hello": "world"}', "neither a T4 results file nor a Kernel Tuner cache"),
    ],
)
def test_a_corrupt_file_is_one_line_and_exit_2(tmp_path, content, reason):
    path = tmp_path / "bad.t4.json.gz"
    path.write_bytes(content)
    result = cli.invoke(dataset_app, ["info", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and reason in lines[0]
    assert result.stdout == ""


def test_a_missing_file_is_exit_2(tmp_path):
    result = cli.invoke(dataset_app, ["info", str(tmp_path / "nope.t4.json.gz")])
    assert result.exit_code == 2 and "no such file" in result.stderr


RECORDED = "benchmarks/data/h100/BMM_BERT_QK.t4.json.gz"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"format": 99}, "format: 99 is not one this pipetune reads"),
        ({"format": "1"}, "format: '1' is not one"),
        ({"family": "memops"}, "family: 'memops' contradicts its workload, a tensor_gemm"),
        ({"arch": "sm_80"}, "arch: 'sm_80' contradicts its GPU, h100 (sm_90)"),
    ],
)
def test_metadata_that_contradicts_its_workload_or_is_newer_is_refused(tmp_path, change, reason):
    """A file from a newer pipetune, or one whose family or arch contradicts its own workload
    or GPU, was read (and imported) as if nothing were wrong."""
    import gzip
    from pathlib import Path

    doc = json.loads(gzip.decompress((Path(__file__).parent.parent / RECORDED).read_bytes()))
    doc["metadata"]["pipetune"].update(change)
    path = tmp_path / "edited.t4.json"
    path.write_text(json.dumps(doc))
    result = cli.invoke(dataset_app, ["info", str(path)])
    assert result.exit_code == 2, result.output
    assert reason in result.stderr and "Traceback" not in result.output


@needs_hub
def test_convert_onto_its_own_source_is_refused_and_keeps_it(tmp_path):
    """It wrote the T4 over the Kernel Tuner cache it read: the cache was gone."""
    source = tmp_path / "conv.kt-cache.json.gz"
    source.write_bytes(HUB_CACHE.read_bytes())
    (tmp_path / "link.json.gz").symlink_to(source)
    for target in (source, tmp_path / "link.json.gz", tmp_path / "." / source.name):
        result = cli.invoke(dataset_app, ["convert", str(source), str(target)])
        assert result.exit_code == 2, result.output
        assert "is the SOURCE file; give another path to write" in result.stderr
    assert source.read_bytes() == HUB_CACHE.read_bytes()
