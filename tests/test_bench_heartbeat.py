"""The heartbeat benchmark: it measures what it says (every heartbeat answered, both CPU
figures read; no timing is asserted), and refuses a nonsensical count with exit 2."""

from __future__ import annotations

import pytest
from service_support import require_pg

from benchmarks.bench_heartbeat import main, measure


def test_every_heartbeat_is_sent_and_both_cpus_are_read():
    admin_url = require_pg()
    # Enough heartbeats to take tens of milliseconds (the CPU is read in 10 ms ticks).
    (run,) = measure(workers=10, rounds=6, repeats=1, admin_url=admin_url)
    assert run["heartbeats"] == 60
    assert run["service_cpu_ms"] > 0 and run["postgres_cpu_ms"] >= 0 and run["seconds"] > 0


@pytest.mark.parametrize("option", ["--workers", "--rounds", "--repeats"])
def test_a_count_below_one_exits_2_naming_the_option(option, capsys):
    with pytest.raises(SystemExit) as exited:
        main([option, "0"])
    assert exited.value.code == 2
    assert f"{option} must be at least 1" in capsys.readouterr().err
