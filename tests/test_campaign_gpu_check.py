"""`pipetune campaign` refuses, in one line and with exit 2 before anything is made or
measured: operators the named GPU cannot run (the Hopper suite on an A100; it used to probe,
then stop on "0 of 0 schedules failed"), and a --have or ARCHIVE that is not a tar archive
(tarfile's error is one line per compression it tried)."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.campaign_cmds import campaign_app, unrunnable_reason
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import HOPPER
from pipetune.workers.campaign.operators import resolve_operators

cli = CliRunner()
HOPPER_REASON = "needs a Hopper GPU"


@pytest.fixture(autouse=True)
def instant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")


def _one_line(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_unrunnable_reason_names_the_operators_and_the_family_s_reason() -> None:
    hopper = resolve_operators("hopper")
    reason = unrunnable_reason(hopper, get_gpu("a100", calibrated=False))
    assert reason is not None and HOPPER_REASON in reason
    assert reason.startswith(f"{next(iter(hopper))}, ") and f"and {len(HOPPER) - 3} more" in reason
    assert unrunnable_reason(hopper, get_gpu("h100", calibrated=False)) is None
    assert unrunnable_reason(resolve_operators("alcop"), get_gpu("a100")) is None


def test_the_hopper_suite_on_an_a100_is_refused_before_the_probe(tmp_path: Path) -> None:
    out = tmp_path / "c7"
    args = ["--runner", "simulated", "--gpu", "a100", "--operators", "alcop,hopper"]
    line = _one_line(cli.invoke(campaign_app, [*args, "--out-dir", str(out)]))
    assert line.startswith("error: --gpu a100: cannot run WG_") and HOPPER_REASON in line
    assert not out.exists()


def test_the_plan_of_the_hopper_suite_on_an_a100_is_refused() -> None:
    line = _one_line(cli.invoke(campaign_app, ["plan", "--operators", "hopper", "--gpu", "a100"]))
    assert line.startswith("error: --gpu a100: cannot run WG_") and HOPPER_REASON in line


def test_the_plan_of_the_hopper_suite_on_an_h100_still_fits() -> None:
    result = cli.invoke(campaign_app, ["plan", "--operators", "hopper", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("fits")


def _junk(path: Path) -> Path:
    path.write_bytes(b"this is not an archive\n" * 20)
    return path


def _truncated(path: Path) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = random.Random(0).randbytes(50_000)  # incompressible: the archive stays big
        info = tarfile.TarInfo("probe.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return path


def test_have_junk_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    junk = _junk(tmp_path / "junk.tar.gz")
    out = tmp_path / "c5"
    args = ["--runner", "simulated", "--out-dir", str(out), "--have", str(junk)]
    line = _one_line(cli.invoke(campaign_app, args))
    assert line == f"error: --have: {junk} is not a tar archive (not gzip, bzip2, xz or plain tar)"
    assert not out.exists()


def test_have_a_truncated_archive_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    archive = _truncated(tmp_path / "cut.tar.gz")
    out = tmp_path / "c6"
    args = ["--runner", "simulated", "--out-dir", str(out), "--have", str(archive)]
    line = _one_line(cli.invoke(campaign_app, args))
    assert line.startswith(f"error: --have: {archive} is not a readable tar archive (")
    assert not out.exists()


@pytest.mark.parametrize("make", [_junk, _truncated])
def test_unpack_an_unreadable_archive_is_one_line(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    archive = make(tmp_path / "a.tar.gz")
    data = tmp_path / "data"
    line = _one_line(cli.invoke(campaign_app, ["unpack", str(archive), "--data-dir", str(data)]))
    assert line.startswith(f"error: ARCHIVE: {archive} is not a")
    assert not data.exists()


def test_unpack_a_missing_archive_or_a_directory(tmp_path: Path) -> None:
    line = _one_line(cli.invoke(campaign_app, ["unpack", str(tmp_path / "no.tar.gz")]))
    assert line == f"error: ARCHIVE: {tmp_path / 'no.tar.gz'}: no such file"
    line = _one_line(cli.invoke(campaign_app, ["unpack", str(tmp_path)]))
    assert line == f"error: ARCHIVE: {tmp_path} is a directory, not an archive"
