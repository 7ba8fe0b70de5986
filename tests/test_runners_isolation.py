"""The isolated worker: a crash or a hang in the child never takes the parent down."""

from __future__ import annotations

import ctypes
import os
import time

import pytest

from pipetune.workers.runners.isolation import IsolatedWorker, WorkerStartError, describe_exit

# The functions the child runs (module level: the spawn child imports them by name).


def child_pid() -> int:
    return os.getpid()


def add(a: int, b: int) -> int:
    return a + b


def raise_value_error() -> None:
    raise ValueError("bad input")


def exit_hard() -> None:
    os._exit(3)


def segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def failing_initializer() -> None:
    raise RuntimeError("no device here")


def describe_child() -> dict:
    return {"pid": os.getpid()}


@pytest.fixture(scope="module")
def worker():
    with IsolatedWorker(initializer=describe_child, name="pipetune-test") as w:
        yield w


def test_calls_run_in_a_reused_child(worker):
    first = worker.call(child_pid, timeout_s=30)
    assert first.ok and first.value != os.getpid()
    assert worker.call(add, 2, b=3, timeout_s=30).value == 5
    assert worker.call(child_pid, timeout_s=30).value == first.value  # same child
    assert worker.info == {"pid": first.value}  # what the initializer returned


def test_a_stop_signal_to_the_process_group_does_not_kill_the_call_in_flight(worker):
    """A Ctrl-C (SIGINT) or a service manager's SIGTERM reaches the whole process group: it
    killed the child mid-trial, reported as a runtime error while the worker drained. The
    parent stops its child itself (a message, or SIGKILL past a timeout)."""
    import signal
    import threading

    pid = worker.call(child_pid, timeout_s=30).value
    timer = threading.Timer(0.3, lambda: [os.kill(pid, s) for s in (signal.SIGINT, signal.SIGTERM)])
    timer.start()
    outcome = worker.call(sleep_for, 1.0, timeout_s=30)
    timer.join()
    assert outcome.ok and outcome.value == 1.0
    assert worker.call(child_pid, timeout_s=30).value == pid


def test_a_stop_signal_while_the_first_child_of_a_process_starts_does_not_kill_it():
    """The same in a fresh process (the worker daemon's first measuring child): starting
    multiprocessing's resource tracker inside the guarded spawn unblocked the signals again,
    and the first child of a process died of a Ctrl-C as before."""
    import subprocess
    import sys

    script = (
        "import multiprocessing.context, os, signal, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_runners_isolation import add, describe_child\n"
        "from pipetune.workers.runners.isolation import IsolatedWorker\n"
        "original = multiprocessing.context.SpawnProcess.start\n"
        "def start(self):\n"
        "    original(self)\n"
        "    os.kill(self.pid, signal.SIGINT)\n"
        "multiprocessing.context.SpawnProcess.start = start\n"
        "with IsolatedWorker(initializer=describe_child, name='first') as w:\n"
        "    w.start()\n"
        "    print(w.call(add, 1, 2, timeout_s=30).value)\n"
    )
    tests = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run(
        [sys.executable, "-c", script, tests], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.strip() == "3", run.stderr[-2000:]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_while_the_child_starts_does_not_kill_it(monkeypatch, sig):
    """The child ignored stop signals only once its own code ran: spawn re-imports the main
    module first (the pipetune CLI, about a second), and a Ctrl-C or a SIGTERM to the process
    group then killed it, the trial it was to run reported as a runtime error. A signal sent
    the moment the child exists finds it blocked, then ignored."""
    import multiprocessing.context
    import signal

    original = multiprocessing.context.SpawnProcess.start

    def start_then_signal(self) -> None:  # type: ignore[no-untyped-def]
        original(self)
        os.kill(self.pid, getattr(signal, sig))  # (the child is still starting Python)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_then_signal)
    with IsolatedWorker(initializer=describe_child, name="pipetune-test-signal") as w:
        w.start()
        assert w.call(add, 1, 2, timeout_s=30).value == 3


def test_an_exception_is_reported_and_the_child_lives_on(worker):
    pid = worker.call(child_pid, timeout_s=30).value
    outcome = worker.call(raise_value_error, timeout_s=30)
    assert outcome.kind == "error"
    assert outcome.error == "ValueError: bad input"
    assert worker.call(child_pid, timeout_s=30).value == pid


@pytest.mark.parametrize(
    ("crash", "how"), [(exit_hard, "exit code 3"), (segfault, "killed by signal SIGSEGV")]
)
def test_a_crash_kills_only_the_child_and_the_next_call_gets_a_fresh_one(worker, crash, how):
    before_pid = worker.call(child_pid, timeout_s=30).value
    generation = worker.generation
    outcome = worker.call(crash, timeout_s=30)
    assert outcome.kind == "crashed"
    assert how in outcome.error
    after = worker.call(child_pid, timeout_s=30)
    assert after.ok and after.value not in (before_pid, os.getpid())
    assert worker.generation == generation + 1


def test_a_hang_past_the_timeout_is_killed_and_the_next_call_works(worker):
    before_pid = worker.call(child_pid, timeout_s=30).value
    started = time.perf_counter()
    outcome = worker.call(sleep_for, 60, timeout_s=0.5)
    assert outcome.kind == "timeout"
    assert "0.5 s" in outcome.error
    assert time.perf_counter() - started < 20  # killed, not waited for
    after = worker.call(sleep_for, 0.01, timeout_s=30)
    assert after.ok and after.value == 0.01
    assert worker.call(child_pid, timeout_s=30).value != before_pid


def test_a_failing_initializer_is_a_start_error():
    with IsolatedWorker(initializer=failing_initializer) as w:
        with pytest.raises(WorkerStartError, match="no device here"):
            w.start()
        assert not w.alive


def test_stop_then_call_starts_a_new_child_and_close_is_final():
    w = IsolatedWorker()
    pid = w.call(child_pid, timeout_s=30).value
    w.stop()
    assert not w.alive
    assert w.call(child_pid, timeout_s=30).value != pid
    w.close()
    with pytest.raises(WorkerStartError, match="closed"):
        w.call(child_pid, timeout_s=30)


def test_exit_descriptions():
    assert describe_exit(-9) == "killed by signal SIGKILL"
    assert describe_exit(2) == "exit code 2"


# A parent that starts a child, sends it a call that never returns, and says so.
_HANGING_PARENT = """
import os, sys, time
from pipetune.workers.runners.isolation import IsolatedWorker
w = IsolatedWorker()
print(w.call(os.getpid, timeout_s=60).value, flush=True)
print("calling", flush=True)
w.call(time.sleep, 600, timeout_s=600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_child_ends_with_its_parent_even_when_the_parent_is_killed_mid_call():
    """daemon=True stops the child only at an orderly exit: a worker killed with SIGKILL (the
    OOM killer, `kill -9`) during a hanging trial left its child (and the child's resource
    tracker) running, re-parented to init, for as long as the hang lasted: an hour for a
    simulated hang, for ever for a kernel that never finishes, holding its GPU."""
    import signal
    import subprocess
    import sys

    parent = subprocess.Popen(
        [sys.executable, "-c", _HANGING_PARENT], stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "calling"
        time.sleep(1.0)  # the call is sent: the child sleeps in it, not in recv()
        assert _running(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(child), "the child outlived its killed parent"
    finally:
        parent.kill()
        parent.wait()
        if _running(child):
            os.kill(child, signal.SIGKILL)
