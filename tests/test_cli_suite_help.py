"""The helps that name the benchmark suites name every one of them (model/operators.py
SUITES is the one list)."""

from __future__ import annotations

from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.operators import SUITES


def test_the_suite_helps_name_every_suite():
    """`model suite` and `campaign --operators` listed alcop, memops and hopper only; the
    llama, swiglu, bf16 and bias_gelu suites ran too, unnamed."""
    runner = CliRunner()
    for args in (["model", "suite", "--help"], ["campaign", "--help"]):
        out = runner.invoke(app, args, env={"COLUMNS": "400"}).stdout
        assert ", ".join(SUITES) in " ".join(out.split()), args
