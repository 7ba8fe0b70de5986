"""`pipetune sweep OPTIONS OPERATOR ...`: the options given before the operator name are the
operator command's too (they were silently dropped: `sweep --gpu a100 gemm ...` swept h100),
and the same option after the name wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.sweep_cmds import sweep_app
from pipetune.workers.datasets import load_dataset

cli = CliRunner()
GEMM = ["gemm", "--m", "64", "--n", "64", "--k", "64"]


@pytest.fixture(autouse=True)
def instant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")


def _sweep(before: list[str], after: list[str], out: Path) -> dict:
    result = cli.invoke(sweep_app, [*before, *GEMM, *after, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return load_dataset(out).metadata["pipetune"]


def test_options_before_the_operator_name_are_applied(tmp_path: Path) -> None:
    before = ["--runner", "simulated", "--gpu", "a100", "--limit", "3", "--seed", "7"]
    before += ["--repeats", "2", "--warmup", "0"]
    meta = _sweep(before, [], tmp_path / "g.t4.json.gz")
    assert (meta["runner"], meta["gpu"]) == ("simulated", "a100")
    settings = meta["settings"]
    assert (settings["seed"], settings["repeats"], settings["warmup"]) == (7, 2, 0)
    assert len(load_dataset(tmp_path / "g.t4.json.gz")) == 3


def test_json_before_the_operator_name_prints_json(tmp_path: Path) -> None:
    out = tmp_path / "g.t4.json.gz"
    args = ["--json", *GEMM, "--runner", "simulated", "--limit", "2", "--out", str(out)]
    result = cli.invoke(sweep_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["datasets"][0]["schedules"] == 2


def test_profile_before_the_operator_name_is_read(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-profile.json"
    args = ["--profile", str(missing), *GEMM, "--runner", "simulated"]
    result = cli.invoke(sweep_app, [*args, "--out", str(tmp_path / "g.t4.json.gz")])
    assert result.exit_code == 2, result.output
    assert str(missing) in result.stderr and "Traceback" not in result.output


def test_the_option_after_the_operator_name_wins(tmp_path: Path) -> None:
    before = ["--gpu", "a100", "--limit", "2"]
    meta = _sweep(before, ["--runner", "simulated", "--gpu", "h200"], tmp_path / "g.t4.json.gz")
    assert meta["gpu"] == "h200"
    assert len(load_dataset(tmp_path / "g.t4.json.gz")) == 2  # --limit still came through


@pytest.mark.parametrize(
    ("scale", "words"),
    [
        ("-1", "must be a non-negative number"),
        # Accepted, then every trial's sleep overflowed the platform's clock (exit 1).
        ("1e12", "must be at most 1000"),
    ],
)
def test_a_malformed_simulated_time_scale_exits_2(tmp_path: Path, monkeypatch, scale, words):
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", scale)
    args = [*GEMM, "--runner", "simulated", "--limit", "2", "--out", str(tmp_path / "g.t4.json.gz")]
    result = cli.invoke(sweep_app, args)
    assert result.exit_code == 2, result.output
    assert f"PIPETUNE_SIMULATED_TIME_SCALE {words}" in result.stderr
    assert not (tmp_path / "g.t4.json.gz").exists()


def test_only_the_options_given_before_the_operator_name_are_passed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group hands on what the user gave, not its own defaults (it handed on every
    shared option: its "given?" test compared with another copy of click's enum)."""
    from pipetune.clients.cli import sweep_cmds

    handed: list[dict | None] = []
    pass_on = sweep_cmds._pass_on_shared_options

    def spy(ctx) -> None:
        pass_on(ctx)
        handed.append(ctx.default_map)

    monkeypatch.setattr(sweep_cmds, "_pass_on_shared_options", spy)
    _sweep(["--gpu", "a100"], ["--runner", "simulated", "--limit", "1"], tmp_path / "a.t4.json.gz")
    _sweep([], ["--runner", "simulated", "--limit", "1"], tmp_path / "b.t4.json.gz")
    assert handed == [{"gemm": {"gpu": "a100"}}, None]
