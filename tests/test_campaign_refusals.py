"""What `pipetune campaign` and `campaign unpack` refuse, with exit 2 and one line, before they
write anything: an archive's sweep filed under another GPU or operator, a profile the model
would refuse, a broken JSON document, a probe's unknown GPU; a --have of another GPU model
(before anything is measured where --gpu names the GPU, before its files are copied where
the device does), a --have folder with no campaign file in it; --minutes that are not a
positive finite number. And what they accept: an archive repacked with `tar -C dir .`; and
that an unpack that cannot write every file writes none."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.campaign_cmds import campaign_app
from pipetune.model.hardware import PROFILE_DIR
from pipetune.workers.campaign import layout
from pipetune.workers.campaign import run as campaign_run

cli = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
PROBE = {"gpu": "h100", "runner": "cupy", "simulated": False, "verdict": "pass"}
SIM = ["--runner", "simulated", "--operators", "MM_RN50_FC"]


pytestmark = pytest.mark.usefixtures("campaign_caches")


def _archive(path: Path, members: dict[str, Any]) -> Path:
    """A .tar.gz of the members: a file's bytes, bytes, or a JSON document."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            if isinstance(content, Path):
                data = content.read_bytes()
            elif isinstance(content, bytes):
                data = content
            else:
                data = json.dumps(content).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if name.endswith("/"):  # a folder's own entry, as tar -C dir . writes "./"
                info.type, info.size = tarfile.DIRTYPE, 0
            tar.addfile(info, io.BytesIO(data))
    return path


def _simulated_copy(source: Path, target: Path) -> Path:
    """The dataset at source, labelled as the simulated runner's."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    document["metadata"]["pipetune"]["runner"] = "simulated"
    target.write_bytes(gzip.compress(json.dumps(document).encode()))
    return target


def _unpack(archive: Path, tmp_path: Path, *extra: str):
    where = ["--data-dir", str(tmp_path / "data"), "--profile-dir", str(tmp_path / "profiles")]
    return cli.invoke(campaign_app, ["unpack", str(archive), *where, *extra])


def _refused(result, tmp_path: Path) -> str:
    """The one line of a refusal that wrote nothing; no temporary folder in it."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "pipetune-unpack-" not in lines[0] and "pipetune-campaign-" not in lines[0]
    assert not (tmp_path / "data").exists() and not (tmp_path / "profiles").exists()
    return lines[0]


@pytest.mark.parametrize(
    ("sweep", "reason"),
    [
        ("h200", "a dataset of h200, but the archive's probe.json was measured on h100"),
        ("softmax", "a dataset of softmax 1536x128, but MM_RN50_FC is gemm 1024x64x2048"),
        ("simulated", "runner simulated, in a measured campaign"),
    ],
)
def test_unpack_refuses_a_sweep_of_another_gpu_operator_or_runner(tmp_path, sweep, reason):
    # It filed an H200 sweep (or a softmax's) as the H100's MM_RN50_FC, with exit 0.
    source = {
        "h200": DATA / "h200" / "MM_RN50_FC.t4.json.gz",
        "softmax": DATA / "h100" / "Softmax_BERT_b1_s128.t4.json.gz",
        "simulated": _simulated_copy(
            DATA / "h100" / "MM_RN50_FC.t4.json.gz", tmp_path / "sim.t4.json.gz"
        ),
    }[sweep]
    archive = _archive(
        tmp_path / "c.tar.gz",
        {
            "probe.json": PROBE,
            "profile.json": PROFILE_DIR / "h100.json",
            # A good sweep checked first: nothing is written before every file is checked.
            "sweeps/BMM_BERT_QK.t4.json.gz": DATA / "h100" / "BMM_BERT_QK.t4.json.gz",
            "sweeps/MM_RN50_FC.t4.json.gz": source,
        },
    )
    line = _refused(_unpack(archive, tmp_path), tmp_path)
    assert f"error: sweeps/MM_RN50_FC.t4.json.gz: {reason}" in line


def test_unpack_refuses_a_sweep_named_after_no_operator(tmp_path):
    members = {
        "probe.json": PROBE,
        "sweeps/MM_Nope.t4.json.gz": DATA / "h100" / "MM_RN50_FC.t4.json.gz",
    }
    line = _refused(_unpack(_archive(tmp_path / "c.tar.gz", members), tmp_path), tmp_path)
    assert "sweeps/MM_Nope.t4.json.gz: MM_Nope is not an operator pipetune knows" in line


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"sm_count": -1}, "profile field 'sm_count' must be positive, got -1"),
        ({"sm_count": 0.5}, "profile field 'sm_count' must be a whole number"),
        ({"warp_size": 32}, "profile has unknown field 'warp_size'"),
    ],
)
def test_unpack_refuses_a_profile_the_model_would_refuse(tmp_path, overrides, reason):
    # It wrote it, and then every command that names the GPU failed on loading it.
    profile = {"gpu": "h100", "overrides": overrides}
    archive = _archive(tmp_path / "c.tar.gz", {"probe.json": PROBE, "profile.json": profile})
    line = _refused(_unpack(archive, tmp_path), tmp_path)
    assert f"error: profile.json: {reason}" in line


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("probe.json", b"{garbage", "not valid JSON"),
        ("baselines.json", b"\xff\xfe\x00", "not valid JSON"),
        ("correctness.json", b"[1, 2", "not valid JSON"),
        ("campaign.json", b"[]", "not a JSON object"),
        # Nested past the decoder's recursion: a RecursionError (exit 1) before.
        ("probe.json", b"[" * 100_000 + b"]" * 100_000, "not valid JSON (nested too deeply)"),
    ],
)
def test_unpack_refuses_a_broken_document_by_its_name_in_the_archive(
    tmp_path, name, content, reason
):
    # A broken probe or baselines file was an uncaught error naming the temporary folder;
    # a broken correctness or campaign file was copied as it was.
    members = {"probe.json": PROBE, name: content}
    archive = _archive(tmp_path / "c.tar.gz", members)
    line = _refused(_unpack(archive, tmp_path), tmp_path)
    assert f"error: {archive}: {name}: {reason}" in line


@pytest.mark.parametrize(
    ("baselines", "reason"),
    [
        ({"operators": [1]}, "baselines.json: 'operators' is not a JSON object"),
        ({"operators": {"MM_RN50_FC": 3}}, "baselines.json: MM_RN50_FC: not a JSON object"),
        (
            {"operators": {"MM_RN50_FC": {"latency_us": "fast"}}},
            "baselines.json: MM_RN50_FC: latency_us 'fast' is not a time",
        ),
    ],
)
def test_unpack_refuses_a_baselines_entry_of_the_wrong_shape(tmp_path, baselines, reason):
    # Valid JSON of another shape was an AttributeError or a ValueError: exit 1.
    archive = _archive(tmp_path / "c.tar.gz", {"probe.json": PROBE, "baselines.json": baselines})
    assert f"error: {reason}" in _refused(_unpack(archive, tmp_path), tmp_path)


def test_unpack_names_the_probe_for_an_unknown_gpu(tmp_path):
    # It said "--gpu: unknown GPU", an option unpack does not have.
    archive = _archive(tmp_path / "c.tar.gz", {"probe.json": {**PROBE, "gpu": "v100"}})
    line = _refused(_unpack(archive, tmp_path), tmp_path)
    assert f"error: {archive}: probe.json: unknown GPU 'v100'" in line and "--gpu" not in line


def test_an_archive_repacked_from_its_folder_is_taken(tmp_path):
    # `tar czf x.tar.gz -C dir .` names the members ./probe.json and so on: it was refused
    # as holding no campaign file.
    dataset = DATA / "h100" / "MM_RN50_FC.t4.json.gz"
    members = {"./": b"", "./probe.json": PROBE, "./sweeps/MM_RN50_FC.t4.json.gz": dataset}
    archive = _archive(tmp_path / "c.tar.gz", members)
    assert layout.members(layout.extract(archive, tmp_path / "x")) == [
        "probe.json",
        "sweeps/MM_RN50_FC.t4.json.gz",
    ]
    result = _unpack(archive, tmp_path)
    assert result.exit_code == 0, result.output
    written = tmp_path / "data" / "h100" / "MM_RN50_FC.t4.json.gz"
    assert written.read_bytes() == dataset.read_bytes()


class _NoDevice:
    """A LibraryChild that fails the test: nothing may be measured."""

    def __init__(self, *args: Any):
        raise AssertionError("the device was started")


def _other_gpus_campaign(tmp_path: Path) -> Path:
    probe = {
        "gpu": "h200",
        "runner": "simulated",
        "simulated": True,
        "verdict": "pass",
        "device": {"name": "simulated NVIDIA H200-SXM-141GB"},
    }
    return _archive(tmp_path / "h200.tar.gz", {"probe.json": probe, "correctness.json": {}})


def test_a_have_of_another_gpu_named_by_gpu_is_refused_before_anything(tmp_path, monkeypatch):
    # It probed, copied the H200's files into the out-dir beside a campaign.json that said
    # h100, and the rerun was refused as "not empty".
    monkeypatch.setattr(campaign_run, "LibraryChild", _NoDevice)
    out, pack = tmp_path / "out", tmp_path / "c.tar.gz"
    have = ["--have", str(_other_gpus_campaign(tmp_path)), "--gpu", "h100"]
    result = cli.invoke(campaign_app, ["--out-dir", str(out), "--pack", str(pack), *have, *SIM])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert "--have was measured on h200" in line and "--gpu names h100" in line
    assert "a campaign stays on one GPU model" in line
    assert not out.exists() and not pack.exists()


def test_a_have_of_another_gpu_than_the_device_leaves_the_out_dir_as_it_was(tmp_path):
    out, pack = tmp_path / "out", tmp_path / "c.tar.gz"
    out.mkdir()  # an empty folder given: it stays empty, so the right command can use it
    have = ["--have", str(_other_gpus_campaign(tmp_path))]  # the simulated device: h100
    result = cli.invoke(campaign_app, ["--out-dir", str(out), "--pack", str(pack), *have, *SIM])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert "--have was measured on h200" in line and "this device is h100" in line
    assert list(out.iterdir()) == [] and not pack.exists()
    fresh = tmp_path / "fresh"
    result = cli.invoke(campaign_app, ["--out-dir", str(fresh), *have, *SIM])
    assert result.exit_code == 2 and not fresh.exists()


def test_a_have_folder_without_a_campaign_file_is_refused(tmp_path, monkeypatch):
    # It was taken as "0 files" and the campaign started again from scratch.
    monkeypatch.setattr(campaign_run, "LibraryChild", _NoDevice)
    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    (unrelated / "readme.txt").write_text("not a campaign\n")
    out = tmp_path / "out"
    result = cli.invoke(campaign_app, ["--out-dir", str(out), "--have", str(unrelated), *SIM])
    assert result.exit_code == 2, result.output
    assert "no campaign file in the folder" in result.stderr.strip().splitlines()[-1]
    assert not out.exists()


def test_an_unpack_that_cannot_write_everything_writes_nothing_and_can_be_run_again(
    tmp_path, monkeypatch
):
    """A full disk midway: it left the first files (the profile among them, which the model
    then applied) and the retry was refused as an overwrite of them."""
    from pipetune.workers.datasets import files

    campaign = DATA / "h100" / "campaign"
    members = {
        "probe.json": campaign / "probe.json",
        "correctness.json": campaign / "correctness.json",
        "baselines.json": campaign / "baselines.json",
        "campaign.json": campaign / "campaign.json",
        "profile.json": PROFILE_DIR / "h100.json",
        "sweeps/MM_RN50_FC.t4.json.gz": DATA / "h100" / "MM_RN50_FC.t4.json.gz",
    }
    archive = _archive(tmp_path / "c.tar.gz", members)
    fsync, calls = files.os.fsync, []

    def full_disk_at_the_fourth(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(files.os, "fsync", full_disk_at_the_fourth)
    failed = _unpack(archive, tmp_path)
    assert failed.exit_code != 0 and "No space left" in failed.output
    assert [p for p in tmp_path.rglob("*") if p.is_file() and "c.tar.gz" not in p.name] == []
    monkeypatch.setattr(files.os, "fsync", fsync)
    again = _unpack(archive, tmp_path)
    assert again.exit_code == 0, again.output
    profile = (tmp_path / "profiles" / "h100.json").read_bytes()
    assert profile == (PROFILE_DIR / "h100.json").read_bytes()
    assert (tmp_path / "data" / "h100" / "campaign" / "campaign.json").exists()
