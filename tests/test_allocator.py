"""The allocator keeps a proposal round's large freed blocks (tuner/allocator.py): counted in
page faults, which are what the setting saves, not in time."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest
from service_support import client_for

import pipetune.clients.cli.main as cli_main
import pipetune.service.app as service_app

pytest_plugins = ["service_fixtures"]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Two 4 MiB temporaries alive at once, as a round's cross covariance and its exponential
# are; minor page faults per repetition before and after the setting, in a fresh process
# (the setting is process-wide and cannot be undone).
FAULTS_SCRIPT = textwrap.dedent(
    """
    import json, resource
    import numpy as np
    from pipetune.tuner.allocator import keep_freed_blocks

    source = np.ones((512, 1024))

    def faults_per_round(rounds=40):
        for _ in range(3):
            a = source * 2.0; b = source * 3.0; del a, b
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(rounds):
            a = source * 2.0; b = source * 3.0; del a, b
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds

    default = faults_per_round()
    applied = keep_freed_blocks()
    print(json.dumps({"default": default, "applied": applied, "kept": faults_per_round()}))
    """
)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's; elsewhere the setting does nothing")
def test_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT], capture_output=True, text=True, check=True
    )
    figures = json.loads(out.stdout)
    assert figures["applied"] is True
    pages = 2 * 512 * 1024 * 8 / 4096  # of the two temporaries
    # By default each repetition faults at least one of the temporaries in afresh (glibc
    # trims its heap once both are free) ...
    assert figures["default"] > 0.4 * pages, figures
    # ... and with the setting it reuses the blocks it freed.
    assert figures["kept"] < 0.02 * pages, figures


def test_the_served_app_and_the_command_set_it(monkeypatch, tmp_path, sqlite_template) -> None:
    calls: list[str] = []
    monkeypatch.setattr(service_app, "keep_freed_blocks", lambda: calls.append("service"))
    monkeypatch.setattr(cli_main, "keep_freed_blocks", lambda: calls.append("command"))
    shutil.copy(sqlite_template, tmp_path / "a.db")
    with client_for(f"sqlite:///{tmp_path / 'a.db'}") as client:
        assert client.get("/healthz").status_code == 200
    assert calls == ["service"]

    from typer.testing import CliRunner

    result = CliRunner().invoke(cli_main.app, ["model", "--help"])
    assert result.exit_code == 0, result.output
    assert calls == ["service", "command"]
