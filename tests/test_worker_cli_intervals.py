"""`pipetune worker --heartbeat` and `--lease-wait` within sensible bounds, refused with exit 2
naming the option and why: any positive value was taken (--heartbeat 1e-9 woke the heartbeat
thread flat out, --lease-wait 1e-9 sent lease request after lease request). The bounds are
the operator's (the CLI's): WorkerConfig, the daemon's own API, still takes the hundredths of
a second the tests run it at."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.wire import MAX_LEASE_WAIT_S
from pipetune.workers.daemon import WorkerConfig
from pipetune.workers.daemon.config import (
    MAX_HEARTBEAT_S,
    MIN_HEARTBEAT_S,
    MIN_LEASE_WAIT_S,
    check_operator_intervals,
)

# An unreachable service, tried once: a value let through fails there instead, exit 1.
WORKER = ["worker", "--server", "http://127.0.0.1:9", "--token", "x", "--runner", "simulated"]
WORKER += ["--gpu", "h100", "--register-timeout", "0"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--heartbeat", "1e-9", "--heartbeat: must be within 0.5..60 s (the heartbeat thread "
         "wakes that often, and a wake-up may send one), got 1e-09"),
        ("--heartbeat", "0.1", "--heartbeat: must be within 0.5..60 s"),
        ("--heartbeat", "0", "--heartbeat: must be within 0.5..60 s"),
        ("--heartbeat", "600", "--heartbeat: must be within 0.5..60 s (half the service's "
         "default lease TTL of 120 s: leases are extended at wake-ups), got 600"),
        ("--lease-wait", "1e-9", "--lease-wait: must be within 1..30 s (an idle worker sends a "
         "lease request that often), got 1e-09"),
        ("--lease-wait", "0", "--lease-wait: must be within 1..30 s"),
        ("--lease-wait", "31", "--lease-wait: must be within 1..30 s (the longest the service "
         "holds a lease request), got 31"),
        ("--lease-wait", "nan", "--lease-wait: must be within 1..30 s (a finite number of "
         "seconds), got nan"),
    ],
)  # fmt: skip
def test_an_interval_out_of_bounds_exits_2_naming_the_option(option, value, message):
    result = CliRunner().invoke(app, [*WORKER, option, value])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line


def test_the_bounds_themselves_are_taken_and_the_daemon_s_api_takes_less():
    check_operator_intervals(MIN_HEARTBEAT_S, MIN_LEASE_WAIT_S)
    check_operator_intervals(MAX_HEARTBEAT_S, MAX_LEASE_WAIT_S)
    # (The tests' values: the bound is the CLI's, not the configuration's.)
    config = WorkerConfig(server="http://127.0.0.1:9", token="t", heartbeat_s=0.01, lease_wait_s=0)
    assert (config.heartbeat_s, config.lease_wait_s) == (0.01, 0)
