"""benchmarks/bench_load.py's exit status: 2 for what it is given (an option the service
would refuse, a service that does not start, a PostgreSQL it cannot reach), 1 only for a
duplicate lease or a lost job."""

from __future__ import annotations

import sys

import pytest
from sqlalchemy.exc import OperationalError

from benchmarks import bench_load
from pipetune.clients.local_service import ServiceStartError

SMALL = ["--workers", "2", "--tasks", "1", "--budget", "8", "--replicas", "1", "--churn", "0"]


def _argv(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_load", "--json", *SMALL, *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ["--strategy", "nosuch"],
        ["--lease-ttl", "-1"],
        ["--lease-ttl", "0"],
        ["--propose-early", "7"],
        ["--propose-early", "1"],
        ["--propose-early", "-0.5"],
        ["--proposer-threads", "0"],
        ["--proposer-threads", "65"],
        ["--pg-url", "nonsense"],
        ["--pg-url", "sqlite:///bench.db"],
    ],
)
def test_an_option_the_service_would_refuse_is_refused_before_anything_starts(
    argv, monkeypatch, capsys
):
    """Each started the service (or tried to) and ended in a traceback, exit 1: an HTTP
    422, a ServiceStartError, sqlalchemy's ArgumentError."""

    def no_run(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(bench_load, "run_load", no_run)
    _argv(monkeypatch, *argv)
    with pytest.raises(SystemExit) as exc:
        bench_load.main()
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (ServiceStartError("`pipetune serve` exited with status 1"), "did not start"),
        (OperationalError("connect", {}, Exception("connection refused")), "connection refused"),
    ],
)
def test_a_service_or_database_that_fails_is_exit_2_with_the_reason(
    failure, said, monkeypatch, capsys
):
    def fails(*args, **kwargs):
        raise failure

    monkeypatch.setattr(bench_load, "run_load", fails)
    _argv(monkeypatch)
    assert bench_load.main() == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
