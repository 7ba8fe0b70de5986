"""A campaign paused inside an operator, unpacked into the repository's data and continued
from there (`--have benchmarks/data/<gpu>`), on the simulated runner: the parts it measured
are committed with it and not measured again, and the unpack of the finished campaign leaves
the operator's dataset and none of its parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.campaign_cmds import campaign_app
from pipetune.workers.campaign import layout, sweeps
from pipetune.workers.datasets import read_t4

pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) is not installed")
pytestmark = pytest.mark.usefixtures("campaign_caches")

cli = CliRunner()
OPERATOR = "BMM_GPT2_QK"  # 686 schedules: three parts of 256 with PART_SECONDS 0.5
SIM = ["--runner", "simulated", "--operators", OPERATOR]


def _call(out: Path, pack: Path, *extra: str) -> dict:
    result = cli.invoke(campaign_app, ["--out-dir", str(out), "--pack", str(pack), *SIM, *extra])
    assert result.exit_code == 0, result.output
    return json.loads((out / layout.SUMMARY_FILE).read_text())


def _unpack(archive: Path, data: Path, profiles: Path, *extra: str) -> str:
    args = ["unpack", str(archive), "--data-dir", str(data), "--profile-dir", str(profiles)]
    result = cli.invoke(campaign_app, [*args, "--allow-simulated", *extra])
    assert result.exit_code == 0, result.output
    return result.stderr


def test_a_paused_campaign_goes_on_from_the_parts_it_committed(tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "PART_SECONDS", 0.5)
    # The first call's deadline comes after its first part: it estimates every later part
    # past it and pauses there, as a call out of minutes does.
    estimate = sweeps.PartEstimator.expected
    seen: list[float] = []

    def after_one_part(self, raw: float) -> float:
        seen.append(raw)
        return estimate(self, raw) if len(seen) == 1 else 1e9

    with monkeypatch.context() as patch:
        patch.setattr(sweeps.PartEstimator, "expected", after_one_part)
        first = _call(tmp_path / "out1", tmp_path / "c1.tar.gz")
    assert first["state"] == "paused"
    assert first["sweeps"]["partial"][OPERATOR]["parts"] == 1

    data, profiles = tmp_path / "data", tmp_path / "profiles"
    said = _unpack(tmp_path / "c1.tar.gz", data, profiles)
    folder = data / "h100"
    assert not (folder / f"{OPERATOR}.t4.json.gz").exists()  # a part is no dataset
    assert list(folder.glob("*.t4.json.gz")) == []

    second = _call(tmp_path / "out2", tmp_path / "c2.tar.gz", "--have", str(folder))
    assert second["state"] == "complete" and second["sweeps"]["done"] == [OPERATOR]
    (sweeping,) = [p for p in second["calls"][-1]["phases"] if p["phase"] == "sweeps"]
    assert sweeping["parts"] == 2  # parts 2 and 3; the committed first one is not measured
    merged = read_t4(tmp_path / "out2" / "sweeps" / f"{OPERATOR}.t4.json.gz")
    part = read_t4(tmp_path / "out1" / "sweeps" / f"{OPERATOR}.part000.t4.json.gz")
    assert len(merged) == 686
    assert [r.configuration for r in merged.records[: len(part)]] == [
        r.configuration for r in part.records
    ]
    assert merged.records[0].timestamp == part.records[0].timestamp  # the first call's
    # Where the part was committed: below the phase documents, said by unpack.
    parts = folder / layout.UNPACKED_PARTS
    assert [p.name for p in parts.iterdir()] == [f"{OPERATOR}.part000.t4.json.gz"]
    assert f"parts of unfinished operators kept: 1, in {parts} (a call with --have {folder}" in said

    _unpack(tmp_path / "c2.tar.gz", data, profiles, "--force")
    assert (folder / f"{OPERATOR}.t4.json.gz").is_file()
    assert not parts.exists()  # merged: no checkpoint is left
