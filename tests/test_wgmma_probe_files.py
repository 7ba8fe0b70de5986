"""benchmarks/wgmma_probe.py's run on the CPU, its children stood in for: the probe file is
written whole or not at all (``timeout`` may kill the probe mid-write), and a child that
hangs is given up after a share of the probe's time left, so the shapes after it still run."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import wgmma_probe
from pipetune.workers.campaign import cuda_side

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = wgmma_probe.shape_ids(stream_k=True)[:3]


class Killed(BaseException):
    """What the test delivers mid-write in place of timeout's SIGTERM (not an Exception:
    nothing in the probe may catch it)."""


class _DiesMidWrite:
    """A file that takes half of what is written, then the process is killed."""

    def __init__(self, handle: Any):
        self.handle = handle

    def write(self, data: Any) -> int:
        self.handle.write(data[: len(data) // 2])
        self.handle.flush()
        raise Killed("SIGTERM while writing the probe file")

    def __enter__(self) -> _DiesMidWrite:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


@pytest.fixture
def probe(monkeypatch):
    """run() with the device and the children stood in for: each check passes, each timed
    child answers one operator; every child takes ``child_s`` seconds of a fake clock, the
    first one (if ``hang_first``) its whole timeout. Records each child's timeout."""
    now = [0.0]
    state = SimpleNamespace(children=[], child_s=9.0, hang_first=False, now=now)

    def in_child(config, workloads, timed, timeout_s=wgmma_probe.CHILD_TIMEOUT_S):
        state.children.append((config.id, timed, timeout_s, now[0]))
        if state.hang_first and len(state.children) == 1:
            now[0] += timeout_s
            return "error", f"no answer within {timeout_s:.0f} s"
        now[0] += state.child_s
        if timed:
            return "ok", [{"samples_ms": [0.1, 0.1]} for _ in workloads]
        return "ok", [{"correct": True, "error": 1e-4, "registers": 168}]

    monkeypatch.setattr(wgmma_probe, "_in_child", in_child)
    monkeypatch.setattr(wgmma_probe, "_vendor", lambda operators: {})
    monkeypatch.setattr(
        wgmma_probe, "time", SimpleNamespace(monotonic=lambda: now[0], time=time.time)
    )
    monkeypatch.setattr(cuda_side, "init", lambda device: None)
    monkeypatch.setattr(cuda_side, "describe", lambda: {"name": "NVIDIA H100 80GB HBM3"})
    return state


def test_a_kill_while_saving_leaves_the_previous_probe_file_whole(tmp_path, probe, monkeypatch):
    # The file was truncated, then written: a kill in between brought back half a JSON
    # document, which `best` skipped (and with it the profiles) and `report` could not read.
    out = tmp_path / "wgmma-probe.json"
    real_open = io.open
    saves = []

    def open_then_die(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "w" not in mode:
            return handle
        saves.append(file)
        return _DiesMidWrite(handle) if len(saves) == 3 else handle

    monkeypatch.setattr(io, "open", open_then_die)
    with pytest.raises(Killed):
        wgmma_probe.run(out, ["MM_Square_4k"], CONFIGS)
    monkeypatch.setattr(io, "open", real_open)
    document = json.loads(out.read_text())  # the second save's, whole
    assert list(document["checks"]) == CONFIGS[:1] and document["runs"] == {}
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left
    wgmma_probe.run(out, ["MM_Square_4k"], CONFIGS)  # and the next save replaces it
    assert list(json.loads(out.read_text())["runs"]) == CONFIGS


@pytest.mark.parametrize(
    ("left", "timeout"),
    [(None, wgmma_probe.CHILD_TIMEOUT_S), (150.0, 37.5), (1000.0, 60.0), (40.0, 30.0), (-3, 30.0)],
)
def test_a_child_gets_a_share_of_the_time_left_within_a_floor_and_a_cap(left, timeout):
    assert wgmma_probe.child_timeout(left) == timeout


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_hung_child_costs_each_device_call_at_most_a_share_of_its_probe(gpu):
    # The child's timeout was 240 s (then a 10 s join): more than the H100 call's whole
    # PROBE_SECONDS of 150, so one hung shape ended the probe for every shape after it.
    from pipetune.workers.campaign.kit import PROBE_CALLS

    probe_s = int(re.search(r"PROBE_SECONDS=(\d+)", PROBE_CALLS[gpu][2]).group(1))
    assert wgmma_probe.child_timeout(probe_s) <= probe_s / 2


def test_a_hung_shape_leaves_the_rest_of_the_budget_to_the_shapes_after_it(tmp_path, probe):
    probe.hang_first = True
    document = wgmma_probe.run(tmp_path / "p.json", ["MM_Square_4k"], CONFIGS, seconds=150)
    timeouts = [t for _, _, t, _ in probe.children]
    assert timeouts[0] == 37.5  # a quarter of the 150 s
    assert all(wgmma_probe.CHILD_FLOOR_S <= t <= 37.5 for t in timeouts)
    assert "no answer within 38 s" in document["checks"][CONFIGS[0]]["fault"]
    # Every later shape was checked and timed inside the call's 150 s.
    assert list(document["runs"]) == CONFIGS[1:]
    assert all(started < 150 for *_, started in probe.children)
    assert len(probe.children) == 1 + 2 * (len(CONFIGS) - 1)


def test_without_a_budget_a_child_gets_the_cap(tmp_path, probe):
    wgmma_probe.run(tmp_path / "p.json", ["MM_Square_4k"], CONFIGS)
    assert {t for _, _, t, _ in probe.children} == {wgmma_probe.CHILD_TIMEOUT_S}


class _NeverAnswers:
    """multiprocessing's spawn context with a child that hangs: records joins and kills."""

    def __init__(self):
        self.calls: list[str] = []
        outer = self

        class Process:
            exitcode = None

            def __init__(self, target, args):
                self.alive = True

            def start(self):
                outer.calls.append("start")

            def is_alive(self):
                return self.alive

            def join(self, timeout=None):
                outer.calls.append(f"join({timeout})")

            def kill(self):
                outer.calls.append("kill")
                self.alive = False

        class Queue:
            def get(self, timeout=None):
                from queue import Empty

                raise Empty

        self.Process, self.Queue = Process, Queue

    def get_context(self, method: str) -> _NeverAnswers:
        return self


def test_a_child_past_its_timeout_is_killed_at_once(monkeypatch):
    # It was joined for 10 s first: 10 s more of the call's time for a child already given up.
    spawn = _NeverAnswers()
    monkeypatch.setattr(wgmma_probe, "multiprocessing", spawn)
    (config,) = wgmma_probe._configs(CONFIGS[:1])
    started = time.monotonic()
    status, why = wgmma_probe._in_child(config, [wgmma_probe.CHECK_SHAPE], False, 0.05)
    assert time.monotonic() - started < 5
    assert (status, why) == ("error", "no answer within 0 s")
    assert spawn.calls == ["start", "kill", "join(None)"]


def test_the_device_script_gives_the_probe_its_budget():
    script = (ROOT / "benchmarks" / "wgmma_probe.sh").read_text()
    (line,) = [x for x in script.splitlines() if "benchmarks.wgmma_probe run" in x]
    limit = re.search(r"timeout \$\{PROBE_SECONDS:-(\d+)\} python3", line).group(1)
    assert f"--seconds ${{PROBE_SECONDS:-{limit}}}" in line
